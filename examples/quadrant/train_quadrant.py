"""Train the quadrant env through vlrl's Python API (until ``vlrl train`` takes ``data.env=module:factory``).

    python examples/quadrant/train_quadrant.py examples/quadrant/quadrant.toml [key=value ...]

Registers the env and its expert under the name ``quadrant``, runs the TOML, prints the eval curve and the
image probe's results.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from quadrant_env import quadrant_expert, registry_factory

from vlrl.envs.registry import register_env, register_expert


def register() -> None:
    """``quadrant`` in vlrl's env and expert registries (idempotent)."""
    register_env("quadrant", registry_factory, replace=True)
    register_expert("quadrant", quadrant_expert, replace=True)


def main(argv: list[str]) -> None:
    from vlrl.checks.training import RunRecord
    from vlrl.train.config import load_config
    from vlrl.train.loop import train

    register()
    cfg = load_config(argv[0], ["run.progress=False", *argv[1:]])
    summary = train(cfg)
    record = RunRecord.load(summary["out"])
    print(json.dumps({"evals": [(e["label"], e["step"], e["eval_reward_mean"]) for e in record.phase("eval")]}))
    sft = record.phase("sft")
    if sft:
        print("sft loss first/last:", sft[0].get("loss"), sft[-1].get("loss"))
    for r in record.image_sensitivity:
        print(
            "image probe",
            r["label"],
            "passed" if r["passed"] else "FAILED",
            f"{r['sensitive_fraction']:.0%} of {r['turns']} turns,",
            f"blank median {r['blank_mean_abs_median']:.3g}",
        )
    print("seconds", summary["seconds"])


if __name__ == "__main__":
    main(sys.argv[1:])
