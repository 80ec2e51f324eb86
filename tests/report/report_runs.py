"""Synthetic training run directories in the documented layout, for the report tests.

Sample trajectories go through the real writer (``vlrl.rollout.io.trajectory_record``) so a change
of the record schema shows up here. Each frame is one flat colour (``FRAME_COLORS[turn]``), so a
test can tell which frame a strip put under which action.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

FRAME_COLORS = [(255, 0, 0), (0, 160, 0), (0, 0, 255), (200, 200, 0)]
ACTIONS = ["<action>up</action>", "I go <action>left</action>", "<action>stop</action>"]
CONFIG = '[model]\narch = "qwen2_5_vl"\n\n[rl]\nsteps = 8\n'


def frame(color, size: int = 64) -> np.ndarray:
    img = np.zeros((size, size, 3), dtype=np.uint8)
    img[:] = color
    return img


def trajectory(uid: str, n_turns: int = 2, rewards=None, final_frame: bool = True, size: int = 64) -> dict:
    """A trajectory record: frame k, then action k, for each turn; a final frame after the last action."""
    from vlrl.messages import image_part, text_part
    from vlrl.rollout.io import trajectory_record
    from vlrl.rollout.types import Trajectory, TurnSpan

    rewards = list(rewards) if rewards is not None else [0.0] * (n_turns - 1) + [1.0]
    messages, spans = [], []
    for k in range(n_turns):
        text = "You are in a maze." if k == 0 else f"Environment feedback: moved ({k})"
        messages.append({"role": "user", "content": [image_part(frame(FRAME_COLORS[k], size)), text_part(text)]})
        messages.append({"role": "assistant", "content": ACTIONS[k]})
        spans.append(
            TurnSpan(
                index=k,
                obs_start=0,
                gen_start=2 * k,
                gen_end=2 * k + 2,
                reward=rewards[k],
                finish_reason="stop",
                eos_appended=False,
                text=ACTIONS[k],
                images_before=k + 1,
            )
        )
    if final_frame:
        messages.append(
            {
                "role": "user",
                "content": [image_part(frame(FRAME_COLORS[n_turns], size)), text_part("Environment feedback: done")],
            }
        )
    n = 2 * n_turns
    traj = Trajectory(
        uid=uid,
        group=0,
        prompt_ids=(1, 2),
        response_ids=tuple(range(10, 10 + n)),
        loss_mask=(1,) * n,
        logprobs=(-0.5,) * n,
        rewards=(0.0,) * n,
        pixel_values=None,
        image_grid_thw=None,
        placeholders=(),
        image_hashes=(),
        turns=tuple(spans),
        stop_reason="done",
        temperature=1.0,
        messages=tuple(messages),
        metrics={"return": float(sum(rewards)), "turns": n_turns},
    )
    return trajectory_record(traj)


def write_jsonl(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def make_run(root: Path, *, steps: int = 8, sample_steps=(0, 8), per_step: int = 2, summary=True, bounds=True) -> Path:
    """A complete run directory: SFT then RL metrics, evals, agreement with histograms, samples, summary."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.toml").write_text(CONFIG)
    metrics = [{"step": s, "phase": "sft", "time": 0.5 * s, "loss": 3.0 / (s + 1)} for s in range(4)]
    for s in range(steps):
        metrics.append(
            {
                "step": s,
                "phase": "rl",
                "time": 2.0 + s,
                "reward_mean": s / steps,
                "loss": 0.1 - 0.01 * s,
                "entropy": 2.0,
                "grad_norm": 1.0,
                "kl": 1e-3,
                "clipfrac": 0.0,
                "response_len": 12,
            }
        )
        if s % 4 == 0:
            metrics.append(
                {"step": s, "phase": "eval", "time": 2.5 + s, "eval_reward_mean": s / steps, "eval_success": s / steps}
            )
    write_jsonl(root / "metrics.jsonl", metrics)
    agreement = []
    for s in range(steps):
        row = {
            "step": s,
            "max_abs": 1e-6 * (1 + s),
            "mean_abs": 2e-7,
            "k3": 1e-13,
            "ratio_min": 0.999,
            "ratio_max": 1.001,
            "breached": s == 3,
            "turns": [{"turn": 0, "max_abs": 1e-6, "mean_abs": 1e-7}, {"turn": 1, "max_abs": 2e-6, "mean_abs": 3e-7}],
            "hist": {"edges": list(range(-10, 1)), "counts": [0, 0, 2, 10, 40, 7, 1, 0, 0, 0]},
        }
        if bounds:
            row["bounds"] = {"max_abs": 1e-4, "mean_abs": 2e-5}
        agreement.append(row)
    write_jsonl(root / "agreement.jsonl", agreement)
    for step in sample_steps:
        write_jsonl(root / "samples" / f"step_{step:06d}.jsonl", [trajectory(f"{step}-{i}") for i in range(per_step)])
    if summary:
        (root / "summary.json").write_text(
            json.dumps(
                {
                    "eval_before": 0.25,
                    "eval_after": 0.95,
                    "steps": steps,
                    "seconds": 42.0,
                    "passed": True,
                    "threshold": 0.9,
                }
            )
        )
    return root
