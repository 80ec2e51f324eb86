"""`vlrl report`: one self-contained HTML file per training run directory, robust to missing files."""

from __future__ import annotations

import base64
import html
import io
import json
import re

import pytest
from PIL import Image
from report_runs import ACTIONS, FRAME_COLORS, make_run, trajectory, write_jsonl

from vlrl.cli import main
from vlrl.report.plots import bound_values
from vlrl.report.strips import strip_cells
from vlrl.report.training import write_report

FIGURES = (
    5  # reward, loss, the learning section's entropy (the synthetic run logs entropy), drift curve, drift histogram
)


def sources(text: str) -> list[str]:
    return re.findall(r"""(?:src|href)\s*=\s*['"]([^'"]*)['"]""", text)


def pngs(text: str) -> list[Image.Image]:
    out = []
    for data in re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", text):
        img = Image.open(io.BytesIO(base64.b64decode(data)))
        img.load()
        out.append(img)
    return out


def test_full_run_is_self_contained_with_every_png_inlined(tmp_path):
    run = make_run(tmp_path / "run", sample_steps=(0, 8), per_step=2)
    path = write_report(run)
    assert path == run / "report.html"
    text = path.read_text()
    srcs = sources(text)
    assert srcs and all(s.startswith("data:image/png;base64,") for s in srcs), [s[:40] for s in srcs]
    assert not re.search(r"(https?|file)://", text)
    assert "<script" not in text and "<link" not in text
    frames = 2 * 2 * 3  # 2 steps × 2 trajectories × (2 turns + final frame)
    images = pngs(text)
    assert len(images) == FIGURES + frames
    assert all(img.width <= 128 and img.height <= 128 for img in images[FIGURES:])
    assert path.stat().st_size < 1_000_000


def test_header_shows_summary_curves_config_and_breaches(tmp_path):
    text = write_report(make_run(tmp_path / "run")).read_text()
    assert "class='pass'>PASS" in text
    assert "0.25 → <b>0.95</b>" in text
    assert "42 s" in text
    assert "bound breached at step(s) [3]" in text
    assert "<details><summary>config.toml</summary>" in text and html.escape('arch = "qwen2_5_vl"') in text
    assert "max |Δ|" in text  # per-turn table of the last agreement row


def test_empty_reply_and_run_name(tmp_path):
    run = make_run(tmp_path / "run", sample_steps=())
    record = trajectory("quiet")
    record["messages"][1]["content"] = ""
    write_jsonl(run / "samples" / "step_000000.jsonl", [record])
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "name": "color_square"}))
    text = write_report(run).read_text()
    assert "<title>vlrl run color_square (run)</title>" in text
    assert text.count("(empty reply)") == 1 and html.escape(ACTIONS[1]) in text


def test_failed_summary_shows_fail(tmp_path):
    run = make_run(tmp_path / "run")
    (run / "summary.json").write_text(json.dumps({"eval_before": 0.2, "eval_after": 0.3, "passed": False}))
    assert "class='fail'>FAIL" in write_report(run).read_text()


def test_an_sft_only_run_shows_its_one_eval_and_no_agreement_warning(tmp_path):
    """A maze curriculum level with no RL steps (lease_h3's hard): its summary has no eval before training and no
    agreement.jsonl; the report read "0.805 → 0.805" and warned that agreement.jsonl was missing."""
    run = make_run(tmp_path / "run", steps=0)
    (run / "agreement.jsonl").unlink()
    (run / "summary.json").write_text(json.dumps({"eval_before": None, "eval_after": 0.805, "steps": 0}))
    text = write_report(run).read_text()
    assert "<b>0.805</b> (not evaluated before training)" in text and "→ <b>0.805" not in text
    assert "SFT only: no RL step" in text and "no agreement.jsonl" not in text
    # with RL steps but no agreement file, the warning stays
    rl = make_run(tmp_path / "rl")
    (rl / "agreement.jsonl").unlink()
    assert "no agreement.jsonl" in write_report(rl).read_text()


