"""FSDP2 training throughput and peak memory per rank, for N ranks in one call; writes one JSON.

    python benchmarks/fsdp_throughput.py --nproc 1 --size 2b --device cuda --dtype bfloat16 --plain \
        --out benchmarks/results/fsdp_h100/n1.json        # one H100: FSDP2 on 1 rank vs the plain trainer
    ... --plain --rounds 3      # FSDP and plain launched 3 times each, alternating: the ratio within one command
    NCCL_NVLS_ENABLE=0 python benchmarks/fsdp_throughput.py --nproc 2 --size 2b --device cuda --dtype bfloat16 \
        --out benchmarks/results/fsdp_h200x2/n2.json
    python benchmarks/fsdp_throughput.py --nproc 2 --size tiny --device cpu --steps 2   # CPU / gloo smoke run
    ... --nproc 2 --compare-one-rank     # also 1 rank on the same rows per rank (speed-up) and on the same data

The batch is real: maze2d/5x5 episodes of the BFS expert (``--turns`` turns, an image every turn), rendered
by vlrl's renderer, ``--rows`` of them per rank (weak scaling: N ranks train N times the rows), the same
trajectories in every run. One step is what a training step costs the trainer: the logprob forward of the
rank's rows (no grad), then one update over them (forward, backward, optimizer step: ``Trainer.sft_step``,
the RL update's cost without its loss terms), then the weight sync's gather of the full state to rank 0
(``Run.engine_weights``: what the engine is sent). Timed after ``--warmup`` steps; ``tokens_per_s`` counts
every token of every rank's rows (prompt and reply). Peak memory is ``torch.cuda.max_memory_allocated`` per
rank over the timed steps. ``--plain`` also runs the plain one-process trainer (no FSDP, weights in
``--dtype``) on one rank's rows, and reports FSDP's time over plain's. ``--compare-one-rank`` runs FSDP on one
rank twice more in the same call: on one rank's rows (``speedup_vs_one_rank``: N ranks' tokens/s over one
rank's, weak scaling; one rank sums its micro-batches' gradients in the compute dtype, N ranks reduce in fp32:
``vlrl.train.fsdp``) and on all N ranks' rows (the same data: every step's loss, summed over ranks, against
N ranks' — ``loss_max_abs_diff_first3``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch_profiles import profiled  # this script's folder is on sys.path[0]


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument("--arch", default="qwen2_5_vl")
    p.add_argument("--size", default="2b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    p.add_argument("--rows", type=int, default=8, help="trajectories per rank")
    p.add_argument("--turns", type=int, default=8, help="maze turns per trajectory (an image each)")
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--plain", action="store_true", help="also time the plain one-process trainer")
    p.add_argument(
        "--rounds", type=int, default=1, help="with --plain: FSDP and plain launched this many times, alternating"
    )
    p.add_argument(
        "--compare-one-rank",
        nargs="?",
        const="both",
        choices=("both", "same-data"),
        help="also run 1 rank: on one rank's rows (speed-up) and on all ranks' rows (losses); same-data: the latter",
    )
    p.add_argument("--group-fraction", type=float, default=None, help="FSDP group size (0: a group per block)")
    p.add_argument("--profile", action="store_true", help="profile a logprob pass and an update more")
    p.add_argument("--out", default=None)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # a rank's JSON path (internal)
    p.add_argument("--mode", default="fsdp", choices=("fsdp", "plain"), help=argparse.SUPPRESS)
    return p.parse_args()


def trajectories(args, model_dir: Path, n: int) -> list:
    """``n`` maze episodes of the BFS expert, the same on every rank and in every run."""
    from vlrl.data.tickets import make_rows, train_seeds
    from vlrl.engines.types import SamplingParams
    from vlrl.models.load import load_processor
    from vlrl.render.embedded import EmbeddedRenderer
    from vlrl.rollout.generator import RolloutConfig, RolloutGenerator
    from vlrl.train.experts import expert_for

    renderer = EmbeddedRenderer.from_pretrained(model_dir)
    config = RolloutConfig(
        sampling=SamplingParams(max_tokens=16),
        repeats=1,
        max_turns=args.turns,
        seed=0,
        progress=False,
        max_context=8192,
    )
    rows = make_rows("maze2d/5x5", train_seeds(n, 0), {})
    gen = RolloutGenerator(renderer, None, config, tokenizer=load_processor(model_dir).tokenizer)
    return gen.run(rows, script=expert_for("maze2d"))


def build(args, d, dtype: torch.dtype, reduce_dtype: torch.dtype | None = None):
    """This rank's model (sharded under torchrun: fp32 masters rounded to ``dtype``, as the plain run's start)
    and its trainer; the checkpoint's directory. ``reduce_dtype``: FSDP2's (None: ``shard_model``'s default)."""
    from vlrl.algos.config import AlgoConfig
    from vlrl.models.build import cached_model_dir
    from vlrl.models.load import load_model
    from vlrl.train.config import OptimSection
    from vlrl.train.fsdp import GROUP_FRACTION, shard_model
    from vlrl.train.master import round_masters_
    from vlrl.train.trainer import Trainer

    model_dir = cached_model_dir(args.arch, args.size)
    model = load_model(model_dir, dtype=torch.float32 if d.sharded else dtype, device=d.device)
    if d.sharded:
        fraction = GROUP_FRACTION if args.group_fraction is None else args.group_fraction
        shard_model(round_masters_(model, dtype), d, dtype, fraction, reduce_dtype)
    model.train()
    trainer = Trainer(model, AlgoConfig(), OptimSection(micro_batch_size=args.micro_batch), lr=1e-5)
    return model, trainer, model_dir


def worker(args) -> None:
    """One rank (or the plain process): build, shard, time, write this rank's JSON to ``args.worker``."""
    from vlrl.train import distributed as D
    from vlrl.train.batch import CollateSpec, collate
    from vlrl.train.fsdp import full_weights

    d = D.init_distributed(args.device) if args.mode == "fsdp" else D.Dist.single(args.device)
    dtype = getattr(torch, args.dtype)
    if d.device.startswith("cuda") and dtype == torch.float32:  # fp32 means fp32, as in vlrl.train.run
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    model, trainer, model_dir = build(args, d, dtype)
    trajs = trajectories(args, model_dir, args.rows * d.world)
    batch = collate(trajs, CollateSpec.from_model(model))
    local = D.local_batch(batch, D.share_of(batch.size, d.rank, d.world))
    times: dict[str, list[float]] = {"logprobs_s": [], "update_s": [], "sync_gather_s": [], "step_s": []}
    losses = []  # every step's loss over the global batch (the ranks' shares summed), warm-up included
    before = full_weights(model, d, dtype)  # the first update's size per module group (plain vs FSDP: same?)
    before = None if before is None else {n: t.detach().clone() for n, t in before.items()}
    first: dict = {}
    profile: dict = {}
    for step in range(args.warmup + args.steps):
        if step == args.warmup and d.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
            counts = _alloc_counts()
        took, metrics, after = timed_step(model, trainer, local, d, dtype)
        losses.append(D.all_reduce_sum([metrics["loss"]])[0])
        if step == 0:
            first = {"metrics": metrics, "update": update_by_group(before, after)}
            before = None
        after = None  # the engine copies what it is sent; a kept copy would count in the next step's peak
        if step >= args.warmup:
            for key, value in took.items():
                times[key].append(value)
    peak = torch.cuda.max_memory_allocated() / 2**30 if d.device.startswith("cuda") else None
    allocator = _allocator_since(counts) if d.device.startswith("cuda") else None
    if args.profile:  # one more update, after the timed ones (the profiler's overhead stays out of them)
        profile = {
            "logprobs": profiled(lambda: trainer.logprobs(local), d)[1],
            "update": profiled(lambda: trainer.sft_step(local), d)[1],
        }
    tokens = int(batch.seq_lens.sum())  # every rank's rows: the global batch
    result = {
        "rank": d.rank,
        "mode": args.mode,
        "world": d.world,
        "peak_mem_gib": peak,
        "allocator": allocator,
        "tokens_per_step": tokens,
        "rows_per_step": batch.size,
        "losses": losses,
        "first_step": first,
        "profile": profile if args.profile else None,
        **{k: v for k, v in times.items()},
        **{f"{k}_median": statistics.median(v) for k, v in times.items()},
    }
    Path(args.worker).write_text(json.dumps(result))
    if d.sharded:
        D.close_distributed()


def timed_step(model, trainer, local, d, dtype: torch.dtype) -> tuple[dict[str, float], dict, dict | None]:
    """One training step's parts, timed (``logprobs_s``, ``update_s``, ``sync_gather_s``, ``step_s``); the
    update's metrics; the gathered weights (rank 0's)."""
    from vlrl.train.fsdp import full_weights

    t = [_now(d)]
    trainer.logprobs(local)
    t.append(_now(d))
    metrics = trainer.sft_step(local)
    t.append(_now(d))
    after = full_weights(model, d, dtype)
    t.append(_now(d))
    took = {k: b - a for k, (a, b) in zip(("logprobs_s", "update_s", "sync_gather_s"), itertools.pairwise(t))}
    return took | {"step_s": t[-1] - t[0]}, metrics, after


def _allocator_since(counts: dict[str, int]) -> dict:
    """The caching allocator over the timed steps: retries (a failed allocation that freed the cache) and device
    mallocs / frees mean it ran out of cached blocks; the peak reserved shows how close to the device it got."""
    return {k: v - counts[k] for k, v in _alloc_counts().items()} | {
        "reserved_peak_gib": torch.cuda.max_memory_reserved() / 2**30
    }


def _alloc_counts() -> dict[str, int]:
    stats = torch.cuda.memory_stats()
    return {k: int(stats.get(k, 0)) for k in ("num_alloc_retries", "num_device_alloc", "num_device_free")}


def update_by_group(before: dict | None, after: dict | None) -> dict:
    """Per module group (the LM head on its own): the first update's norm and the fraction of the weights the
    compute copy saw change. Rank 0 only (``{}`` elsewhere)."""
    from vlrl.train.trainer import param_group

    if before is None or after is None:
        return {}
    out: dict[str, dict[str, float]] = {}
    for name, b in before.items():
        group = "lm_head" if name.startswith("lm_head") else param_group(name)
        delta = after[name].float() - b.float()
        g = out.setdefault(group, {"norm_sq": 0.0, "changed": 0.0, "numel": 0.0})
        g["norm_sq"] += float(delta.pow(2).sum())
        g["changed"] += float((delta != 0).sum())
        g["numel"] += delta.numel()
    return {k: {"update_norm": v["norm_sq"] ** 0.5, "changed_frac": v["changed"] / v["numel"]} for k, v in out.items()}


def _now(d) -> float:
    """A timestamp after the device's queued work, on every rank at once."""
    from vlrl.train.distributed import barrier

    if d.device.startswith("cuda"):
        torch.cuda.synchronize()
    barrier()
    return time.perf_counter()


def launch(args, mode: str, nproc: int, tmp: Path) -> list[dict]:
    """Run the workers (torchrun for FSDP, one plain process otherwise) and read their JSON, by rank."""
    script = str(Path(__file__).resolve())
    common = [
        f"--arch={args.arch}",
        f"--size={args.size}",
        f"--device={args.device}",
        f"--dtype={args.dtype}",
        f"--rows={args.rows}",
        f"--turns={args.turns}",
        f"--micro-batch={args.micro_batch}",
        f"--steps={args.steps}",
        f"--warmup={args.warmup}",
        f"--mode={mode}",
        *(["--profile"] if args.profile else []),
        *([f"--group-fraction={args.group_fraction}"] if args.group_fraction is not None else []),
    ]
    from vlrl.models.build import cached_model_dir

    cached_model_dir(args.arch, args.size)  # built once, here: not by every rank at once on a fresh cache
    if mode == "fsdp":
        argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            script,
            *common,
            f"--worker={tmp}/{mode}_rank%d.json",
        ]
    else:
        argv = [sys.executable, script, *common, f"--worker={tmp}/{mode}_rank%d.json"]
    subprocess.run(argv, check=True)
    return [json.loads(p.read_text()) for p in sorted(tmp.glob(f"{mode}_rank*.json"))]


