"""Checkpoints with exact resume: model, optimizer, RNG and the run's position.

``<run>/checkpoints/step_<N>/``: ``model.pt`` (state dict), ``optimizer.pt``, ``state.json``
(RL step, SFT steps done, data position, weight version) and ``rng.pt`` (torch RNG). Rollout
sampling seeds and mini-batch order are derived from ``(run.seed, step)``, so with these a resumed
run takes exactly the steps the uninterrupted one would have.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch


@dataclass
class RunState:
    rl_step: int = 0
    sft_step: int = 0
    data_position: int = 0
    weight_version: int = 0


def save_checkpoint(path: Path, model, optimizer, state: RunState) -> Path:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), path / "model.pt")
    if optimizer is not None:
        torch.save(optimizer.state_dict(), path / "optimizer.pt")
    torch.save({"torch": torch.get_rng_state()}, path / "rng.pt")
    (path / "state.json").write_text(json.dumps(asdict(state), indent=2))  # written last: marks it complete
    return path


def load_checkpoint(path: Path, model, optimizer) -> RunState:
    path = Path(path)
    if not (path / "state.json").exists():
        raise FileNotFoundError(f"{path} is not a complete vlrl checkpoint (no state.json)")
    model.load_state_dict(torch.load(path / "model.pt", map_location=next(model.parameters()).device))
    if optimizer is not None and (path / "optimizer.pt").exists():
        optimizer.load_state_dict(torch.load(path / "optimizer.pt"))
    torch.set_rng_state(torch.load(path / "rng.pt")["torch"])
    return RunState(**json.loads((path / "state.json").read_text()))


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = sorted((Path(run_dir) / "checkpoints").glob("step_*/state.json"))
    return found[-1].parent if found else None
