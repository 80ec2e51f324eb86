"""The verdict strip at the top of report.html: pass/fail of the run's criteria, eval reward by stage,
RL's own gain with its 95 % interval, agreement worst vs bound; failed samples beside solved ones."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest
from report_runs import trajectory, write_jsonl

from vlrl.report.training import metric_groups, pick_samples, write_report
from vlrl.report.verdict import newcombe_difference, wilson

CONFIG = "[data]\neval_rows = 20\n\n[run]\nsteps = 2\n"


def sft_did_it_run(root, *, breach: bool = False, config: str = CONFIG):
    """SFT took eval from 0 to 1; RL kept it at 1 (the run whose headline read "eval reward 0 → 1")."""
    root.mkdir(parents=True)
    (root / "config.toml").write_text(config)
    metrics = [
        {"step": 0, "phase": "eval", "eval_reward_mean": 0.0, "eval_success": 0.0, "label": "before"},
        {"step": 1, "phase": "sft", "loss": 1.0},
        {"step": 0, "phase": "eval", "eval_reward_mean": 1.0, "eval_success": 1.0, "label": "after_sft"},
        {"step": 1, "phase": "rl", "reward_mean": 1.0, "loss": 0.0, "grad_norm": 0.1, "time_rollout_s": 0.5},
        {"step": 2, "phase": "rl", "reward_mean": 1.0, "loss": 0.0, "grad_norm": 0.1, "time_rollout_s": 0.5},
        {"step": 2, "phase": "eval", "eval_reward_mean": 1.0, "eval_success": 1.0, "label": "after"},
    ]
    write_jsonl(root / "metrics.jsonl", metrics)
    agreement = [
        {"step": 1, "max_abs": 2e-6, "bound": 1e-4, "breached": False},
        {"step": 2, "max_abs": 3e-4 if breach else 5e-6, "bound": 1e-4, "breached": breach},
    ]
    write_jsonl(root / "agreement.jsonl", agreement)
    (root / "summary.json").write_text(json.dumps({"eval_before": 0.0, "eval_after": 1.0, "steps": 2}))
    return root


class Strip(HTMLParser):
    """The verdict strip's elements with their attributes and text, in document order."""

    def __init__(self):
        super().__init__()
        self.depth = 0  # > 0 inside the strip
        self.first_div_is_strip: bool | None = None
        self.found: list[tuple[str, dict, list[str]]] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "div" and self.first_div_is_strip is None:
            self.first_div_is_strip = a.get("class") == "vlrl-verdict"
        if self.depth or a.get("class") == "vlrl-verdict":
            self.depth += tag not in ("br", "img")
            self.found.append((tag, a, []))

    def handle_endtag(self, tag):
        if self.depth and tag not in ("br", "img"):
            self.depth -= 1

    def handle_data(self, data):
        if self.depth and self.found:
            self.found[-1][2].append(data)

    def one(self, cls: str) -> tuple[dict, str]:
        (hit,) = [
            (a, "".join(t for _, _, ts in self.found[i:] for t in ts))
            for i, (_, a, _) in enumerate(self.found)
            if cls in (a.get("class") or "").split()
        ]
        return hit


def parse(path) -> Strip:
    p = Strip()
    p.feed(path.read_text())
    return p


def test_the_strip_comes_first_and_says_sft_did_all_of_it(tmp_path):
    strip = parse(write_report(sft_did_it_run(tmp_path / "run")))
    assert strip.first_div_is_strip, "the verdict strip is the first thing in the body"
    verdict, _ = strip.one("vlrl-verdict")
    assert verdict["data-passed"] == "true"
    stages, text = strip.one("vv-stages")
    assert (stages["data-before"], stages["data-after-sft"], stages["data-after"]) == ("0", "1", "1")
    assert "before 0.000 → after SFT 1.000 → after RL 1.000" in text
    assert "SFT +1.000, RL +0.000" in text
    gain, text = strip.one("vv-gain")
    low, high = newcombe_difference(1.0, 1.0, 20, 20)
    assert float(gain["data-gain"]) == 0.0 and float(gain["data-low"]) == pytest.approx(low, abs=1e-5)
    assert float(gain["data-high"]) == pytest.approx(high, abs=1e-5) and low < 0 < high + 1e-9
    assert "from after SFT" in text and "over 20 eval episodes (Newcombe–Wilson" in text
    agree, text = strip.one("vv-agree")
    assert float(agree["data-worst"]) == 5e-6 and float(agree["data-bound"]) == 1e-4 and "step 2" in text
    criteria = [a for tag, a, _ in strip.found if "data-criterion" in a]
    assert [(c["data-criterion"], c["data-passed"]) for c in criteria] == [("agreement held", "true")]


