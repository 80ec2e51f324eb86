"""Each sampled token's logprob kept inside vLLM's worker, off vLLM's per-request transport.

Why: asked for logprobs (``logprobs=0``), vLLM carries every request's as a ``LogprobsLists`` of three small numpy
arrays of its own on every step — sliced per request by the scheduler, encoded array by array by the engine
core, decoded again by the front end. On an H200 that took the engine core's step from 9.7 to 14.2 ms at 256
requests (``benchmarks/results/vllm_gpu_h100/inprocess/NOTE.md``, session 51; the transport alone:
``benchmarks/vllm_logprob_wire.py``). Without it, and with the ban as ``bad_words`` (vLLM's model runner V2),
the in-process path ran 0.88–1.32× of raw offline (session 52, same NOTE).

How: the worker's sampler is asked for the logprobs it computes anyway when a request wants them
(V1: ``max_num_logprobs=0``, V2: ``num_logprobs`` 0 for the batch's rows; the sampled token's, after the
processors and temperature as ``processed_logprobs`` reports them) and returns its output without them, so nothing
goes per request through the scheduler. Each step keeps one host copy of the batch's values (copied without a host
sync), the rows' request ids and which rows' samples vLLM discards (a partial prefill's).
:meth:`SampledLogprobs.take` hands a finished request's values in sampling order, cut by the caller to the tokens
vLLM returned (a request scheduled one step past its end, as vLLM's asynchronous scheduling does, samples once more).

Runs inside vLLM's worker (:class:`vlrl.vllm.worker.VlrlWorkerExtension`), torch and vLLM's model runner at hand.
"""

from __future__ import annotations

import dataclasses
from typing import Any

MAX_KEPT_REQUESTS = 65536
"""Requests whose values wait to be taken; past it the oldest half is dropped (requests never taken: aborted)."""


class SampledLogprobs:
    """The sampled tokens' logprobs of every request the worker's sampler serves, by vLLM's request id.

    Both of vLLM's model runners: V1's sampler is called as ``sampler(logits, sampling_metadata)`` and its
    ``discard_request_mask`` says which rows' samples are dropped; V2's (vLLM 0.26 on CUDA without a custom logits
    processor, as ``ban="bad_words"`` leaves it) as ``sampler(logits, input_batch)``, asked per request through
    ``sampling_states.num_logprobs``, its output's ``num_sampled`` 0 for a row still prefilling."""

    def __init__(self, runner: Any):
        sampler = getattr(runner, "sampler", None)
        if sampler is None or isinstance(sampler, _KeepingSamplerV2) or getattr(sampler, "_vlrl_kept", False):
            raise RuntimeError(
                f"vLLM's model runner {type(runner).__name__} has no sampler, or it already keeps its logprobs"
            )
        if getattr(runner, "speculative_config", None) is not None:  # drafts go to a rejection sampler unwrapped
            raise RuntimeError("logprobs_from='sampler' does not follow speculative decoding (use 'vllm')")
        self.runner = runner
        self.steps: list[tuple[list[str], Any, Any, Any]] = []
        """Per step not yet read: the rows' request ids, which rows are kept, the values' host copy, its event."""
        self.values: dict[str, list[float]] = {}
        if hasattr(runner, "discard_request_mask"):
            self._wrap_v1(sampler)
        elif hasattr(sampler, "sampling_states"):
            runner.sampler = _KeepingSamplerV2(sampler, self)
        else:
            raise RuntimeError(
                f"vLLM's model runner {type(runner).__name__} is neither of the two vlrl knows (V1: "
                "discard_request_mask; V2: sampler.sampling_states): use logprobs_from='vllm'"
            )

    def _wrap_v1(self, sampler: Any) -> None:
        import torch

        original = sampler.forward

        def forward(logits, sampling_metadata, *args, **kwargs):
            forced = sampling_metadata.max_num_logprobs is None
            if forced:
                sampling_metadata = dataclasses.replace(sampling_metadata, max_num_logprobs=0)
            out = original(logits, sampling_metadata, *args, **kwargs)
            rows = logits.shape[0]
            kept = torch.from_numpy(self.runner.discard_request_mask.np[:rows]) == 0  # new: vLLM reuses the mask
            self.record(out.logprobs_tensors.logprobs[:, 0], self.runner.input_batch.req_ids[:rows], kept)
            return dataclasses.replace(out, logprobs_tensors=None) if forced else out

        sampler.forward = forward
        sampler._vlrl_kept = True

    def record(self, values: Any, req_ids: list[str], kept: Any) -> None:
        """``values``: [rows] float32, the step's sampled-token logprobs on the model's device; ``kept``: [rows]
        bool, whether vLLM keeps each row's sample, a tensor made for this step (on the host or the device)."""
        import torch

        event = None
        if values.is_cuda:  # pinned copies queued behind the step, no host sync here
            host, kept = values.to("cpu", non_blocking=True), kept.to("cpu", non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        else:
            host = values.clone()
        self.steps.append((list(req_ids), kept, host, event))

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
            for rid, keep, value in zip(ids, kept.tolist(), host.tolist()):
                if keep:
                    self.values.setdefault(rid, []).append(value)
        self.steps.clear()
        if len(self.values) > MAX_KEPT_REQUESTS:
            for rid in list(self.values)[: len(self.values) // 2]:
                del self.values[rid]


class _KeepingSamplerV2:
    """vLLM's model runner V2 sampler with its calls recorded; every other attribute the sampler's own (the runner
    reads its states). Asks the logprobs of a batch where no request asked them, as V1's ``max_num_logprobs=0``."""

    def __init__(self, sampler: Any, keeper: SampledLogprobs):
        self._sampler, self._keeper = sampler, keeper

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sampler, name)

    def __call__(self, logits, input_batch, *args, **kwargs):
        asked = self._sampler.sampling_states.num_logprobs  # [max_num_reqs] int32, NO_LOGPROBS (-1) when not
        rows = input_batch.idx_mapping_np
        forced = bool((asked[rows] < 0).all())
        if forced:
            asked[rows] = 0
        try:
            out = self._sampler(logits, input_batch, *args, **kwargs)
        finally:
            if forced:
                asked[rows] = -1
        n = logits.shape[0]
        self._keeper.record(out.logprobs_tensors.logprobs[:, 0], input_batch.req_ids[:n], out.num_sampled[:n] > 0)
        return dataclasses.replace(out, logprobs_tensors=None) if forced else out


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
    def cut(
        values: list[float] | None, n_tokens: int, request_id: str, reported: list[float] | None = None
    ) -> list[float]:
        """A request's first ``n_tokens`` kept values: its returned tokens' logprobs. ``reported``: the same as
        vLLM reports them (a request asking its top k), which they must equal bitwise: one tensor's values, so a
        difference is this module's bookkeeping gone wrong (a row given to another request, a step missed)."""
        from vlrl.vllm.config import VllmServerError

        if values is None or len(values) < n_tokens:
            raise VllmServerError(
                f"in-process vLLM: the sampler kept {0 if values is None else len(values)} logprobs for "
                f"request {request_id}'s {n_tokens} tokens"
            )
        values = values[:n_tokens]
        if reported is not None and reported != values:
            at = next(i for i, (a, b) in enumerate(zip(values, reported)) if a != b)
            raise VllmServerError(
                f"in-process vLLM: the sampler kept logprob {values[at]!r} for request {request_id}'s token {at}, "
                f"vLLM reports {reported[at]!r} (logprobs_from='sampler' lost this vLLM's rows; use 'vllm')"
            )
        return values
