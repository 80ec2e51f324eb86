"""The report's learning-signal section (vlrl.report.learning) on synthetic metrics.jsonl files."""

from __future__ import annotations

import json

from vlrl.report.learning import learning_figures, learning_notes, learning_section, reward_table
from vlrl.report.runfiles import read_run


def write_metrics(root, rows) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def rl_row(step: int) -> dict:
    return {
        "step": step,
        "phase": "rl",
        "reward_mean": 0.25 + 0.05 * step,
        "adv_abs_mean": 0.6,
        "adv_zero_group_frac": 0.5 if step < 3 else 0.0,
        "reward_equal_group_frac": 0.5 if step < 3 else 0.0,
        "entropy": 0.7,
        "entropy_first_token": 1.4 - 0.1 * step,
        "grad_norm/vision": 1e-4 * step,
        "grad_norm/merger": 1e-3,
        "grad_norm/language": 0.1,
        "grad_norm/embed": 0.5,
    }


def test_section_has_the_three_figures_the_reward_table_and_findings(tmp_path):
    write_metrics(
        tmp_path,
        [
            {"step": 0, "phase": "eval", "label": "before", "eval_reward_mean": 0.25},
            *(rl_row(s) for s in range(1, 7)),
            {"step": 6, "phase": "eval", "label": "after", "eval_reward_mean": 0.9},
        ],
    )
    run = read_run(tmp_path)
    assert set(learning_figures(run)) == {"advantages", "grad norms", "entropy"}
    html = learning_section(run)
    assert html.startswith("<h2>Learning signal</h2>") and html.count("<img") == 3
    notes = learning_notes(run)
    assert "17% of groups had zero advantage" in notes[0]  # steps 1 and 2 of 6 at 0.5
    assert notes[1].startswith("median grad norm by module (before clipping): embedding / lm head 0.5")
    assert "1.3 at the first RL step, 0.8 at the last" in notes[2]
    table = reward_table(run)
    assert "<td>0.30</td>" in table and "<td><b>0.90</b></td>" in table


def test_vision_grad_norm_of_zero_is_drawn_not_dropped(tmp_path):
    write_metrics(tmp_path, [rl_row(0), rl_row(1)])  # step 0: grad_norm/vision == 0
    assert "grad norms" in learning_figures(read_run(tmp_path))


def test_a_run_without_the_diagnostics_has_no_section(tmp_path):
    write_metrics(tmp_path, [{"step": 1, "phase": "sft", "loss": 3.0}])
    run = read_run(tmp_path)
    assert learning_section(run) == "" and learning_figures(run) == {} and learning_notes(run) == []


def test_long_runs_list_at_most_twelve_steps_ending_with_the_last(tmp_path):
    write_metrics(tmp_path, [rl_row(s) for s in range(1, 61)])
    table = reward_table(read_run(tmp_path))
    steps = [int(c.split("<")[0]) for c in table.split("</tr>")[0].split("<td>")[2:]]
    assert len(steps) == 12 and steps[0] == 1 and steps[-1] == 60
