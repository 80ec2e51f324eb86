"""Each sampled token's logprob kept inside vLLM's worker, off vLLM's per-request transport.

Why: asked for logprobs (``logprobs=0``), vLLM carries every request's as a ``LogprobsLists`` of three small numpy
arrays of its own on every step — sliced per request by the scheduler, encoded array by array by the engine
core, decoded again by the front end. On an H200 that took the engine core's step from 9.7 to 14.2 ms at 256
requests (``benchmarks/results/vllm_gpu_h100/inprocess/NOTE.md``, session 51; the transport alone:
``benchmarks/vllm_logprob_wire.py``).

How: the worker's sampler is asked for the logprobs it computes anyway when a request wants them
(``max_num_logprobs=0``: the sampled token's, after the processors and temperature as ``processed_logprobs``
reports them) and returns its output without them, so nothing goes per request through the scheduler. Each step
keeps one host copy of the batch's values (copied without a host sync), the rows' request ids and which rows'
samples vLLM discards (a partial prefill's). :meth:`SampledLogprobs.take` hands a finished request's values in
sampling order, cut by the caller to the tokens vLLM returned (a request scheduled one step past its end, as
vLLM's asynchronous scheduling does, samples once more).

Runs inside vLLM's worker (:class:`vlrl.vllm.worker.VlrlWorkerExtension`), torch and vLLM's model runner at hand.
"""

from __future__ import annotations

import dataclasses
from typing import Any

MAX_KEPT_REQUESTS = 65536
"""Requests whose values wait to be taken; past it the oldest half is dropped (requests never taken: aborted)."""


class SampledLogprobs:
    """The sampled tokens' logprobs of every request the worker's sampler serves, by vLLM's request id."""

    def __init__(self, runner: Any):
        if not hasattr(runner, "sampler") or not hasattr(runner, "discard_request_mask"):
            raise RuntimeError(
                f"vLLM's model runner {type(runner).__name__} has no sampler or discard_request_mask: "
                "logprobs_from='sampler' needs them (use logprobs_from='vllm')"
            )
        self.runner = runner
        self.steps: list[tuple[list[str], list[bool], Any, Any]] = []
        """Per step not yet read: the rows' request ids, which rows are kept, the values' host copy, its event."""
        self.values: dict[str, list[float]] = {}
        sampler = runner.sampler
        if getattr(sampler, "_vlrl_sampled_logprobs", None) is not None:
            raise RuntimeError("the sampler already keeps its logprobs for another SampledLogprobs")
        original = sampler.forward

        def forward(logits, sampling_metadata, *args, **kwargs):
            forced = sampling_metadata.max_num_logprobs is None
            if forced:
                sampling_metadata = dataclasses.replace(sampling_metadata, max_num_logprobs=0)
            out = original(logits, sampling_metadata, *args, **kwargs)
            self._record(out.logprobs_tensors.logprobs[:, 0], logits.shape[0])
            return dataclasses.replace(out, logprobs_tensors=None) if forced else out

        sampler.forward = forward
        sampler._vlrl_sampled_logprobs = self

    def _record(self, values, rows: int) -> None:
        """``values``: [rows] float32, the step's sampled-token logprobs, on the model's device."""
        import torch

        ids = list(self.runner.input_batch.req_ids[:rows])
        kept = [not d for d in self.runner.discard_request_mask.np[:rows].tolist()]
        event = None
        if values.is_cuda:
            host = values.to("cpu", non_blocking=True)  # pinned: the copy queues behind the step, no sync here
            event = torch.cuda.Event()
            event.record()
        else:
            host = values.clone()
        self.steps.append((ids, kept, host, event))

    def take(self, request_ids: list[str]) -> dict[str, list[float]]:
        """The values of each of ``request_ids`` (vLLM's front-end ids: the engine core's carry a suffix of its
        own, ``<id>-<8 hex>``), in sampling order; given once, then forgotten. Ids never sampled are left out."""
        self._read()
        wanted, out = set(request_ids), {}
        for rid in [r for r in self.values if r in wanted or r.rsplit("-", 1)[0] in wanted]:
            key = rid if rid in wanted else rid.rsplit("-", 1)[0]
            out[key] = self.values.pop(rid)
        return out

    def _read(self) -> None:
        for ids, kept, host, event in self.steps:
            if event is not None:
                event.synchronize()
            for rid, keep, value in zip(ids, kept, host.tolist()):
                if keep:
                    self.values.setdefault(rid, []).append(value)
        self.steps.clear()
        if len(self.values) > MAX_KEPT_REQUESTS:
            for rid in list(self.values)[: len(self.values) // 2]:
                del self.values[rid]


class FinishedLogprobs:
    """The in-process engine's half (``logprobs_from="sampler"``): the worker keeps its sampler's logprobs from
    the start, and after each step that finished requests one ``collective_rpc`` takes theirs (on the driver's
    thread, before their futures are set: ``vlrl.vllm.driver.Driver``'s ``on_finished``)."""

    def __init__(self, llm: Any):
        llm.collective_rpc("vlrl_keep_sampled_logprobs")
        self.llm = llm

    def fetch(self, outputs: list) -> dict[str, list[float]]:
        """``outputs``: one step's finished ``RequestOutput``s; their values by request id."""
        got = self.llm.collective_rpc("vlrl_take_sampled_logprobs", args=([o.request_id for o in outputs],))
        return got[0]  # every worker samples the same batch: the first's

    @staticmethod
    def cut(values: list[float] | None, n_tokens: int, request_id: str) -> list[float]:
        """A request's first ``n_tokens`` kept values: its returned tokens' logprobs."""
        from vlrl.vllm.config import VllmServerError

        if values is None or len(values) < n_tokens:
            raise VllmServerError(
                f"in-process vLLM: the sampler kept {0 if values is None else len(values)} logprobs for "
                f"request {request_id}'s {n_tokens} tokens"
            )
        return values[:n_tokens]
