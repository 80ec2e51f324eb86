"""vLLM's pooled tokenizer starts empty and copies on use (``vlrl.vllm.tokenizer_pool``): the deep copies transformers
makes of it while vLLM loads its processor no longer copy the 151k-token tokenizer again each."""

from __future__ import annotations

import copy

import pytest

from pytest_vlrl.vllm import require_vllm

pytestmark = pytest.mark.vllm


def test_a_deep_copy_of_the_pooled_tokenizer_copies_nothing_until_used(vlrl_model_dir, monkeypatch):
    require_vllm()
    from transformers import AutoTokenizer

    from vlrl.vllm import tokenizer_pool

    assert tokenizer_pool.install()
    from vllm.tokenizers import hf

    copies = []

    class CountingCopy:  # hf's own `copy` module, counted: the pool's deep copies go through it
        copy = staticmethod(copy.copy)

        @staticmethod
        def deepcopy(x, memo=None):
            copies.append(type(x).__name__)
            return copy.deepcopy(x, memo)

    monkeypatch.setattr(hf, "copy", CountingCopy)
    tok = AutoTokenizer.from_pretrained(vlrl_model_dir("qwen2_5_vl"))
    pooled = hf.maybe_make_thread_pool(copy.copy(tok), 2)
    duplicate = copy.deepcopy(pooled)  # as transformers copies the kwargs that carry it
    assert copies == []
    assert duplicate.encode("a red square") == tok.encode("a red square")  # borrows: one copy, made now
    assert len(copies) == 1
