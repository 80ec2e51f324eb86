"""Weight sync: after update_weights the server serves the trainer's new weights (verified)."""

from __future__ import annotations

import pytest
import torch

from vllm_cases import conversations
from vlrl.checks.logprobs import full_forward_logprobs
from vlrl.engines.types import SamplingParams
from vlrl.engines.vllm_server import VllmServerError
from vlrl.engines.vllm_sync import check_probe

pytestmark = pytest.mark.vllm
ARCH = "qwen2_5_vl"


def test_update_weights_follows_trainer(vllm_stack, tiny):
    from vlrl.models.load import load_model

    stack, bundle = vllm_stack(ARCH), tiny(ARCH)
    trainer = load_model(bundle.path)  # a separate copy: the shared embedded model stays untouched
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in trainer.named_parameters():
            if "embed_tokens" not in name:  # tied to the LM head: see test_tied_embedding_change_is_refused
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    original = {n: p.detach().clone() for n, p in bundle.model.named_parameters()}
    prompt = stack.renderer.render(conversations()["one_image"][0])
    params = SamplingParams(temperature=0.7, max_tokens=16, seed=3, ignore_eos=True)
    try:
        version = stack.engine.update_weights(trainer.named_parameters(), reference_model=trainer)
        out = stack.engine.generate([prompt], params)[0]
        assert out.weight_version == version == 1
        new_ref = full_forward_logprobs(trainer, prompt, out.token_ids, 0.7)
        old_ref = full_forward_logprobs(bundle.model, prompt, out.token_ids, 0.7)
        assert (new_ref - torch.tensor(out.logprobs)).abs().max().item() <= 1e-4
        assert (old_ref - torch.tensor(out.logprobs)).abs().max().item() > 1e-2  # it really moved
        with pytest.raises(VllmServerError, match="does not hold the trainer's weights"):
            check_probe(stack.engine, bundle.model)  # the probe catches a server on other weights
    finally:  # the session's server goes back to the checkpoint for later tests
        stack.engine.update_weights(original.items(), version=2, reference_model=bundle.model)
    back = stack.engine.generate([prompt], params)[0]
    assert back.weight_version == 2
    assert (full_forward_logprobs(bundle.model, prompt, back.token_ids, 0.7) - torch.tensor(back.logprobs)).abs().max() <= 1e-4


def test_update_weights_refuses_unknown_names_and_tied_embedding(vllm_stack, tiny):
    engine = vllm_stack(ARCH).engine
    embed = dict(tiny(ARCH).model.named_parameters())["model.language_model.embed_tokens.weight"]
    with pytest.raises(ValueError, match="ties it to the LM head"):
        engine.update_weights({"model.language_model.embed_tokens.weight": embed + 0.01})
    with pytest.raises(KeyError, match="no parameter"):
        engine.update_weights({"model.nope.weight": torch.zeros(2)})
    with pytest.raises(ValueError, match="shape"):
        engine.update_weights({"model.language_model.norm.weight": torch.zeros(3)})
