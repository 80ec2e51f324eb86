"""GPU correctness measurements behind vlrl.models.attention and vlrl.checks.bounds (writes JSON).

    python benchmarks/gpu_correctness.py kernel --out k.json       # SDPA vs math backend, stride-0 vs contiguous k/v
    python benchmarks/gpu_correctness.py invariance --out i.json   # batch invariance: sdpa / vlrl_sdpa × dtype × kv
    python benchmarks/gpu_correctness.py old --old-tree .old5bd --out o.json   # the literal 5bd18d2 engine

``old`` imports vlrl from ``--old-tree`` (``git archive 5bd18d2 vlrl | tar -x -C .old5bd``) and only the
check modules from this tree, so the engine under test is exactly the one of that commit (its queue
batching bypassed: its own ``decode_batch`` runs each arrangement as one batch).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEVICE = "cuda"  # --device cpu: a smoke run of invariance / old on a machine without CUDA
LENGTHS = (33, 97, 1024, 1025, 1408, 1409, 1410, 1441, 1710, 1857, 2048, 2049)
# Prompt (tokens, images) sets: the widest is ≡ 1 mod 64 (the bug's widths) except in the control set.
PROMPT_SETS = {
    "w1409": [(1409, 2), (1000, 1), (640, 0), (300, 3)],
    "w1025": [(1025, 1), (700, 2), (90, 0)],
    "w1857": [(1857, 3), (1200, 0), (500, 1)],
    "w1710_control": [(1710, 2), (1100, 1), (400, 0)],
}


def kernel_table() -> list[dict]:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        for n in LENGTHS:
            g = torch.Generator(device="cuda").manual_seed(n)
            q = torch.randn(8, 2, n, 32, device="cuda", generator=g, dtype=dtype)
            kv = torch.randn(2, 8, 1, n, 32, device="cuda", generator=g, dtype=dtype)
            mask = torch.ones(8, 1, n, n, dtype=torch.bool, device="cuda").tril()
            mask[:, :, :, :7] = False
            mask[:, :, :7, 0] = True
            with sdpa_kernel(SDPBackend.MATH):
                ref = torch.nn.functional.scaled_dot_product_attention(
                    q.float(), *(t.expand(8, 2, n, 32).float().contiguous() for t in kv), attn_mask=mask
                )
            for layout in ("stride0", "contiguous"):
                k, v = (t.expand(8, 2, n, 32) for t in kv)
                if layout == "contiguous":
                    k, v = k.contiguous(), v.contiguous()
                with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
                    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                err = (out.float() - ref)[:, :, 7:].abs()
                rows.append(
                    {
                        "dtype": str(dtype).replace("torch.", ""),
                        "key_length": n,
                        "layout": layout,
                        "max_abs": float(err.max()),
                        "last_row_max_abs": float(err[:, :, -1].max()),
                        "other_rows_max_abs": float(err[:, :, :-1].max()),
                    }
                )
    return rows


def invariance_table(stack, prompt_of_length, check) -> list[dict]:
    rows = []
    for attention in ("sdpa", "vlrl_sdpa"):
        for size in ("tiny", "tiny_kv2"):
            for dtype in ("float32", "bfloat16"):
                renderer, engine = stack(size, dtype, DEVICE, attention)
                rows += [
                    _one(
                        check,
                        engine,
                        renderer,
                        prompt_of_length,
                        name,
                        specs,
                        {"attention": attention, "size": size, "dtype": dtype},
                    )
                    for name, specs in PROMPT_SETS.items()
                ]
    return rows


def _one(check, engine, renderer, prompt_of_length, name, specs, meta) -> dict:
    prompts = [prompt_of_length(renderer, n, k, seed=i) for i, (n, k) in enumerate(specs)]
    arrangements = [list(range(len(prompts))), list(reversed(range(len(prompts))))]
    arrangements += [[0, j] for j in range(1, len(prompts))]
    t0 = time.time()
    report = check(engine, prompts, arrangements=arrangements, dtype=meta["dtype"], max_tokens=6)
    row = {
        **meta,
        "prompts": name,
        "lengths": [len(p) for p in prompts],
        **report.row(),
        "seconds": round(time.time() - t0, 2),
    }
    print(
        json.dumps(
            {
                k: row[k]
                for k in (
                    "attention",
                    "size",
                    "dtype",
                    "prompts",
                    "max_abs",
                    "mean_abs",
                    "first_token_max_abs",
                    "passed",
                )
            }
        ),
        flush=True,
    )
    return row


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def old_engine_table(old_tree: Path) -> list[dict]:
    """The batch-invariance check against 5bd18d2's engine (vlrl imported from ``old_tree``)."""
    import torch

    sys.path.insert(0, str(old_tree.resolve()))
    sys.path.insert(1, str(ROOT / "tests" / "checks"))
    import vlrl  # the old tree's

    assert str(old_tree.resolve()) in vlrl.__file__, vlrl.__file__
    _load("vlrl.checks.bounds", ROOT / "vlrl/checks/bounds.py")
    check = _load("vlrl.checks.batch_invariance", ROOT / "vlrl/checks/batch_invariance.py").check_batch_invariance
    from invariance_cases import prompt_of_length

    from vlrl.engines.decode import Request, decode_batch  # 5bd18d2's
    from vlrl.engines.embedded import EmbeddedEngine
    from vlrl.models.build import default_cache_root
    from vlrl.render.embedded import EmbeddedRenderer

    class OneBatch:  # each generate call decoded as exactly one batch by the old decode_batch
        def __init__(self, engine):
            self.engine = engine

        def generate(self, prompts, params):
            reqs = [Request(prompt=p, params=sp, max_new=sp.max_tokens) for p, sp in zip(prompts, params)]
            return decode_batch(self.engine, reqs)

    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []
    for size in ("tiny", "tiny_kv2"):
        for dtype in ("float32", "bfloat16"):
            path = default_cache_root() / "models" / f"qwen2_5_vl-{size}-seed0"  # built by `invariance` (tiny_kv2
            assert path.exists(), path  # is not a 5bd18d2 size)
            engine = EmbeddedEngine.from_pretrained(path, device=DEVICE, dtype=getattr(torch, dtype))
            renderer = EmbeddedRenderer.from_pretrained(path)
            rows += [
                _one(
                    check,
                    OneBatch(engine),
                    renderer,
                    prompt_of_length,
                    name,
                    specs,
                    {"attention": "5bd18d2 engine", "size": size, "dtype": dtype},
                )
                for name, specs in PROMPT_SETS.items()
            ]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["kernel", "invariance", "old"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--old-tree", type=Path)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--sets", nargs="*", help="prompt sets to run (default all)")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    for name in set(PROMPT_SETS) - set(args.sets or PROMPT_SETS):
        del PROMPT_SETS[name]
    if args.what == "old":
        rows = old_engine_table(args.old_tree)
    elif args.what == "kernel":
        rows = kernel_table()
    else:
        sys.path.insert(0, str(ROOT / "tests" / "checks"))
        from invariance_cases import prompt_of_length, stack

        from vlrl.checks.batch_invariance import check_batch_invariance

        rows = invariance_table(stack, prompt_of_length, check_batch_invariance)
    import torch

    env = {
        "device": torch.cuda.get_device_name() if DEVICE == "cuda" else platform.processor(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    Path(args.out).write_text(json.dumps({"what": args.what, "env": env, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
