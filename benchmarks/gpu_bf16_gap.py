"""Which side is wrong when bf16 rollout and trainer logprobs disagree? (writes JSON)

    python benchmarks/gpu_bf16_gap.py --size 2b --out gap.json

The engine (KV-cache decode, left-padded batch) generates in bf16; the trainer (one right-padded
forward) re-scores in bf16; an fp32 copy of the same weights re-scores as the reference (TF32 off).
Each side's distance to the reference says which one drifts; run twice — the LM head in bf16 (as
transformers computes ``.logits``) and in fp32 (``vlrl.engines.sampling.fp32_logits``, vlrl's contract)
— to measure what the head's output rounding contributes.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def stats(a, b, mask) -> dict:
    d = (a - b)[mask.bool()].abs()
    return {
        "n": int(d.numel()),
        "mean_abs": float(d.mean()),
        "max_abs": float(d.max()),
        "p99_abs": float(d.quantile(0.99)),
    }


def measure(size: str, head: str, device: str) -> dict:
    import torch

    import vlrl.engines.embedded as embedded
    import vlrl.train.forward as forward
    from vlrl.engines.sampling import fp32_logits

    sys.path.insert(0, str(ROOT / "tests" / "train"))
    import traj_helpers as H

    from vlrl.engines.embedded import EmbeddedEngine
    from vlrl.engines.types import SamplingParams
    from vlrl.models.build import cached_model_dir
    from vlrl.models.load import load_model, load_processor
    from vlrl.render.embedded import EmbeddedRenderer
    from vlrl.train.batch import CollateSpec, collate
    from vlrl.train.forward import policy_forward

    project = fp32_logits if head == "fp32" else (lambda lm_head, h: lm_head(h).float())
    embedded.fp32_logits = forward.fp32_logits = project
    torch.backends.cuda.matmul.allow_tf32 = False
    path = cached_model_dir("qwen2_5_vl", size)
    model = load_model(path, dtype=torch.bfloat16, device=device)
    renderer = EmbeddedRenderer.from_pretrained(path)
    engine = EmbeddedEngine(model, load_processor(path).tokenizer)
    prompts = [renderer.render(c) for seed in range(4) for c in H.conversations(seed).values()]
    gens = engine.generate(
        prompts, [SamplingParams(temperature=1.0, max_tokens=32, seed=i, ignore_eos=True) for i in range(len(prompts))]
    )
    batch = collate(
        [H.trajectory(f"t{i}", p, g, 1.0) for i, (p, g) in enumerate(zip(prompts, gens))], CollateSpec.from_model(model)
    ).to(device)
    with torch.no_grad():
        trainer = policy_forward(model, batch, with_entropy=False).logprobs
        ref_model = copy.deepcopy(model).float()
        embedded.fp32_logits = forward.fp32_logits = fp32_logits
        reference = policy_forward(ref_model, batch, with_entropy=False).logprobs
    del ref_model
    mask, rollout = batch.loss_mask, batch.rollout_logprobs.to(device)
    return {
        "size": size,
        "head": head,
        "engine_vs_trainer": stats(rollout, trainer, mask),
        "engine_vs_fp32_reference": stats(rollout, reference, mask),
        "trainer_vs_fp32_reference": stats(trainer, reference, mask),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="2b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rows = []
    for head in ("bf16", "fp32"):
        rows.append(measure(args.size, head, args.device))
        print(json.dumps(rows[-1]), flush=True)
    import torch

    env = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "torch": torch.__version__}
    Path(args.out).write_text(json.dumps({"env": env, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
