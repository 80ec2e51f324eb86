"""The loss figure draws a phase's learning-rate schedule beside its loss (vlrl.report.plots.loss_curve); the reward
figure of a run evaluated at one step only spans whole steps.

Why: lease_v4's easy SFT loss rose for its first half and fell only as the rate decayed (docs/maze.md item 34);
a report that shows the loss alone hides that."""

from __future__ import annotations

import json

from vlrl.report.plots import loss_curve, loss_figure, lr_schedule, reward_figure
from vlrl.report.runfiles import read_run


def sft_run(root, with_lr: bool):
    rows = []
    for step in range(1, 41):
        row = {"step": step, "phase": "sft", "loss": 0.02 - 0.0003 * step}
        if with_lr:
            row["lr_factor"] = min(step / 10, 1.0 - 0.02 * step)  # warm-up, then a linear decay
        rows.append(row)
    root.mkdir(parents=True)
    (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return read_run(root)


def test_the_schedule_is_drawn_on_a_second_axis_where_the_rate_moved(tmp_path):
    with_lr, without = sft_run(tmp_path / "lr", True), sft_run(tmp_path / "plain", False)
    xs, ys = lr_schedule(with_lr.phase("sft"))
    assert xs[:2] == [1.0, 2.0] and ys[:2] == [0.1, 0.2] and len(xs) == 40 and abs(ys[-1] - 0.2) < 1e-9
    assert lr_schedule(without.phase("sft")) is None
    drawn, plain = loss_figure(with_lr), loss_figure(without)
    assert len(plain.axes) == 1 and len(drawn.axes) == 2  # the loss's axis, and the schedule's twin
    twin = drawn.axes[1]
    assert twin.get_ylabel() == "lr factor" and list(twin.lines[0].get_ydata()) == ys
    assert loss_curve(with_lr).startswith(b"\x89PNG")
    import matplotlib.pyplot as plt  # after the report set its Agg backend

    plt.close(drawn), plt.close(plain)


def test_a_constant_rate_is_left_out():
    rows = [{"step": s, "phase": "rl", "loss": 0.1, "lr_factor": 1.0} for s in range(5)]
    assert lr_schedule(rows) is None


def test_one_eval_step_gets_whole_steps_around_it(tmp_path):
    """An SFT-only maze level evaluates once, at step 0: its axis read -0.045 … 0.045 (lease_v4's report)."""
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0, "phase": "eval", "eval_reward_mean": 0.945}) + "\n")
    fig = reward_figure(read_run(tmp_path))
    assert fig.axes[0].get_xlim() == (-1.0, 1.0)
    import matplotlib.pyplot as plt

    plt.close(fig)
