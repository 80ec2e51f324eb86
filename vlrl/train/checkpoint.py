"""Checkpoints with exact resume, written atomically: model, optimizer, RNG and the run's position.

``<run>/checkpoints/step_<N>/`` (RL step N) and ``sft_<K>/`` (mid-SFT, K steps done): ``model.pt``
(state dict), ``optimizer.pt``, ``rng.pt`` (torch RNG) and ``state.json`` (:class:`RunState`: steps
done, data position, weight version, the first evaluation, and the size of every run log at the
save, so a resume trims the logs back to this instant). Rollout sampling seeds and mini-batch order
derive from ``(run.seed, step)``, so with these a resumed run takes exactly the steps the
uninterrupted one would have.

Atomic: a checkpoint is written into a hidden temporary directory beside its final place, every
file flushed to disk, then renamed into place — so a process killed at any instant leaves either the
complete checkpoint or none (plus a temporary directory that the next save or resume removes), and
:func:`latest_checkpoint` only ever sees complete ones. Loading uses ``torch.load(weights_only=True)``:
a checkpoint holds tensors and plain containers, never code.

**Distributed checkpoints.** A policy sharded with FSDP2 (``torchrun``) is saved with
``torch.distributed.checkpoint`` (DCP) instead of ``model.pt`` / ``optimizer.pt``: ``dcp/model`` and
``dcp/optim``, every rank writing its own shards in parallel, rank 0 the metadata, ``rng.pt`` and
``state.json`` (and the rename). DCP reshards on load, so such a checkpoint resumes on any number of ranks —
and in one plain process, which loads the same files into whole tensors. A plain ``model.pt`` checkpoint
resumes under FSDP too (loaded whole, then sharded). Optimizer states are keyed by parameter name
(``get_optimizer_state_dict``), the same in both formats. With LoRA only the adapters (the trainable
parameters) are saved: the base weights are the model directory's.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from vlrl.durable import TMP_PREFIX, fsync_path, write_synced
from vlrl.train.fsdp import is_sharded, reshard

TRASH_PREFIX = ".old-"
DCP_DIR = "dcp"

RestoreOptimizer = Callable[[torch.optim.Optimizer], None]
"""Loads a checkpoint's optimizer state into an optimizer made later (the SFT one is made when SFT resumes)."""


@dataclass
class RunState:
    rl_step: int = 0
    sft_step: int = 0
    data_position: int = 0
    weight_version: int = 0
    optimizer: Literal["rl", "sft"] = "rl"
    """Which trainer's optimizer ``optimizer.pt`` holds (SFT has its own, dropped before RL)."""
    eval_before: float | None = None
    """The evaluation before any training (kept through resumes for summary.json)."""
    eval_after: float | None = None
    """The final evaluation: set in the run's last checkpoint (a resume from it has nothing left to do)."""
    log_sizes: dict[str, int] = field(default_factory=dict)
    """Bytes of each run log (``metrics.jsonl``, …) when the checkpoint was saved."""

    @classmethod
    def from_json(cls, text: str) -> RunState:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in json.loads(text).items() if k in known})


def checkpoint_name(state: RunState) -> str:
    return f"sft_{state.sft_step:06d}" if state.optimizer == "sft" else f"step_{state.rl_step:06d}"


def save_checkpoint(path: Path, model, optimizer, state: RunState) -> Path:
    """Write a checkpoint to ``path`` atomically (see the module docstring); returns ``path``.

    Under FSDP every rank must call it (the shards are written collectively)."""
    path = Path(path)
    tmp = path.parent / f"{TMP_PREFIX}{path.name}"
    main = _is_main()
    if main:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_partial(path.parent)
        tmp.mkdir()
    _barrier()
    if is_sharded(model):
        reshard(model)
        dcp.save({"model": _model_state(model)}, checkpoint_id=tmp / DCP_DIR / "model")
        if optimizer is not None and optimizer.state:
            dcp.save({"optim": get_optimizer_state_dict(model, optimizer)}, checkpoint_id=tmp / DCP_DIR / "optim")
    elif main:
        _save(_model_state(model), tmp / "model.pt")
        if optimizer is not None and optimizer.state:  # an optimizer that never stepped has nothing to restore
            _save(get_optimizer_state_dict(model, optimizer), tmp / "optimizer.pt")
    _barrier()
    if main:
        _save({"torch": torch.get_rng_state()}, tmp / "rng.pt")
        write_synced(tmp / "state.json", json.dumps(asdict(state), indent=2).encode())
        _replace(tmp, path)
    _barrier()
    return path


