"""What a person sees while ``vlrl train`` runs: one line per step with phase, step/total, reward,
agreement, tokens/s and ETA — in a log file or CI (no terminal) as on a terminal."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

from vlrl.train.progress import Progress, format_eta, format_eval_line, format_step_line

REPO = Path(__file__).resolve().parents[2]


def test_the_step_line_names_phase_step_reward_agreement_rate_and_eta():
    line = format_step_line(
        "rl",
        3,
        40,
        {"reward_mean": 0.625, "logprob_max_abs_diff": 1.23e-3, "agreement_bound": 0.05, "loss": None},
        tokens_per_s=1840.4,
        step_s=1.94,
        eta_s=72,
    )
    want = "[rl   3/40] reward 0.625 | agree max|Δ| 1.2e-03 (bound 5.0e-02) | 1,840 tok/s | 1.9 s/step | ETA 1:12"
    assert line == want
    sft = format_step_line("sft", 1, 2, {"loss": 0.5, "reward_mean": 1.0}, tokens_per_s=None, step_s=None, eta_s=None)
    assert sft == "[sft 1/2] reward 1.000 | loss 0.5000 | ETA ?", "no agreement in SFT, no guessed rate"
    assert format_eta(3725) == "1:02:05" and format_eta(None) == "?"
    evaluated = format_eval_line("after_sft", 0, 0.95, 20, 3.14)
    assert evaluated == "[eval after_sft @ rl 0] reward 0.950 over 20 episodes (3.1 s)"


def test_lines_are_flushed_per_step_with_an_eta_from_the_steps_so_far():
    out = io.StringIO()  # not a terminal: lines only, no bar
    p = Progress({"rl": 4}, stream=out)
    p.begin("rl", 0)
    for k in (1, 2):
        p.step("rl", k, {"reward_mean": 0.5}, tokens=100)
    lines = out.getvalue().splitlines()
    assert [line.split("]")[0] for line in lines] == ["[rl  1/4", "[rl  2/4"]
    assert all("tok/s" in line and re.search(r"ETA \d+:\d\d", line) for line in lines), lines
    silent = io.StringIO()
    Progress({"rl": 4}, enabled=False, stream=silent).step("rl", 1, {"reward_mean": 0.5})
    assert silent.getvalue() == ""


def test_a_tiny_training_prints_a_progress_line_per_step_into_a_pipe(tmp_path):
    sets = [
        "sft.steps=2",
        "sft.rows_per_step=4",
        "rollout.rows_per_step=4",
        "rollout.repeats=2",
        "data.eval_rows=4",
        "data.train_rows=16",
        "run.eval_every=0",
        "run.samples=1",
        "run.steps=2",
        f"run.out={tmp_path / 'run'}",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    code = (
        "import sys; from vlrl.train.config import load_config; from vlrl.train.loop import train; "
        "train(load_config('color_square', sys.argv[1:]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, *sets], capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    err = proc.stderr.splitlines()
    steps = [line for line in err if line.startswith(("[sft", "[rl"))]
    heads = [line.split("]")[0] for line in steps]
    assert heads == ["[sft 1/2", "[sft 2/2", "[rl  1/2", "[rl  2/2"], proc.stderr[-3000:]
    for line in steps:
        assert re.search(r"reward -?\d+\.\d{3}", line) and "tok/s" in line, line
        assert re.search(r"ETA (\d+:\d\d|\?)", line), line
    assert all(re.search(r"agree max\|Δ\| \S+ \(bound \S+\)", line) for line in steps if line.startswith("[rl")), steps
    evals = [line for line in err if line.startswith("[eval")]
    assert [line.split(" @")[0] for line in evals] == ["[eval before", "[eval after_sft", "[eval after"], evals
    assert "rollout:" not in proc.stderr, "no per-rollout-batch bars in training"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_one_bar_per_phase_sits_under_the_lines():
    out = _Terminal()
    p = Progress({"sft": 2, "rl": 3}, stream=out)
    p.begin("sft", 0)
    for k in (1, 2):
        p.step("sft", k, {"loss": 1.0})
    p.begin("rl", 0)
    p.step("rl", 1, {"reward_mean": 0.0})
    p.close()
    text = out.getvalue()
    assert text.count("[sft 1/2]") == 1 and text.count("[sft 2/2]") == 1 and text.count("[rl  1/3]") == 1
    assert re.search(r"sft: 100%\|.*\| 2/2", text) and re.search(r"rl:  33%\|.*\| 1/3", text), text