def test_strip_puts_each_frame_above_the_action_taken_on_it():
    cells = strip_cells(trajectory("t", n_turns=3, rewards=[0.0, 0.5, 1.0]))
    assert [c.label for c in cells] == ["turn 0", "turn 1", "turn 2", "final"]
    assert [c.action for c in cells] == ACTIONS + [None]
    assert [c.reward for c in cells] == [0.0, 0.5, 1.0, None]
    for k, cell in enumerate(cells):
        (uri,) = cell.frames
        img = Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))).convert("RGB")
        assert img.getpixel((img.width // 2, img.height // 2)) == FRAME_COLORS[k]


def test_report_strips_show_actions_rewards_return_and_stop_reason(tmp_path):
    text = write_report(make_run(tmp_path / "run", sample_steps=(4,), per_step=1)).read_text()
    section = text[text.index("<h2>Rollouts") :]
    for action in ACTIONS[:2]:
        assert html.escape(action) in section
    assert "<b>4-0</b> · return <b>1</b> · stop <code>done</code> · 2 turn(s)" in section
    assert section.count("reward <b>") == 2


def test_thumbnails_shrink_large_frames(tmp_path):
    run = make_run(tmp_path / "run", sample_steps=())
    write_jsonl(run / "samples" / "step_000001.jsonl", [trajectory("big", size=512)])
    images = pngs(write_report(run).read_text())[FIGURES:]
    assert len(images) == 3 and all(max(img.size) == 128 for img in images)


def test_samples_are_capped(tmp_path):
    run = make_run(tmp_path / "run", sample_steps=(0, 2, 4, 6, 8), per_step=6)
    text = write_report(run).read_text()
    shown = re.findall(r"<h3>step (\d+)", text)
    assert shown == ["0", "6", "8"]
    assert text.count("(showing 4 of 6)") == 3
    assert "2 other sample step(s) not shown" in text


def test_empty_run_dir_gives_a_report_that_says_so(tmp_path):
    text = write_report(tmp_path, tmp_path / "out" / "r.html").read_text()
    assert "nothing to report" in text and "no summary.json" in text
    assert "no metrics yet" in text and "no agreement.jsonl" in text and "no samples/" in text
    assert not pngs(text)


def test_missing_run_dir_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        write_report(tmp_path / "nope")


def test_partial_run_metrics_only_with_a_torn_last_line(tmp_path):
    write_jsonl(
        tmp_path / "metrics.jsonl", [{"step": s, "phase": "rl", "time": s, "reward_mean": 0.1 * s} for s in range(3)]
    )
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "phase": "r')  # the trainer is mid-write
    text = write_report(tmp_path).read_text()
    assert len(pngs(text)) == 1  # the reward curve; no loss, drift or frames
    assert "metrics.jsonl: skipped 1 unreadable line(s)" in text
    assert "last rl step: step 2" in text


def test_undecodable_frame_becomes_a_placeholder(tmp_path):
    record = trajectory("broken")
    record["messages"][0]["content"][0]["image_url"]["url"] = "data:image/png;base64,bm90IGEgcG5n"
    write_jsonl(tmp_path / "samples" / "step_000000.jsonl", [record])
    text = write_report(tmp_path).read_text()
    assert len(pngs(text)) == 3 and html.escape(ACTIONS[0]) in text


def test_external_image_urls_are_never_embedded(tmp_path):
    record = trajectory("remote")
    record["messages"][0]["content"][0]["image_url"]["url"] = "https://example.com/frame.png"
    write_jsonl(tmp_path / "samples" / "step_000000.jsonl", [record])
    text = write_report(tmp_path).read_text()
    assert "example.com" not in text and len(pngs(text)) == 2


@pytest.mark.parametrize(
    "row, expected",
    [
        ({"bounds": {"max_abs": 1e-4, "mean_abs": 2e-5, "k3": 1e-7}}, {"max_abs": 1e-4, "mean_abs": 2e-5}),
        ({"bound": 0.5}, {"max_abs": 0.5}),
        ({"max_abs_bound": 0.5, "mean_abs_bound": 0.01}, {"max_abs": 0.5, "mean_abs": 0.01}),
        ({}, {}),
    ],
)
def test_bound_values(row, expected):
    assert bound_values(row) == expected


def test_histogram_edges_as_values_or_exponents(tmp_path):
    run = make_run(tmp_path / "a", sample_steps=(), bounds=False)
    rows = [json.loads(line) for line in (run / "agreement.jsonl").read_text().splitlines()]
    rows[-1]["hist"]["edges"] = [10.0**e for e in rows[-1]["hist"]["edges"]]
    write_jsonl(run / "agreement.jsonl", rows)
    assert len(pngs(write_report(run).read_text())) == FIGURES
    rows[-1]["hist"]["counts"] = [1, 2]  # does not match the edges: the histogram is left out
    write_jsonl(run / "agreement.jsonl", rows)
    assert len(pngs(write_report(run).read_text())) == FIGURES - 1


def test_cli_writes_the_report(tmp_path, capsys):
    run = make_run(tmp_path / "run")
    out = tmp_path / "reports" / "run.html"
    assert main(["report", str(run), "--out", str(out)]) == 0
    assert out.is_file() and f"wrote {out}" in capsys.readouterr().out
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_where_the_disagreement_sits_and_image_probes_are_shown(tmp_path):
    run = make_run(tmp_path / "run", sample_steps=())
    rows = [json.loads(line) for line in (run / "agreement.jsonl").read_text().splitlines()]
    for k, row in enumerate(rows):
        row["by_depth"] = [
            {"bin": "0-512", "n_tokens": 700, "max_abs": 2e-6, "mean_abs": 3e-7},
            {"bin": "1k-2k", "n_tokens": 2200, "max_abs": 2.2 if k == 0 else 3e-6, "mean_abs": 4e-3},
        ]
        row["by_turn_position"] = [
            {"bin": "first", "n_tokens": 640, "max_abs": 2.2 if k == 0 else 3e-6, "mean_abs": 5e-3},
            {"bin": "rest", "n_tokens": 5800, "max_abs": 1e-3, "mean_abs": 6e-7},
        ]
    write_jsonl(run / "agreement.jsonl", rows)
    write_jsonl(
        run / "image_sensitivity.jsonl",
        [
            {
                "step": 0,
                "label": "after_sft",
                "turns": 80,
                "sensitive_fraction": 0.05,
                "passed": False,
                "blank_mean_abs_median": 1.3e-4,
            }
        ],
    )
    text = write_report(run).read_text()
    where = text[text.index("where it sits") :]
    assert "1k-2k" in where and "first" in where and f"max |Δ| over {len(rows)} step(s)" in where
    assert "<td>2.2</td>" in where  # the worst over all steps, though the last step was clean
    images = text[text.index("Image sensitivity") :]
    assert "after_sft" in images and "0.05" in images and "FAIL" in images
