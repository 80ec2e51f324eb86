"""The unmodified tinker SDK 0.38 against ``vlrl tinker-serve``: training on text + image chunks, forward-only
against the trainer's own logprobs, sampling on an image prompt against the trainer (vlrl's agreement
check), LoRA, and the RL losses' values and direction."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from tinker import types
from tinker_helpers import MODEL_NAME, image_conversation

from vlrl.checks.agreement import compare_logprobs
from vlrl.checks.logprobs import full_forward_logprobs
from vlrl.models.tokenizer import vision_token_ids
from vlrl.tinker.client import append_tokens, conversation_input
from vlrl.tinker.training import prompt_batch
from vlrl.train.forward import policy_forward

ANSWER = "blue square<|im_end|>"


def _example(renderer, seed: int):
    """``(datum, rendered prompt, answer ids)``: an image question and a fixed answer, weights on the answer."""
    model_input, rendered = conversation_input(image_conversation(seed), renderer)
    answer = renderer.tokenizer(ANSWER)["input_ids"]
    full = list(rendered.token_ids) + answer
    weights = [0.0] * (len(rendered.token_ids) - 1) + [1.0] * len(answer)
    datum = types.Datum(
        model_input=append_tokens(model_input, answer[:-1]),
        loss_fn_inputs={"target_tokens": full[1:], "weights": weights},
    )
    return datum, rendered, answer


def _trainer_logprobs(model, rendered, answer):
    """vlrl's policy forward over prompt + answer: ``[len(answer)]`` logprobs of the answer tokens."""
    full = dataclasses.replace(rendered, token_ids=tuple(rendered.token_ids) + tuple(answer))
    batch = prompt_batch([full], pad_id=0)
    mask = torch.zeros_like(batch.loss_mask)
    mask[0, len(rendered.token_ids) :] = 1
    out = policy_forward(model, batch.replace(loss_mask=mask))
    return out.logprobs[0, len(rendered.token_ids) :]


@pytest.fixture(scope="module")
def full_ft(service_client):
    return service_client.create_lora_training_client(base_model=MODEL_NAME, rank=0).result()


def test_cross_entropy_on_text_and_image_chunks_lowers_the_loss(full_ft, renderer, tinker_server):
    examples = [_example(renderer, s) for s in (1, 2)]
    data = [e[0] for e in examples]
    assert any(isinstance(c, types.ImageChunk) for c in data[0].model_input.chunks)
    vision = vision_token_ids(tinker_server.service.models[full_ft.model_id].model.config)
    losses = []
    for _ in range(4):
        out = full_ft.forward_backward(data, "cross_entropy").result()
        full_ft.optim_step(types.AdamParams(learning_rate=3e-3)).result()
        losses.append(out.metrics["loss:sum"])
        # the reported loss is -sum(weights * logprobs) of the returned logprobs, given where the loss uses
        # them (weight != 0); NaN elsewhere and where the target is a vision id (no logprob under the contract)
        total = 0.0
        for datum, lp in zip(data, out.loss_fn_outputs):
            lps = lp["logprobs"].to_numpy()
            targets = np.asarray(datum.loss_fn_inputs["target_tokens"].to_numpy())
            weights = np.asarray(datum.loss_fn_inputs["weights"].to_numpy())
            assert lps.shape == targets.shape
            assert np.array_equal(np.isnan(lps), (weights == 0) | np.isin(targets, vision))
            total += -float(np.nansum(lps * weights))
        assert out.metrics["loss:sum"] == pytest.approx(total, rel=1e-5)
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert losses[-1] < 0.95 * losses[0], losses
    model = tinker_server.service.models[full_ft.model_id]
    assert all(p.grad is None for p in model.model.parameters()), "optim_step leaves no gradient behind"


