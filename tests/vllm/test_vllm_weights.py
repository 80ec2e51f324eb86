"""Weight sync: after a real trainer step the server serves the trainer's weights (probe-verified, the
tied embedding / LM head included) and its rollout logprobs follow them."""

from __future__ import annotations

import pytest
import torch
from vllm_cases import agreement_bounds

from pytest_vlrl import assert_logprobs_agree
from vlrl.checks.agreement import batch_agreement
from vlrl.engines.types import SamplingParams
from vlrl.rollout.generator import RolloutConfig, RolloutGenerator
from vlrl.train.batch import CollateSpec, collate
from vlrl.train.forward import policy_forward
from vlrl.vllm.checkpoint import CheckpointWriter
from vlrl.vllm.server import VllmServerError

pytestmark = pytest.mark.vllm
ARCH = "qwen2_5_vl"
EMBED = "model.language_model.embed_tokens.weight"  # tied to the LM head in the tiny checkpoints


def _expert_batch(stack, model):
    from vlrl.train.experts import expert_for

    rows = [{"prompt": None, "env_class": "color_square", "extras": {}, "seed": s} for s in range(8)]
    cfg = RolloutConfig(sampling=SamplingParams(max_tokens=4), progress=False)
    trajs = RolloutGenerator(stack.renderer, stack.engine, cfg).run(rows, script=expert_for("color_square"))
    return collate(trajs, CollateSpec.from_model(model))


def test_trainer_step_then_sync_serves_the_trainers_weights(vllm_stack, tiny, record_property):
    from test_vllm_agreement import rollout

    from vlrl.models.load import load_model
    from vlrl.train.config import load_config
    from vlrl.train.trainer import Trainer

    stack, bundle = vllm_stack(ARCH), tiny(ARCH)
    model = load_model(bundle.path).train()  # the trainer's own copy; the shared embedded model stays the checkpoint
    cfg = load_config("color_square", [])
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    Trainer(model, cfg.algo, cfg.optim, lr=cfg.sft.lr).sft_step(_expert_batch(stack, model))  # one real optimizer step
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert EMBED in changed and len(changed) > 20  # the tied embedding moved with everything else
    try:
        version = stack.engine.update_weights(model.named_parameters())
        probe = stack.engine.verify_weights(model)
        assert probe <= 1e-4
        with pytest.raises(VllmServerError, match="does not hold the trainer's weights"):
            stack.engine.verify_weights(bundle.model)  # the probe tells the old weights from the new
        trajs = rollout(stack, 0.7)
        assert {t.weight_version for t in trajs} == {version}
        batch = collate(trajs, CollateSpec.from_model(model))
        with torch.no_grad():
            new, old = policy_forward(model, batch), policy_forward(bundle.model, batch)
        report = assert_logprobs_agree(
            batch, new, bounds=agreement_bounds()
        )  # ≤ 1e-4 per turn under the trained weights
        moved = batch_agreement(batch, old).overall.max_abs
        assert moved > 1e-2  # ... and far from the checkpoint's: the logprobs followed the step
        record_property(
            "sync",
            {"probe_max_abs": probe, "after_sync_max_abs": report.overall.max_abs, "vs_old_weights_max_abs": moved},
        )
    finally:  # the session's server goes back to the checkpoint for later tests
        stack.engine.reload_checkpoint()
    assert stack.engine.verify_weights(bundle.model) <= 1e-4


def test_plain_vllm_reload_leaves_the_tied_head_stale(vllm_stack, tiny, tmp_path):
    """The root cause, shown: vLLM's own ``reload_weights`` re-packs the embedding but not the tied LM
    head (its oneDNN-packed copy); ``vlrl_reload_weights`` re-packs it. Guards the worker extension.
    CUDA vLLM packs nothing (reference §1): there the plain reload already serves the new weights."""
    from vlrl.models.load import load_model

    stack, bundle = vllm_stack(ARCH), tiny(ARCH)
    model = load_model(bundle.path)
    with torch.no_grad():
        dict(model.named_parameters())[EMBED].add_(
            0.05 * torch.randn(dict(model.named_parameters())[EMBED].shape, generator=torch.Generator().manual_seed(1))
        )
    writer = CheckpointWriter(bundle.path, tmp_path)
    assert writer.merge(model.named_parameters()) == [EMBED]
    path = str(writer.write(1))
    client, url = stack.engine.client, stack.url

    def rpc(method: str, **kw):
        return client.run(client.post(url, "/collective_rpc", {"method": method, "kwargs": kw}, what=method))

    def reset_caches() -> None:  # as vlrl's sync does: KV blocks and encoder outputs of the old weights go
        # (without the prefix reset the probe's decode request reads the prompt's KV computed before the reload:
        # on CUDA vLLM 0.26, where nothing is packed, the probe was off by 0.062 that way)
        for route in ("/reset_prefix_cache", "/reset_encoder_cache"):
            client.run(client.post(url, route, {}, what="reset"))

    try:
        rpc("reload_weights", weights_path=path)
        reset_caches()
        err = rpc("vlrl_packed_error")["results"][0]["packed_error"]
        if stack.config.capabilities().device == "cuda":  # no packed copies on CUDA: the plain reload serves it
            assert err == {} and stack.engine.verify_weights(model) <= 1e-4
            return
        assert err["language_model.lm_head"] > 1e-3 and err["language_model.model.embed_tokens"] == 0.0
        with pytest.raises(VllmServerError, match="does not hold"):
            stack.engine.verify_weights(model)
        rpc("vlrl_reload_weights", weights_path=path)
        reset_caches()
        assert stack.engine.verify_weights(model) <= 1e-4
    finally:
        stack.engine.reload_checkpoint()
    assert stack.engine.verify_weights(bundle.model) <= 1e-4


def test_update_weights_refuses_unknown_names_and_shapes(vllm_stack):
    engine = vllm_stack(ARCH).engine
    with pytest.raises(KeyError, match="no parameter"):
        engine.update_weights({"model.nope.weight": torch.zeros(2)})
    with pytest.raises(ValueError, match="shape"):
        engine.update_weights({"model.language_model.norm.weight": torch.zeros(3)})


def test_push_without_a_checkpoint_serves_the_trainers_weights(vllm_stack, tiny):
    """``WeightSync.push``: the worker reloads tensors sent in the call itself (by value here; CUDA IPC handles on
    a GPU, tests/gpu/test_vllm_gpu.py), the tied head re-packed as in the checkpoint sync."""
    from vlrl.models.load import load_model

    stack, bundle = vllm_stack(ARCH), tiny(ARCH)
    model = load_model(bundle.path)
    embed = dict(model.named_parameters())[EMBED]
    with torch.no_grad():
        embed.add_(0.05 * torch.randn(embed.shape, generator=torch.Generator().manual_seed(2)))
    try:
        version = stack.engine.weights.push({EMBED: embed}, transport="value")
        assert version == stack.engine.weight_version
        assert stack.engine.verify_weights(model) <= 1e-4
        with pytest.raises(VllmServerError, match="does not hold"):
            stack.engine.verify_weights(bundle.model)
        # A checkpoint sync after a push: the checkpoint's own values are a change for servers that hold the
        # pushed ones (the merged copy never saw them; this stopped the sync on the H100 before)
        stack.engine.update_weights([(n, p.detach()) for n, p in bundle.model.named_parameters()])
        assert stack.engine.weights.last_route == "checkpoint"
        assert stack.engine.verify_weights(bundle.model) <= 1e-4
    finally:
        stack.engine.reload_checkpoint()
    assert stack.engine.verify_weights(bundle.model) <= 1e-4
