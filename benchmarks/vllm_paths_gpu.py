"""vLLM section of ``vlrl bench`` alone (raw vLLM chat completions vs vlrl's render + token route), for a device
command too short for the whole bench: ``python benchmarks/vllm_paths_gpu.py OUT.json [batch sizes...]``."""

import json
import sys
import time

from vlrl.bench.vllm_paths import vllm_section
from vlrl.models.build import cached_model_dir

t0 = time.perf_counter()
sizes = [int(x) for x in sys.argv[2:]] or [64, 256]
section, stack = vllm_section(cached_model_dir("qwen2_5_vl", "2b"), sizes, max_tokens=64, repeats=1, turns=16)
stack.close()
section["wall_seconds"] = round(time.perf_counter() - t0, 1)
open(sys.argv[1], "w").write(json.dumps(section, indent=2))
print(json.dumps(section, indent=1)[:3000])
