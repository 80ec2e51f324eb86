"""Pass criteria of a training run, over its run directory (library code; the plugin wraps it).

- :func:`learned`: the final eval reward reaches a threshold;
- :func:`agreement_held`: rollout and trainer logprobs agreed within bound at every RL step;
- :func:`changed_parameters`: which trainable parameters the run left unchanged;
- :func:`images_mattered`: every image-sensitivity probe of the run (``run.image_probe``) passed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from vlrl.errors import VlrlError


class TrainingCheckError(VlrlError, AssertionError):
    """A training run that did not meet a pass criterion."""


def read_jsonl(path: Path) -> list[dict]:
    path = Path(path)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


@dataclass(frozen=True)
class RunRecord:
    """What a run directory holds: summary, metrics and agreement lines."""

    dir: Path
    summary: dict
    metrics: list[dict] = field(default_factory=list)
    agreement: list[dict] = field(default_factory=list)
    image_sensitivity: list[dict] = field(default_factory=list)

    @classmethod
    def load(cls, run_dir: str | Path) -> RunRecord:
        d = Path(run_dir)
        summary = json.loads((d / "summary.json").read_text()) if (d / "summary.json").exists() else {}
        return cls(
            d,
            summary,
            read_jsonl(d / "metrics.jsonl"),
            read_jsonl(d / "agreement.jsonl"),
            read_jsonl(d / "image_sensitivity.jsonl"),
        )

    def phase(self, name: str) -> list[dict]:
        return [m for m in self.metrics if m.get("phase") == name]


def learned(record: RunRecord, threshold: float) -> None:
    evals = record.phase("eval")
    if not evals:
        raise TrainingCheckError(f"{record.dir}: no evaluation was logged")
    curve = ", ".join(f"{e['step']}:{e['eval_reward_mean']:.3f}" for e in evals)
    final = evals[-1]["eval_reward_mean"]
    if final < threshold:
        raise TrainingCheckError(f"final eval reward {final:.3f} < {threshold} (eval curve step:reward {curve})")


def agreement_held(record: RunRecord, steps: int | None = None) -> None:
    rl = record.phase("rl")
    if steps is not None and len(record.agreement) != steps:
        raise TrainingCheckError(f"{len(record.agreement)} agreement records for {steps} RL steps")
    if not record.agreement and rl:
        raise TrainingCheckError("RL steps ran but no agreement was recorded")
    bad = [a for a in record.agreement if a["breached"] or a["max_abs"] > a["bound"]]
    if bad:
        worst = max(bad, key=lambda a: a["max_abs"])
        raise TrainingCheckError(
            f"logprob agreement breached at {len(bad)} step(s); worst step {worst['step']}: "
            f"max |Δ| {worst['max_abs']:.3g} > bound {worst['bound']:.3g}"
        )


def images_mattered(record: RunRecord) -> None:
    """Every image-sensitivity probe logged by the run passed (and at least one ran)."""
    rows = record.image_sensitivity
    if not rows:
        raise TrainingCheckError(f"{record.dir}: no image-sensitivity probe ran (set run.image_probe=true)")
    bad = [r for r in rows if not r["passed"]]
    if bad:
        r = bad[0]
        raise TrainingCheckError(
            f"image-sensitivity probe '{r['label']}' failed: {r['sensitive_fraction']:.0%} of "
            f"{r['turns']} turns moved by >= {r['min_mean_abs']:g} when their image changed"
        )


def changed_parameters(before: dict, after: dict) -> list[str]:
    """Names of tensors in ``before`` (name → tensor) that are exactly equal in ``after``."""
    import torch

    return [name for name, t in before.items() if torch.equal(t, after[name].to(t.device, t.dtype))]