def test_a_breach_fails_the_strip_with_the_checks_message(tmp_path):
    strip = parse(write_report(sft_did_it_run(tmp_path / "run", breach=True)))
    verdict, text = strip.one("vlrl-verdict")
    assert verdict["data-passed"] == "false"
    assert "FAIL" in text and "max |Δ| 0.0003 > bound 0.0001" in text
    assert float(strip.one("vv-agree")[0]["data-worst"]) == 3e-4


def test_stop_at_becomes_a_learned_criterion(tmp_path):
    run = sft_did_it_run(tmp_path / "run", config=CONFIG + "stop_at = 0.9\n")
    strip = parse(write_report(run))
    criteria = {a["data-criterion"]: a["data-passed"] for _, a, _ in strip.found if "data-criterion" in a}
    assert criteria == {"agreement held": "true", "learned (eval ≥ 0.9)": "true"}


def test_wilson_and_newcombe_match_published_values():
    # Newcombe (1998), Statistics in Medicine 17:873, table II: 56/70 vs 48/80 → difference 0.2000, 95 % CI by
    # method 10 (from Wilson score intervals) 0.0524 to 0.3339
    low, high = newcombe_difference(48 / 80, 56 / 70, 80, 70)
    assert (round(low, 4), round(high, 4)) == (0.0524, 0.3339)
    assert tuple(round(x, 4) for x in wilson(81, 263)) == (0.2553, 0.3662)  # Newcombe 1998a, example (a)


def test_failed_samples_sit_beside_solved_ones(tmp_path):
    run = sft_did_it_run(tmp_path / "run")
    good = [trajectory(f"good-{i}", rewards=[0.0, 1.0]) for i in range(5)]
    bad = [trajectory(f"bad-{i}", rewards=[0.0, 0.0]) for i in range(2)]
    write_jsonl(run / "samples" / "step_000002.jsonl", good + bad)
    assert [r["uid"] for r in pick_samples(good + bad, 4)] == ["bad-0", "good-0", "bad-1", "good-1"]
    text = write_report(run).read_text()
    section = text[text.index("<h2>Rollouts</h2>") :]
    assert "solved (5 of 7)" in section and "failed (2 of 7)" in section
    solved_col = section[section.index("class='solved'") : section.index("class='failed'")]
    failed_col = section[section.index("class='failed'") :]
    assert "good-0" in solved_col and "bad-0" not in solved_col and "bad-0" in failed_col and "good-0" not in failed_col


def test_the_last_steps_metrics_are_a_grouped_table(tmp_path):
    row = {
        "step": 2,
        "phase": "rl",
        "reward_mean": 1.0,
        "adv_abs_mean": 0.3,
        "grad_norm/vision": 0.1,
        "time_train_s": 1.0,
        "odd": 7,
    }
    groups = dict(metric_groups(row))
    assert list(groups) == ["reward", "advantages", "gradients", "time", "other"]
    assert groups["gradients"] == [("grad_norm/vision", 0.1)] and groups["other"] == [("odd", 7)]
    text = write_report(sft_did_it_run(tmp_path / "run")).read_text()
    table = re.search(r"<table class='metrics'>(.*?)</table>", text).group(1)
    assert re.findall(r"<tr><td>([a-z ]+)</td>", table) == ["reward", "policy update", "gradients", "time"]
