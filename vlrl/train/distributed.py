"""Data parallelism over torchrun's processes: the process group, each rank's share of a batch, and the
collectives that keep a distributed step equal to the one-process step.

``torchrun --nproc-per-node N -m vlrl train …`` starts N processes; each finds its rank in the environment
torchrun sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``) and joins one process group (NCCL on
CUDA, gloo on CPU). Without torchrun a run is one plain process (:meth:`Dist.single`), unchanged.

**One step, N ranks.** Rank 0 rolls out (the engine lives there, see ``vlrl.train.run``) and broadcasts the
trajectories; every rank collates the same global batch (CPU tensors: cheap) and takes its *share* — a
contiguous block of rows, the shares as equal as the batch allows — for the expensive parts: the trainer's
logprob forward and the update. The old logprobs are gathered back, so advantages, rollout correction and
the agreement check run on the *global* batch on every rank, exactly as in one process, and every rank takes
the same decisions (an agreement breach stops all of them). The update divides every rank's loss by the
*global* token (or sequence) count (:func:`global_agg_counts`) and FSDP2 sums the gradients (its divide
factor is set to 1), so the gradient is the global batch's — not a mean of per-rank means.

**Equal work per rank.** FSDP2 all-gathers parameters in every forward and reduce-scatters gradients after
every backward, so every rank must run the same number of forwards and backwards. Shares therefore have
equal row counts: when the batch does not divide by N, a short rank gets one *padding row*, a copy of one
of its rows with an empty loss mask (no loss, no count, no metric). Such a row must share its micro-batch
with a real one: a micro-batch of padding alone has no token to back-propagate from (the forward computes
only trained positions) and fails loudly. With the default one mini-batch and ``optim.micro_batch_size`` at
least a share, that never happens; batches that divide by N never pad.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from vlrl.algos.aggregation import AggCounts, agg_counts
from vlrl.errors import VlrlError
from vlrl.train.batch import Batch
from vlrl.train.forward import ForwardOutput, ProbeOutput
from vlrl.train.metrics import LOGS, RunLog

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class ShardingError(VlrlError):
    """A batch that cannot be split over the ranks the way FSDP needs."""


@dataclass(frozen=True)
class Dist:
    """Where this process stands: its rank among ``world`` processes, and its device."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: str = "cpu"
    sharded: bool = False
    """Launched by torchrun: the policy is sharded with FSDP2 (with one rank too), checkpoints are DCP."""

    @property
    def is_main(self) -> bool:
        """Rank 0: the engine, evaluation, logs and checkpoints' metadata live here."""
        return self.rank == 0

    @classmethod
    def single(cls, device: str = "cpu") -> Dist:
        return cls(device=device)


def launched_by_torchrun() -> bool:
    return all(key in os.environ for key in TORCHRUN_ENV)


def init_distributed(device: str) -> Dist:
    """Join torchrun's process group (NCCL for CUDA, gloo for CPU); a plain process without torchrun.

    Under torchrun a CUDA run uses ``cuda:$LOCAL_RANK`` whatever ``model.device`` names (one GPU per process).
    """
    if not launched_by_torchrun():
        return Dist.single(device)
    local = int(os.environ["LOCAL_RANK"])
    if device.startswith("cuda"):
        device = f"cuda:{local}"
        torch.cuda.set_device(local)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    return Dist(rank=dist.get_rank(), world=dist.get_world_size(), local_rank=local, device=device, sharded=True)


_MESH: list[DeviceMesh] = []  # the process's one mesh, made on first use


def device_mesh(d: Dist) -> DeviceMesh:
    """The 1-D mesh over all ranks that FSDP2 shards on (the policy's and the reference's: one per process)."""
    if not _MESH:
        _MESH.append(init_device_mesh("cuda" if d.device.startswith("cuda") else "cpu", (d.world,)))
    return _MESH[0]


def close_distributed(wait_for_peers: bool = False) -> None:
    """Leave the process group, its threads ended here and not at interpreter exit.

    ``destroy_process_group`` drops torch.distributed's references to the group, but a ``DeviceMesh`` keeps its
    groups (``_pg_registry``) and DTensor's caches keep the mesh for the life of the process, so gloo's worker
    threads outlived the call and were torn down in interpreter finalization, where a rank of a run that had
    finished sometimes died of SIGABRT ("terminate called without an active exception"; CI at 92d354c).
    ``wait_for_peers`` (a run every rank finished) puts a barrier first: no rank leaves while a peer still has a
    collective in flight.
    """
    if not dist.is_initialized():
        return
    if wait_for_peers and _active():
        dist.barrier()
    dist.destroy_process_group()
    for mesh in _MESH:  # the mesh is the group's last owner: its destructor joins the threads now
        registry = getattr(mesh, "_pg_registry", None)  # torch 2.13's; a torch without it: left as it is
        if registry is not None:
            registry.clear()
    _MESH.clear()
    gc.collect()


def _active() -> bool:
    return dist.is_initialized() and dist.get_world_size() > 1


def barrier() -> None:
    if _active():
        dist.barrier()


def broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (pickled; trajectories with their pixel tensors)."""
    if not _active():
        return obj
    box = [obj if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_gather(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order."""
    if not _active():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def all_reduce_sum(values: list[float]) -> list[float]:
    if not _active():
        return list(values)
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def all_reduce_sum_(t: torch.Tensor) -> torch.Tensor:
    """``t`` summed over the ranks in place (on its device: a CUDA tensor under NCCL, a CPU one under gloo),
    returned; ``t`` as it is when not distributed."""
    if _active():
        dist.all_reduce(t)
    return t


