"""Engine top-k logprobs (``SamplingParams.logprobs_topk``): full-vocabulary contract values, pre-truncation."""

from __future__ import annotations

import pytest
import torch
import traj_helpers as H

from vlrl.engines.types import SamplingParams


def _full_rows(model, prompt, gen, temperature):
    """``[n, V]`` contract logprobs at each generated position, from one full forward."""
    ids = torch.tensor([list(prompt.token_ids) + list(gen.token_ids)])
    from vlrl.models.positions import mm_token_type_ids
    from vlrl.models.tokenizer import vision_token_ids

    types = mm_token_type_ids(ids, model.config.image_token_id, model.config.video_token_id)
    with torch.no_grad():
        logits = model(
            input_ids=ids,
            pixel_values=prompt.pixel_values,
            image_grid_thw=prompt.image_grid_thw,
            mm_token_type_ids=types,
        ).logits[0]
    n = len(prompt.token_ids)
    banned = torch.tensor(vision_token_ids(model.config))  # outside the contract's softmax
    return torch.log_softmax(logits[n - 1 : -1].float().index_fill(1, banned, float("-inf")) / (temperature or 1.0), -1)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_top_logprobs_are_the_full_vocabulary_top_k_before_truncation(tiny, temperature):
    b = tiny("qwen2_5_vl")
    prompt = b.renderer.render(H.conversations()["single"])
    # top_k=2 truncates sampling; the reported top-5 must still be the untruncated distribution's
    params = SamplingParams(temperature=temperature, top_k=2, max_tokens=10, seed=1, ignore_eos=True, logprobs_topk=5)
    gen = b.engine.generate([prompt], params)[0]
    assert len(gen.top_logprobs) == len(gen.token_ids) == 10
    rows = _full_rows(b.model, prompt, gen, temperature)
    ref_vals, _ = rows.topk(5, dim=-1)
    for i, pairs in enumerate(gen.top_logprobs):
        ids, vals = [p[0] for p in pairs], torch.tensor([p[1] for p in pairs])
        assert len(pairs) == 5 and vals.tolist() == sorted(vals.tolist(), reverse=True)
        assert (vals - ref_vals[i]).abs().max() <= 1e-4
        assert (rows[i, ids] - vals).abs().max() <= 1e-4
        if gen.token_ids[i] in ids:  # the sampled token's pair carries exactly its logprob
            assert dict(pairs)[gen.token_ids[i]] == gen.logprobs[i]


def test_top_logprobs_off_by_default_and_validated(tiny):
    b = tiny("qwen2_5_vl")
    gen = b.engine.generate([b.renderer.render(H.conversations()["text"])], SamplingParams(max_tokens=3, seed=0))[0]
    assert gen.top_logprobs == ()
    with pytest.raises(ValueError, match="logprobs_topk"):
        SamplingParams(logprobs_topk=-1)


def test_top_logprobs_stay_aligned_when_a_stop_string_is_cut(tiny):
    b = tiny("qwen2_5_vl")
    prompt = b.renderer.render(H.conversations()["text"])
    free = b.engine.generate([prompt], SamplingParams(temperature=1.0, max_tokens=12, seed=4, ignore_eos=True))[0]
    stop = free.text[len(free.text) // 2 :][:2]
    if not stop.strip():
        pytest.skip("generated text has no usable stop string")
    params = SamplingParams(
        temperature=1.0,
        max_tokens=12,
        seed=4,
        ignore_eos=True,
        stop=(stop,),
        include_stop_str_in_output=False,
        logprobs_topk=3,
    )
    gen = b.engine.generate([prompt], params)[0]
    assert len(gen.top_logprobs) == len(gen.token_ids) == len(gen.logprobs)
