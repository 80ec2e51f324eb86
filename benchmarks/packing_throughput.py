"""Train-step throughput with and without sample packing (``optim.packing``); writes one JSON.

    python benchmarks/packing_throughput.py --device cpu --size tiny \
        --out benchmarks/results/packing_cpu_tiny.json
    python benchmarks/packing_throughput.py --device cuda --size 2b --dtype bfloat16 --rows 16 \
        --out benchmarks/results/packing_h100_2b.json

The batch is real and has the length spread of multi-turn rollouts: maze2d/5x5 episodes of the BFS
expert (an image every turn), rendered by vlrl's renderer, with the turn limit cycling over
``--turns`` (so rows of 1 to N turns, shuffled into one batch). One timed step is what the RL update
costs per optimizer step without its loss terms: for every micro-batch of ``--micro-batch`` rows,
``policy_forward`` (chunked fp32 LM head) and the backward of the token-mean cross-entropy; gradients
are zeroed, weights never change, so both modes time the same work. ``decoder_only`` times the vision
tower and decoder alone (forward + backward of the hidden states), the part packing changes: on the
tiny model (hidden size 64, 152k-row LM head) the LM head dominates the step and hides it. Modes are
interleaved step by step. ``tokens_per_s`` counts real tokens (padding excluded) over the median step
time. The same run records the agreement of the packed forward with the padded one (no grad, every
generated token): max and mean |Δ logprob|.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import time
from pathlib import Path

import torch


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arch", default="qwen2_5_vl")
    p.add_argument("--size", default="tiny")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--rows", type=int, default=8, help="trajectories in the batch")
    p.add_argument("--turns", default="1,2,4,8", help="turn limits the rows cycle over (an image each turn)")
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--out", default=None)
    return p.parse_args()


def trajectories(model_dir: Path, rows: int, turn_limits: list[int]) -> list:
    """``rows`` BFS-expert maze episodes, row ``i`` limited to ``turn_limits[i % len]`` turns, shuffled."""
    from vlrl.data.tickets import make_rows, train_seeds
    from vlrl.engines.types import SamplingParams
    from vlrl.models.load import load_processor
    from vlrl.render.embedded import EmbeddedRenderer
    from vlrl.rollout.generator import RolloutConfig, RolloutGenerator
    from vlrl.train.experts import expert_for

    renderer = EmbeddedRenderer.from_pretrained(model_dir)
    tokenizer = load_processor(model_dir).tokenizer
    seeds = train_seeds(rows, 0)
    out = []
    for k, limit in enumerate(turn_limits):
        mine = seeds[k :: len(turn_limits)]
        if not mine:
            continue
        config = RolloutConfig(
            sampling=SamplingParams(max_tokens=16),
            repeats=1,
            max_turns=limit,
            seed=0,
            progress=False,
            max_context=8192,
        )
        gen = RolloutGenerator(renderer, None, config, tokenizer=tokenizer)
        out += gen.run(make_rows("maze2d/5x5", mine, {}), script=expert_for("maze2d"))
    order = torch.randperm(len(out), generator=torch.Generator().manual_seed(0)).tolist()
    return [out[i] for i in order]


def _now(device: str) -> float:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter()


def train_step(model, subs, n_tok: int, packing: bool) -> None:
    """Forward (chunked fp32 LM head) + backward of the token-mean cross-entropy over every micro-batch."""
    from vlrl.train.forward import policy_forward

    for sub in subs:
        out = policy_forward(model, sub.replace(temperature=1.0), with_entropy=False, packing=packing)
        (-(out.logprobs * sub.loss_mask).sum() / n_tok).backward()
    model.zero_grad(set_to_none=True)


def decoder_step(model, subs, n_tok: int, packing: bool) -> None:
    """Vision tower + decoder forward and backward only (the part packing changes; no LM head)."""
    from vlrl.train.forward import decoder_hidden_states
    from vlrl.train.packing import packed_hidden_states

    for sub in subs:
        hidden = (packed_hidden_states if packing else decoder_hidden_states)(model, sub)
        (hidden[sub.attention_mask.bool()].float().square().sum() / n_tok).backward()
    model.zero_grad(set_to_none=True)


def time_modes(model, batch, args, step_fn) -> dict:
    """Median step time of padded and packed, interleaved step by step (a shared machine's load hits both)."""
    subs = batch.split(args.micro_batch)
    n_tok = int(batch.loss_mask.sum())
    times: dict[str, list[float]] = {"padded": [], "packed": []}
    for step in range(args.warmup + args.steps):
        for mode in times:
            if step == args.warmup and args.device.startswith("cuda"):
                torch.cuda.reset_peak_memory_stats()
            t0 = _now(args.device)
            step_fn(model, subs, n_tok, mode == "packed")
            if step >= args.warmup:
                times[mode].append(_now(args.device) - t0)
    tokens = int(batch.seq_lens.sum())
    out = {}
    for mode, ts in times.items():
        median = statistics.median(ts)
        out[mode] = {"step_s_median": median, "step_s": ts, "tokens_per_s": tokens / median}
    out["speedup_tokens_per_s"] = out["packed"]["tokens_per_s"] / out["padded"]["tokens_per_s"]
    return out


def peak_memory(model, batch, args) -> dict | None:
    """Peak CUDA memory of one train step per mode (None on CPU)."""
    if not args.device.startswith("cuda"):
        return None
    subs, n_tok, out = batch.split(args.micro_batch), int(batch.loss_mask.sum()), {}
    for mode in ("padded", "packed"):
        torch.cuda.reset_peak_memory_stats()
        train_step(model, subs, n_tok, mode == "packed")
        out[mode] = torch.cuda.max_memory_allocated() / 2**30
    return out


def agreement(model, batch, args) -> dict:
    """Packed vs padded logprobs of every generated token, no grad, per micro-batch."""
    from vlrl.train.forward import policy_forward

    diffs = []
    with torch.no_grad():
        for sub in batch.split(args.micro_batch):
            a = policy_forward(model, sub, with_entropy=False).logprobs
            b = policy_forward(model, sub, with_entropy=False, packing=True).logprobs
            diffs.append((a - b)[sub.loss_mask.bool()].abs().double().cpu())
    d = torch.cat(diffs)
    return {"n_tokens": int(d.numel()), "max_abs": float(d.max()), "mean_abs": float(d.mean())}


def _cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    text = cpuinfo.read_text() if cpuinfo.exists() else ""
    names = [ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")]
    return names[0] if names else platform.processor() or platform.machine()


def _commit() -> str:
    """The commit measured: ``$VLRL_BENCH_COMMIT`` for an exported copy (no ``.git`` of its own: git would
    describe an enclosing checkout), else this checkout's HEAD (``+dirty`` with uncommitted vlrl/ changes)."""
    import os

    root = Path(__file__).resolve().parents[1]
    if os.environ.get("VLRL_BENCH_COMMIT"):
        return os.environ["VLRL_BENCH_COMMIT"] + " (an exported copy)"
    if not (root / ".git").exists():
        return "unknown (not a git checkout; set VLRL_BENCH_COMMIT)"
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "vlrl"], cwd=root, capture_output=True, text=True)
    return sha + ("+dirty" if dirty.stdout.strip() else "")


