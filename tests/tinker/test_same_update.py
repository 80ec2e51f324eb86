"""One RL step through the API is ``vlrl train``'s RL step: the same sampled image-prompt completions, trained
once with the cookbook loop's recipe (GRPO advantages ÷ the step's token count, ``importance_sampling``,
``AdamParams`` of the run) and once by vlrl's :class:`~vlrl.train.trainer.Trainer` (grpo, ppo_clip,
token_mean, the same optimizer and ``lr_scale``), give the same gradient norm and the same weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from rl_loop import _datums, _grpo
from tinker import types
from tinker_helpers import MODEL_NAME, image_conversation

from vlrl.algos import AlgoConfig
from vlrl.tinker.client import conversation_input
from vlrl.tinker.training import prompt_batch
from vlrl.train.config import OptimSection
from vlrl.train.trainer import Trainer

LR, REPEATS = 3e-3, 4


def _vlrl_batch(prompts, samples, rewards):
    """vlrl's Batch of the same completions: prompt + tokens, loss mask / rollout logprobs / reward on them."""
    import dataclasses

    rows = [
        dataclasses.replace(r, token_ids=r.token_ids + tuple(s.tokens))
        for r, seqs in zip(prompts, samples)
        for s in seqs
    ]
    batch = prompt_batch(rows, pad_id=0)
    mask, old, rew = (torch.zeros_like(batch.loss_mask) for _ in range(3))
    b = 0
    for r, seqs, rs in zip(prompts, samples, rewards):
        for s, reward in zip(seqs, rs):
            p, n = len(r.token_ids), len(s.tokens)
            mask[b, p : p + n] = 1
            old[b, p : p + n] = torch.tensor(s.logprobs)
            rew[b, p + n - 1] = reward
            b += 1
    groups = torch.arange(len(prompts)).repeat_interleave(REPEATS)
    return batch.replace(loss_mask=mask, rollout_logprobs=old, rewards=rew, groups=groups)


def _recorded_grads(model) -> dict[str, torch.Tensor]:
    """Hooks on ``model``'s parameters that sum, by name, the gradients its later backward passes compute: the
    trainer's gradients as its optimizer step reads them, kept after the step."""
    grads: dict[str, torch.Tensor] = {}

    def keep(name):
        def hook(grad):  # summed over micro-batches, as the .grad the optimizer then reads
            grads[name] = grads.get(name, 0) + grad.detach().clone()

        return hook

    for name, p in model.named_parameters():
        p.register_hook(keep(name))
    return grads


def test_an_api_rl_step_equals_vlrl_trainers_step(service_client, renderer, tinker_server):
    from vlrl.models.load import load_model

    tc = service_client.create_lora_training_client(base_model=MODEL_NAME, rank=0).result()
    sampler = tc.save_weights_and_get_sampling_client().result()
    episodes = [conversation_input(image_conversation(20 + i), renderer) for i in range(2)]
    samples = [
        sampler.sample(mi, REPEATS, types.SamplingParams(max_tokens=5, seed=7 * i)).result().sequences
        for i, (mi, _) in enumerate(episodes)
    ]
    rewards = [np.array([float(s.tokens[0] % 3 == 0) + 0.5 * j for j, s in enumerate(seqs)]) for seqs in samples]

    # the API side: the datums tests/tinker/rl_loop.py's loop builds
    groups = [(mi, rendered, seqs, r, _grpo(r)) for (mi, rendered), seqs, r in zip(episodes, samples, rewards)]
    tc.forward_backward(_datums(groups), "importance_sampling").result()
    served = tinker_server.service.models[tc.model_id].model
    api_grads = {n: p.grad.clone() for n, p in served.named_parameters() if p.grad is not None}
    adam = types.AdamParams(learning_rate=LR, beta1=0.9, beta2=0.999, eps=1e-8, grad_clip_norm=1.0)
    api = tc.optim_step(adam).result().metrics

    # vlrl's trainer on the same completions, from the same base weights; its gradients read before its step
    model = load_model(tinker_server.service.cfg.base_model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optim = OptimSection(lr=LR, grad_clip=1.0, micro_batch_size=32, lr_scale=tinker_server.service.cfg.lr_scale)
    trainer = Trainer(model, AlgoConfig(advantage="grpo", policy_loss="ppo_clip", loss_agg="token_mean"), optim)
    vlrl_grads = _recorded_grads(model)
    batch = _vlrl_batch([r for _, r in episodes], samples, rewards)
    inputs, _ = trainer.prepare(batch, trainer.logprobs(batch))
    ours = trainer.rl_step(batch, inputs)

    assert api["grad_norm"] == pytest.approx(ours["grad_norm"], rel=1e-4)
    assert api_grads.keys() == vlrl_grads.keys()
    for name, g in vlrl_grads.items():
        torch.testing.assert_close(api_grads[name], g, rtol=1e-3, atol=1e-7, msg=name)
    # and the same optimizer: the weights moved alike (Adam's first step is ~lr·sign(g), so a coordinate whose
    # gradient is float noise, e.g. a key bias, which softmax ignores, may move either way)
    moved = dict(served.named_parameters())
    for name, p in model.named_parameters():
        d_api, d_vlrl = moved[name].detach() - before[name], p.detach() - before[name]
        signal = vlrl_grads[name].abs() > 1e-6 if name in vlrl_grads else None  # >> the gradients' atol
        if signal is not None and signal.any():
            torch.testing.assert_close(d_api[signal], d_vlrl[signal], rtol=1e-3, atol=1e-6, msg=name)
    embed = next(n for n in before if "embed_tokens" in n)
    assert (moved[embed].detach() - before[embed]).abs().max() <= 0.1 * LR * 1.01, "lr_scale embed=0.1 applied"