def _replace(tmp: Path, path: Path) -> None:
    for f in tmp.rglob("*"):
        if f.is_file():
            fsync_path(f)
    fsync_path(tmp)
    if path.exists():  # the same step saved again (e.g. the final save after a periodic one)
        trash = path.parent / f"{TRASH_PREFIX}{path.name}"
        os.replace(path, trash)
        os.replace(tmp, path)
        shutil.rmtree(trash)
    else:
        os.replace(tmp, path)
    fsync_path(path.parent)


def load_checkpoint(path: Path, model) -> tuple[RunState, RestoreOptimizer | None]:
    """Load weights and RNG into ``model`` / torch; returns the state and a function that loads the saved
    optimizer state into an optimizer over ``model`` (for whichever trainer ``state.optimizer`` names), or
    None when the checkpoint has none. Either format into a plain or an FSDP model (collective under FSDP)."""
    path = Path(path)
    if not (path / "state.json").is_file():
        raise FileNotFoundError(f"{path} is not a complete vlrl checkpoint (no state.json)")
    if (path / DCP_DIR).is_dir():
        restore = _load_dcp(path / DCP_DIR, model)
    else:
        restore = _load_plain(path, model)
    torch.set_rng_state(torch.load(path / "rng.pt", weights_only=True)["torch"])
    return RunState.from_json((path / "state.json").read_text()), restore


def _options(model, **kwargs) -> StateDictOptions:
    frozen = any(not p.requires_grad for p in model.parameters())
    return StateDictOptions(ignore_frozen_params=True, strict=not frozen, **kwargs)


def _model_state(model) -> dict[str, Any]:
    """The model's state dict without frozen parameters (a LoRA model's base: the model directory has them).
    Filtered by name too: ``ignore_frozen_params`` keeps a tied weight's second name (``lm_head.weight``)."""
    state = get_model_state_dict(model, options=_options(model))
    if any(not p.requires_grad for p in model.parameters()):
        trainable = {n for n, p in model.named_parameters() if p.requires_grad}
        state = {k: v for k, v in state.items() if k in trainable}
    return state


def _load_dcp(root: Path, model) -> RestoreOptimizer | None:
    if is_sharded(model):
        reshard(model)
    state = {"model": _model_state(model)}
    _dcp_load(state, root / "model")
    set_model_state_dict(model, state["model"], options=_options(model))
    if not (root / "optim").is_dir():
        return None

    def restore(optimizer: torch.optim.Optimizer) -> None:
        saved = {"optim": get_optimizer_state_dict(model, optimizer)}
        _dcp_load(saved, root / "optim")
        set_optimizer_state_dict(model, optimizer, saved["optim"])

    return restore


def _dcp_load(state: dict, where: Path) -> None:
    with warnings.catch_warnings():  # a plain process loading a distributed checkpoint: meant, not a mistake
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=where, no_dist=not dist.is_initialized())


def _load_plain(path: Path, model) -> RestoreOptimizer | None:
    device = next(model.parameters()).device
    whole = is_sharded(model)  # whole tensors from model.pt, sharded by set_*_state_dict
    weights = torch.load(path / "model.pt", map_location="cpu" if whole else device, weights_only=True)
    set_model_state_dict(model, weights, options=_options(model, full_state_dict=whole))
    if not (path / "optimizer.pt").exists():
        return None
    saved = torch.load(path / "optimizer.pt", map_location="cpu" if whole else device, weights_only=True)

    def restore(optimizer: torch.optim.Optimizer) -> None:
        set_optimizer_state_dict(model, optimizer, saved, options=StateDictOptions(full_state_dict=whole))

    return restore


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint under ``<run_dir>/checkpoints`` (by RL step, then SFT step)."""
    best, key = None, None
    for state_file in (Path(run_dir) / "checkpoints").glob("*/state.json"):
        if state_file.parent.name.startswith((TMP_PREFIX, TRASH_PREFIX)):
            continue
        try:
            state = RunState.from_json(state_file.read_text())
        except (ValueError, TypeError):
            continue
        k = (state.rl_step, state.sft_step, state.eval_after is not None, state_file.parent.name)
        if key is None or k > key:
            best, key = state_file.parent, k
    return best


def remove_partial(checkpoints: Path) -> None:
    """Clean up after a save that was killed: temporary directories go; a checkpoint moved aside to be
    replaced comes back if its replacement never arrived (it is complete)."""
    for leftover in sorted(Path(checkpoints).glob(".*")):
        if not leftover.is_dir():
            continue
        if leftover.name.startswith(TMP_PREFIX):
            shutil.rmtree(leftover)
        elif leftover.name.startswith(TRASH_PREFIX):
            target = leftover.with_name(leftover.name[len(TRASH_PREFIX) :])
            if target.exists():
                shutil.rmtree(leftover)
            else:
                os.replace(leftover, target)


def _save(obj: Any, path: Path) -> None:
    with path.open("wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def _is_main() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