def _fresh(tmp: str, name: str) -> Path:
    (Path(tmp) / name).mkdir()
    return Path(tmp) / name


def compare_one_rank(args, n_ranks: dict, tmp: str) -> dict:
    """FSDP on one rank, on one rank's rows (weak-scaling baseline) and on all N ranks' rows (same data)."""
    same_rows = argparse.Namespace(**{**vars(args), "rows": args.rows * args.nproc})
    out: dict = {}
    if args.compare_one_rank == "both":
        out["one_rank"] = one = summary(launch(args, "fsdp", 1, _fresh(tmp, "one_rank")))
        out["speedup_vs_one_rank"] = n_ranks["tokens_per_s"] / one["tokens_per_s"]
    same = summary(launch(same_rows, "fsdp", 1, _fresh(tmp, "one_rank_same_data")))
    a, b = n_ranks["ranks"][0]["losses"], same["ranks"][0]["losses"]
    return {
        **out,
        "one_rank_same_data": same,
        "losses_n_ranks": a,
        "losses_one_rank_same_data": b,
        "loss_max_abs_diff_first3": max(abs(x - y) for x, y in zip(a[:3], b[:3], strict=True)),
    }


def summary(ranks: list[dict]) -> dict:
    step = max(r["step_s_median"] for r in ranks)  # the slowest rank sets the pace
    tokens = ranks[0]["tokens_per_step"]
    return {
        "world": ranks[0]["world"],
        "rows_per_step": ranks[0]["rows_per_step"],
        "tokens_per_step": tokens,
        "step_s_median": step,
        "tokens_per_s": tokens / step,
        "logprobs_s_median": max(r["logprobs_s_median"] for r in ranks),
        "update_s_median": max(r["update_s_median"] for r in ranks),
        "sync_gather_s_median": max(r["sync_gather_s_median"] for r in ranks),
        "peak_mem_gib_per_rank": [r["peak_mem_gib"] for r in ranks],
        "ranks": ranks,
    }


