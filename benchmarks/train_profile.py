"""Where ``vlrl bench``'s train step spends its time: the logprob pass and the update under ``torch.profiler``.

    python benchmarks/train_profile.py OUT.json --size 2b --device cuda --dtype bfloat16 [--variants fused,eager]

The batch is the bench's (vlrl.bench.training: the embedded engine's maze2d rollout, 8 episodes x 16 turns) and the
step is the bench's (``Trainer.logprobs`` then ``Trainer.sft_step``, micro-batch 4). Variants, in one process on
one model: ``fused`` (RMSNorm / SwiGLU / rotary compiled, ``model.kernels = "fused"``, ``vlrl.models.fused``),
``eager`` (transformers' own: the default), both with the LM head of a half-precision model as one fp32-output GEMM,
and ``upcast`` (eager, and the head's weight and hidden states cast to fp32 and multiplied there). Each: wall,
device-busy seconds, top ops by host and device time (vlrl.bench.profiling), and the update's MFU by the bench's
formula. The weights change with every update; the variants' timings do not depend on their values. The JSON is
written after each variant, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

VARIANTS = ("fused", "eager", "upcast")


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--variants", default="fused,eager")
    args = ap.parse_args()
    args.variants = args.variants.split(",")
    if unknown := set(args.variants) - set(VARIANTS):
        raise SystemExit(f"train_profile: unknown variants {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    return args


def setup(args: argparse.Namespace) -> tuple[Any, Any, dict]:
    """``(trainer, batch, description)``: the bench's trainer and rollout batch, and what the JSON says of them."""
    import torch

    from vlrl.algos.config import AlgoConfig
    from vlrl.bench import env
    from vlrl.bench.flops import FORMULA, peak_flops, train_flops
    from vlrl.bench.multiturn import rollout_turns
    from vlrl.bench.run import BenchConfig, load
    from vlrl.bench.training import _params
    from vlrl.engines.embedded import EmbeddedEngine
    from vlrl.train.batch import CollateSpec, collate
    from vlrl.train.config import OptimSection
    from vlrl.train.trainer import Trainer

    config = BenchConfig(size=args.size, device=args.device, dtype=args.dtype)
    _, model, renderer = load(config)
    engine = EmbeddedEngine(model, renderer.tokenizer, max_batch=config.episodes)
    _, trajectories = rollout_turns(
        renderer, engine, episodes=config.episodes, turns=config.turns, max_tokens=config.turn_tokens
    )
    trainer = Trainer(model, AlgoConfig(), OptimSection(micro_batch_size=args.micro_batch), lr=1e-6)
    batch = collate(list(trajectories), CollateSpec.from_model(model)).to(trainer.device)
    tokens = int(batch.seq_lens.sum())
    patches = 0 if batch.pixel_values is None else int(batch.pixel_values.shape[0])
    n_lm, n_vis = _params(model)
    model.train()
    return (
        trainer,
        batch,
        {
            "benchmark": "train_profile",
            "config": vars(args),
            "device_name": env.device_name(args.device),
            "git": env.git_commit(),
            "torch": torch.__version__,
            "rows": batch.size,
            "tokens": tokens,
            "scored_tokens": int(batch.loss_mask.sum()),
            "patches": patches,
            "formula": FORMULA,
            "train_flops": train_flops(n_lm, tokens, n_vis, patches),
            "peak_flops": peak_flops(env.device_name(args.device), args.dtype),
        },
    )


@contextlib.contextmanager
def applied(variant: str, model) -> Iterator[None]:
    """``model`` with the kernels and LM head ``variant`` says, the head restored after."""
    from vlrl.engines import sampling
    from vlrl.models import fused

    half = sampling.HALF
    sampling.HALF = () if variant == "upcast" else half  # fp32_head reads it at every call
    (fused.install if variant == "fused" else fused.uninstall)(model)
    try:
        yield
    finally:
        sampling.HALF = half


def profile_variant(variant: str, trainer, batch, device: str) -> dict:
    """The logprob pass and the update under the profiler, with the kernels and LM head ``variant`` says."""
    from vlrl.bench.profiling import profiled

    with applied(variant, trainer.model):
        return {
            "logprobs": profiled(lambda: trainer.logprobs(batch), device),
            "update": profiled(lambda: trainer.sft_step(batch), device),
        }


def agreement(variants: list[str], trainer, batch) -> dict:
    """Each variant's logprobs of the batch's scored tokens against the first variant's, before any update:
    ``{variant: {max_abs, mean_abs}}`` (fp32 nats)."""
    import torch

    lps = {}
    for variant in variants:
        with applied(variant, trainer.model), torch.no_grad():
            out = trainer.logprobs(batch)
        lps[variant] = out.logprobs[out.computed]
    first = lps[variants[0]]
    return {
        v: {"max_abs": float((x - first).abs().max()), "mean_abs": float((x - first).abs().mean())}
        for v, x in lps.items()
    }


def main() -> None:
    args = parse()
    trainer, batch, out = setup(args)
    started, path = time.time(), Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    out["agreement_vs_first_variant"] = agreement(args.variants, trainer, batch)
    print("agreement", out["agreement_vs_first_variant"])
    for variant in args.variants:
        row = profile_variant(variant, trainer, batch, args.device)
        peak = out["peak_flops"]
        row["update_mfu"] = round(out["train_flops"] / row["update"]["seconds"] / peak, 4) if peak else None
        out[variant] = row
        out["wall_seconds"] = round(time.time() - started, 1)
        path.write_text(json.dumps(out, indent=1) + "\n")
        timed = {k: v for k, v in row.items() if isinstance(v, dict)}
        print(variant, {k: (v["seconds"], v["device_busy_seconds"], v["host_syncs"]) for k, v in timed.items()})
        print("   MFU of the update", row["update_mfu"])
        for r in row["update"]["by_device"][:10]:
            print("   dev ", r)


if __name__ == "__main__":
    main()