def global_agg_counts(masks) -> AggCounts:
    """``agg_counts`` over the masks of *every* rank's micro-batches of this optimizer step.

    The trainer divides each micro-batch's loss by these counts; summed over ranks by FSDP2's gradient
    reduction (divide factor 1), the gradient is exactly the global batch's (see vlrl.algos.aggregation).
    """
    local = agg_counts(masks)
    if not _active():
        return local
    tokens, seqs = all_reduce_sum([local.num_tokens, local.num_seqs])
    return AggCounts(int(tokens), int(seqs))


# ---------------------------------------------------------------------- shares of a batch


@dataclass(frozen=True)
class Share:
    """This rank's rows of a global batch: ``rows`` (global indices, padded to ``size``), the first
    ``n_real`` of them its own."""

    rows: tuple[int, ...]
    n_real: int
    start: int

    @property
    def size(self) -> int:
        return len(self.rows)


def share_of(n: int, rank: int, world: int) -> Share:
    """Contiguous, balanced: rank r owns ``n // world`` rows, one more for the first ``n % world`` ranks;
    every share is padded to ``ceil(n / world)`` rows with copies of its last row (of rank 0's when empty)."""
    base, extra = divmod(n, world)
    start = rank * base + min(rank, extra)
    own = list(range(start, start + base + (rank < extra)))
    size = math.ceil(n / world)
    pad = own[-1] if own else 0
    return Share(rows=tuple(own + [pad] * (size - len(own))), n_real=len(own), start=start)


def local_batch(batch: Batch, share: Share) -> Batch:
    """The share's rows of ``batch``; padding rows get an empty loss mask and no engine top-k."""
    local = batch.select(share.rows)
    if share.n_real == share.size:
        return local
    mask = local.loss_mask.clone()
    mask[share.n_real :] = 0
    # The real rows' top-k, from a selection without the copies (which would claim their original's entries);
    # a copy of a real row, the padding never widens the batch.
    real = batch.select(share.rows[: share.n_real]) if share.n_real else None
    return local.replace(loss_mask=mask, engine_topk=None if real is None else real.engine_topk)


def local_rows(inputs: Any, share: Share) -> Any:
    """A frozen dataclass of ``[B, L]`` tensors (``StepInputs``) cut to the share's rows (None stays None)."""
    idx = torch.tensor(share.rows, dtype=torch.long)

    def take(t):
        return t[idx.to(t.device)] if isinstance(t, torch.Tensor) else t

    return dataclasses.replace(inputs, **{f.name: take(getattr(inputs, f.name)) for f in dataclasses.fields(inputs)})


def gather_forward(out: ForwardOutput, share: Share, batch: Batch) -> ForwardOutput:
    """Every rank's logprobs of its own rows, assembled as the global batch's ``ForwardOutput`` on every rank."""
    n = share.n_real
    mine = (
        share.start,
        out.logprobs[:n].cpu(),
        out.computed[:n].cpu(),
        None if out.probe is None else ProbeOutput(*(t.cpu() for t in dataclasses.astuple(out.probe))),
    )
    B, L = batch.input_ids.shape
    device = out.logprobs.device
    logprobs = torch.zeros((B, L), dtype=torch.float32)
    computed = torch.zeros((B, L), dtype=torch.bool)
    probes = []
    for start, lp, comp, probe in all_gather(mine):  # rank order = row order: the probes concatenate
        logprobs[start : start + lp.shape[0], : lp.shape[1]] = lp
        computed[start : start + lp.shape[0], : lp.shape[1]] = comp
        if probe is not None:
            probes.append(probe)
    probe = (
        ProbeOutput(*(torch.cat(parts).to(device) for parts in zip(*map(dataclasses.astuple, probes))))
        if probes
        else None
    )
    return ForwardOutput(
        logprobs=logprobs.to(device),
        entropy=torch.zeros((B, L), device=device),
        computed=computed.to(device),
        probe=probe,
    )


# ---------------------------------------------------------------------- metrics of a distributed update

PER_RANK_MEAN = ("entropy_first_token",)
"""Ratios of per-rank counts the trainer does not return: logged as the mean over ranks (approximate)."""


def reduce_metrics(values: dict[str, float]) -> dict[str, float]:
    """One update's metrics over all ranks. The trainer weighs each token's metric by its share of the
    *global* count (``global_agg_counts``), so the loss and the policy-loss metrics add up across ranks;
    ``grad_norm`` and ``grad_norm/<group>`` are global already (``vlrl.train.trainer.clip_gradients`` sums the
    ranks' squares)."""
    if not _active():
        return dict(values)
    keys = sorted(k for k, v in values.items() if isinstance(v, (int, float)) and not k.startswith("grad_norm"))
    world = dist.get_world_size()
    out = dict(values)
    for k, total in zip(keys, all_reduce_sum([values[k] for k in keys])):
        out[k] = total / world if k in PER_RANK_MEAN else total
    return out


class NullLog(RunLog):
    """The run log of ranks other than 0: the same rows are computed (the loop reads them), nothing is written."""

    def __init__(self, out_dir: Path):  # no directory, no TensorBoard
        self.dir, self.t0, self._tensorboard, self.tb = Path(out_dir), time.time(), False, None

    def append(self, name: str, row: dict) -> None:
        if name not in LOGS:
            raise ValueError(f"{name!r} is not a run log; logs: {LOGS}")

    def write_json(self, name: str, value) -> None:
        pass

    def sizes(self) -> dict[str, int]:
        return {}

    def trim(self, sizes: dict[str, int]) -> None:
        pass

    def reset(self) -> None:
        pass