def main() -> None:
    args = parse()
    if args.worker is not None:
        args.worker = args.worker.replace("%d", os.environ.get("RANK", "0"))
        worker(args)
        return
    result = {
        "benchmark": "fsdp_throughput",
        "arch": args.arch,
        "size": args.size,
        "dtype": args.dtype,
        "device": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else platform.processor(),
        "torch": torch.__version__,
        "rows_per_rank": args.rows,
        "turns": args.turns,
        "micro_batch": args.micro_batch,
        "steps": args.steps,
        "warmup": args.warmup,
        "group_fraction": args.group_fraction,
    }
    with tempfile.TemporaryDirectory() as tmp:
        if args.plain and args.rounds > 1:
            result.update(paired_rounds(args, tmp, result))
        else:
            result["fsdp"] = summary(launch(args, "fsdp", args.nproc, _fresh(tmp, "fsdp")))
            write(result, args.out)  # after each part: a run stopped by its clock keeps what it measured
        if args.plain and args.rounds <= 1:
            result["plain"] = summary(launch(args, "plain", 1, _fresh(tmp, "plain")))
            result["fsdp_over_plain_step_time"] = (
                (result["fsdp"]["step_s_median"] / result["plain"]["step_s_median"]) if args.nproc == 1 else None
            )
            write(result, args.out)
        if args.compare_one_rank:
            result.update(compare_one_rank(args, result["fsdp"], tmp))
    print(write(result, args.out))


