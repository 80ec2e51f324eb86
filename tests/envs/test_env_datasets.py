"""`vlrl dataset` and the parquet rows."""

from __future__ import annotations

import hashlib

import pandas as pd
import pytest

from vlrl.cli import main as vlrl_main
from vlrl.data.rows import EnvRow, read_rows, write_rows
from vlrl.data.tickets import TRAIN_SEED_LOW, build_splits
from vlrl.envs import env_from_row, is_placeholder
from vlrl.messages import load_image


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_rows_round_trip_unchanged(tmp_path):
    rows = [
        EnvRow([{"role": "user", "content": "placeholder"}], "maze2d/easy", {}, 0),
        EnvRow(
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "héllo"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                    ],
                }
            ],
            "geometry",
            {"ground_truth": "2\\sqrt{13}", "nested": {"a": [1, 2.5, None], "b": {}}},
            None,
        ),
        EnvRow([{"role": "user", "content": "x"}], "color_square", {"palette": {"red": [255, 0, 0]}}, 2**31 - 1),
    ]
    path = write_rows(rows, tmp_path / "rows.parquet")
    assert read_rows(path) == rows
    frame = pd.read_parquet(path)
    assert list(frame.columns) == ["prompt", "env_class", "extras", "seed"]
    assert str(frame["seed"].dtype) == "Int64"


@pytest.mark.parametrize("env_class", ["maze2d/easy", "color_square"])
def test_cli_writes_train_and_eval_and_eval_is_identical_across_runs(tmp_path, env_class, capsys):
    args = ["dataset", "--env", env_class, "--train", "6", "--eval", "4"]
    assert vlrl_main(args + ["--out", str(tmp_path / "a")]) == 0
    assert vlrl_main(args + ["--out", str(tmp_path / "b")]) == 0
    assert "wrote 6 rows" in capsys.readouterr().out
    eval_a, eval_b = read_rows(tmp_path / "a/eval.parquet"), read_rows(tmp_path / "b/eval.parquet")
    assert eval_a == eval_b and [r.seed for r in eval_a] == [0, 1, 2, 3]
    assert _sha(tmp_path / "a/eval.parquet") == _sha(tmp_path / "b/eval.parquet")  # byte for byte
    train_a, train_b = read_rows(tmp_path / "a/train.parquet"), read_rows(tmp_path / "b/train.parquet")
    assert len(train_a) == 6 and all(r.seed >= TRAIN_SEED_LOW for r in train_a)
    assert [r.seed for r in train_a] != [r.seed for r in train_b]  # randomly seeded per run
    for row in eval_a + train_a:
        assert row.env_class == env_class and is_placeholder(row.prompt)
        env = env_from_row(row.as_dict())
        messages, info = env.init(row.prompt)
        assert info["seed"] == row.seed


def test_train_seed_makes_the_train_split_reproducible(tmp_path):
    for out in ("a", "b"):
        assert (
            vlrl_main(
                [
                    "dataset",
                    "--env",
                    "maze2d/hard",
                    "--train",
                    "3",
                    "--eval",
                    "0",
                    "--train-seed",
                    "7",
                    "--out",
                    str(tmp_path / out),
                ]
            )
            == 0
        )
    assert read_rows(tmp_path / "a/train.parquet") == read_rows(tmp_path / "b/train.parquet")


def test_image_prompt_dataset_carries_images_and_grades(tmp_path):
    assert vlrl_main(["dataset", "--env", "geometry", "--train", "2", "--eval", "3", "--out", str(tmp_path)]) == 0
    rows = read_rows(tmp_path / "eval.parquet")
    for row in rows:
        assert not is_placeholder(row.prompt) and "ground_truth" in row.extras
        assert load_image(row.prompt[0]["content"][0]).size == (320, 240)
        env = env_from_row({**row.as_dict(), "seed": None})  # the row alone must be enough to grade
        messages, _ = env.init(row.prompt)
        assert messages == row.prompt
        result = env.step(f"Answer: \\boxed{{{row.extras['ground_truth']}}}")
        assert result.done and result.reward == 1.0


def test_maze_rows_with_images_equal_what_the_env_renders():
    splits = build_splits("maze2d/easy", 0, 2, with_prompts=True)
    for row in splits["eval"]:
        env = env_from_row(row.as_dict())
        assert env.init(None)[0] == row.prompt


def test_cli_refuses_bad_input(tmp_path, capsys):
    assert vlrl_main(["dataset", "--env", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown env_class" in capsys.readouterr().err
    assert vlrl_main(["dataset", "--env", "color_square", "--extras", "[1]", "--out", str(tmp_path)]) == 2