def test_forward_only_equals_the_trainers_logprobs(full_ft, renderer, tinker_server):
    datum, rendered, answer = _example(renderer, 3)
    out = full_ft.forward([datum], "cross_entropy").result()
    api = torch.tensor(out.loss_fn_outputs[0]["logprobs"].to_numpy()[-len(answer) :])
    model = tinker_server.service.models[full_ft.model_id].model
    assert all(p.grad is None for p in model.parameters()), "forward-only accumulates no gradient"
    # forward-only scores every position (the prompt's too), all but the vision-id targets
    everywhere = out.loss_fn_outputs[0]["logprobs"].to_numpy()
    targets = np.asarray(datum.loss_fn_inputs["target_tokens"].to_numpy())
    assert np.array_equal(np.isnan(everywhere), np.isin(targets, vision_token_ids(model.config)))
    with torch.no_grad():
        trainer = _trainer_logprobs(model, rendered, answer)
        reference = full_forward_logprobs(model, rendered, answer, 1.0)  # vlrl's independent reference
    torch.testing.assert_close(api, trainer, atol=1e-5, rtol=0)
    torch.testing.assert_close(api, reference, atol=1e-4, rtol=0)


def test_sample_on_an_image_prompt_agrees_with_the_trainer(full_ft, service_client, renderer, tinker_server):
    from vlrl.models.load import load_model

    full_ft.forward_backward([_example(renderer, 4)[0]], "cross_entropy").result()
    full_ft.optim_step(types.AdamParams(learning_rate=1e-3)).result()  # weights now differ from the base
    path = full_ft.save_weights_for_sampler("agreement").result().path
    sampler = service_client.create_sampling_client(model_path=path).result()
    model_input, rendered = conversation_input(image_conversation(5), renderer)
    res = sampler.sample(
        model_input, num_samples=4, sampling_params=types.SamplingParams(max_tokens=8, temperature=1.0, seed=0)
    ).result()
    assert len(res.sequences) == 4
    model = tinker_server.service.models[full_ft.model_id].model
    base = load_model(tinker_server.service.cfg.base_model)
    for seq in res.sequences:
        tokens, rollout = list(seq.tokens), torch.tensor(seq.logprobs)[None]
        assert len(tokens) == rollout.shape[1] > 0
        with torch.no_grad():
            trainer = _trainer_logprobs(model, rendered, tokens)[None]
            on_base = full_forward_logprobs(base, rendered, tokens, 1.0)[None]
        report = compare_logprobs(rollout, trainer, torch.ones_like(rollout))
        assert not report.breached, report.summary()
        assert report.overall.max_abs < 1e-4, report.summary()
        # the sampler served the saved weights, not the base checkpoint's
        assert (on_base - rollout).abs().max() > 1e-3


def test_wrong_expected_tokens_is_refused_naming_it(full_ft, renderer):
    import tinker

    datum, _, _ = _example(renderer, 6)
    chunks = list(datum.model_input.chunks)
    k = next(i for i, c in enumerate(chunks) if isinstance(c, types.ImageChunk))
    chunks[k] = types.ImageChunk(data=chunks[k].data, format="png", expected_tokens=chunks[k].expected_tokens + 1)
    n = sum(c.length for c in chunks)
    bad = types.Datum(
        model_input=types.ModelInput(chunks=chunks), loss_fn_inputs={"target_tokens": [0] * n, "weights": [0.0] * n}
    )
    with pytest.raises(tinker.RequestFailedError, match="expected_tokens"):
        full_ft.forward_backward([bad], "cross_entropy").result()


def test_rl_losses_have_their_values_and_direction(service_client, renderer, tinker_server):
    tc = service_client.create_lora_training_client(base_model=MODEL_NAME, rank=0).result()
    datum, rendered, answer = _example(renderer, 7)
    n, k = len(datum.loss_fn_inputs["target_tokens"].to_numpy()), len(answer)
    lp = tc.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
    rng = np.random.default_rng(0)
    adv = np.zeros(n, dtype=np.float32)
    adv[-k:] = rng.choice([-1.0, 1.0], size=k).astype(np.float32)
    q = np.zeros(n, dtype=np.float32)
    q[-k:] = lp[-k:] + rng.normal(0, 0.3, size=k).astype(np.float32)  # sampler logprobs, off by a little
    rl = types.Datum(
        model_input=datum.model_input,
        loss_fn_inputs={"target_tokens": datum.loss_fn_inputs["target_tokens"], "logprobs": q, "advantages": adv},
    )
    ratio = np.exp(lp[-k:] - q[-k:])
    want = {
        "importance_sampling": -(ratio * adv[-k:]).sum(),
        "ppo": -np.minimum(ratio * adv[-k:], np.clip(ratio, 0.8, 1.2) * adv[-k:]).sum(),
    }
    for loss_fn, value in want.items():
        out = tc.forward([rl], loss_fn).result()
        assert out.metrics["loss:sum"] == pytest.approx(float(value), rel=1e-4, abs=1e-5), loss_fn
    tc.forward_backward([rl], "importance_sampling").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    after = tc.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()[-k:]
    moved = np.sign(after - lp[-k:])
    assert np.array_equal(moved, np.sign(adv[-k:])), (after - lp[-k:], adv[-k:])