def paired_rounds(args, tmp: str, result: dict) -> dict:
    """FSDP and plain launched ``args.rounds`` times each, alternating which goes first: the step times of one
    process drift with its host (benchmarks/fsdp_vs_plain.py interleaves the two in one process instead). ``fsdp`` /
    ``plain``: the first launch of each (the single-round shape); ``rounds``:
    each round's medians and ratio; ``fsdp_over_plain_step_time``: the median of every timed FSDP step over the
    median of every timed plain step."""
    rounds: list[dict] = []
    steps: dict[str, list[float]] = {"fsdp": [], "plain": []}
    for r in range(args.rounds):
        order = ("fsdp", "plain") if r % 2 == 0 else ("plain", "fsdp")
        this: dict = {"order": list(order)}
        for mode in order:
            s = summary(launch(args, mode, args.nproc if mode == "fsdp" else 1, _fresh(tmp, f"{mode}_{r}")))
            result.setdefault(mode, s)
            steps[mode] += s["ranks"][0]["step_s"]
            this[mode] = {k: s[k] for k in ("step_s_median", "logprobs_s_median", "update_s_median")}
            this[f"{mode}_step_s"] = s["ranks"][0]["step_s"]
        this["fsdp_over_plain_step_time"] = this["fsdp"]["step_s_median"] / this["plain"]["step_s_median"]
        rounds.append(this)
        ratio = statistics.median(steps["fsdp"]) / statistics.median(steps["plain"])
        write({**result, "rounds": rounds, "fsdp_over_plain_step_time": ratio}, args.out)  # each round kept
    return {"rounds": rounds, "fsdp_over_plain_step_time": ratio}


def write(result: dict, out: str | None) -> str:
    text = json.dumps(result, indent=2)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text + "\n")
    return text


if __name__ == "__main__":
    main()