def main() -> None:
    import transformers

    from vlrl.models.build import cached_model_dir
    from vlrl.models.load import load_model
    from vlrl.train.batch import CollateSpec, collate

    args = parse()
    torch.manual_seed(0)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    model_dir = cached_model_dir(args.arch, args.size)
    model = load_model(model_dir, dtype=dtype, device=args.device).train()
    limits = [int(x) for x in args.turns.split(",")]
    batch = collate(trajectories(model_dir, args.rows, limits), CollateSpec.from_model(model)).to(args.device)
    lens = batch.seq_lens.tolist()
    result = {
        "benchmark": "packing_throughput",
        "commit": _commit(),
        "device": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else _cpu_name(),
        "device_kind": args.device,
        "cpu_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "arch": args.arch,
        "size": args.size,
        "dtype": args.dtype,
        "rows": args.rows,
        "turn_limits": limits,
        "micro_batch": args.micro_batch,
        "steps": args.steps,
        "warmup": args.warmup,
        "seq_lens": lens,
        "images": int(batch.image_counts.sum()),
        "tokens": sum(lens),
        "generated_tokens": int(batch.loss_mask.sum()),
        "decoder_token_slots": {
            "padded": sum(sub.input_ids.numel() for sub in batch.split(args.micro_batch)),
            "packed": sum(lens),
        },
        "train_step": time_modes(model, batch, args, train_step),
        "decoder_only": time_modes(model, batch, args, decoder_step),
        "peak_mem_gib": peak_memory(model, batch, args),
        "agreement_packed_vs_padded": agreement(model, batch, args),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
