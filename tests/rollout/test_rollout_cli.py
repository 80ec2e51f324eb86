"""`vlrl rollout` writes inspectable JSONL trajectories."""

from __future__ import annotations

import json

from vlrl.cli import main


def test_rollout_command_writes_jsonl(tmp_path, vlrl_model_dir, capsys):
    model = vlrl_model_dir("qwen2_vl")
    out = tmp_path / "r.jsonl"
    assert (
        main(
            [
                "rollout",
                "--model",
                str(model),
                "--env",
                "maze2d/easy",
                "--rows",
                "2",
                "--repeats",
                "2",
                "--max-turns",
                "2",
                "--max-tokens",
                "6",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["uid"] for r in records] == ["0-0", "0-1", "1-0", "1-1"]
    for r in records:
        ids = r["prompt_ids"] + r["response_ids"]
        assert len(r["tokens"]) == len(ids)
        assert len(r["loss_mask"]) == len(r["logprobs"]) == len(r["rewards"]) == len(r["response_ids"])
        assert r["stop_reason"] == "max_turns" and len(r["turns"]) == 2
        assert r["pixel_values"]["shape"][0] == sum(t * h * w for t, h, w in r["image_grid_thw"])
        assert len(r["image_grid_thw"]) == len(r["placeholders"]) == 2
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["trajectories"] == 4 and summary["stop_reasons"] == {"max_turns": 4}