def test_lora_client_trains_only_adapters_and_samples_merged_weights(service_client, renderer, tinker_server):
    from vlrl.models.lora import base_checksum

    tc = service_client.create_lora_training_client(base_model=MODEL_NAME, rank=8).result()
    info = tc.get_info()
    assert info.is_lora and info.lora_rank == 8
    trained = tinker_server.service.models[tc.model_id].model
    before = base_checksum(trained.named_parameters())
    assert all(".lora_" in n for n, p in trained.named_parameters() if p.requires_grad)
    data = [_example(renderer, 8)[0]]
    losses = []
    for _ in range(3):
        losses.append(tc.forward_backward(data, "cross_entropy").result().metrics["loss:sum"])
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    assert losses[-1] < losses[0], losses
    assert base_checksum(trained.named_parameters()) == before, "a base weight moved"
    path = tc.save_weights_for_sampler("lora").result().path
    sampler = service_client.create_sampling_client(model_path=path).result()
    model_input, rendered = conversation_input(image_conversation(9), renderer)
    seq = sampler.sample(model_input, 1, types.SamplingParams(max_tokens=6, seed=1)).result().sequences[0]
    with torch.no_grad():
        trainer = _trainer_logprobs(trained, rendered, list(seq.tokens))
    torch.testing.assert_close(torch.tensor(seq.logprobs), trainer, atol=1e-4, rtol=0)


def test_save_weights_and_get_sampling_client_samples_the_saved_weights(full_ft, renderer, tinker_server):
    sampler = full_ft.save_weights_and_get_sampling_client().result()
    model_input, rendered = conversation_input(image_conversation(10), renderer)
    seq = sampler.sample(model_input, 1, types.SamplingParams(max_tokens=4, seed=2)).result().sequences[0]
    model = tinker_server.service.models[full_ft.model_id].model
    with torch.no_grad():
        trainer = _trainer_logprobs(model, rendered, list(seq.tokens))
    torch.testing.assert_close(torch.tensor(seq.logprobs), trainer, atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "corrupt, words",
    [
        (lambda d, n: {**d, "target_tokens": [10**7] * n}, "outside the vocabulary"),
        (lambda d, n: {**d, "weights": [1.0] * n}, "vision placeholder"),  # weight on the image's own positions
    ],
)
def test_bad_data_fails_by_name_before_any_gradient(service_client, renderer, tinker_server, corrupt, words):
    import tinker

    tc = service_client.create_lora_training_client(base_model=MODEL_NAME, rank=0).result()
    good, _, _ = _example(renderer, 12)
    n = len(good.loss_fn_inputs["target_tokens"].to_numpy())
    inputs = {k: v.to_numpy().tolist() for k, v in good.loss_fn_inputs.items()}
    bad = types.Datum(model_input=good.model_input, loss_fn_inputs=corrupt(inputs, n))
    with pytest.raises(tinker.RequestFailedError, match=words):
        tc.forward_backward([good, bad], "cross_entropy").result()  # the good datum comes first
    model = tinker_server.service.models[tc.model_id].model
    assert all(p.grad is None for p in model.parameters()), "a refused request must leave no gradient behind"


def test_prompt_token_ids_outside_the_vocabulary_are_refused(service_client):
    import tinker

    sampler = service_client.create_sampling_client(base_model=MODEL_NAME).result()
    with pytest.raises(tinker.RequestFailedError, match="outside the vocabulary"):
        sampler.sample(types.ModelInput.from_ints([1, 10**7]), 1, types.SamplingParams(max_tokens=2)).result()
