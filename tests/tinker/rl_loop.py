"""An RL loop over the Tinker API, written the way tinker-cookbook's ``rl_loop`` is: every step saves the
weights for a sampler, samples a group of completions per prompt, scores them in the env, turns the
rewards into group-relative advantages and trains with the ``importance_sampling`` loss — SDK calls only
(``save_weights_for_sampler``, ``create_sampling_client``, ``sample``, ``forward_backward``,
``optim_step``). vlrl supplies the env, the rows, and the client-side rendering of a conversation into
text + image chunks (``vlrl.tinker.client``).

Each completion is one ``sample`` request seeded as vlrl's rollout seeds it (``turn_seed`` of the run seed,
step, row and repeat), so from the same weights it draws the completions ``vlrl train`` draws; with
``tests/tinker/test_same_update.py`` (one API step = one Trainer step) the loop retraces ``vlrl train``.

Advantages are GRPO's (``(r - mean) / (std + eps)`` per group, as vlrl's ``grpo``), divided by the
step's number of generated tokens so the summed Tinker loss is vlrl's ``token_mean``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from tinker import types

from vlrl.data.tickets import eval_seeds, make_rows, train_seeds
from vlrl.envs import env_from_row
from vlrl.rollout.generator import turn_seed
from vlrl.tinker.client import append_tokens, conversation_input


@dataclass(frozen=True)
class LoopConfig:
    model_name: str
    env: str
    extras: dict = field(default_factory=dict)
    train_rows: int = 512
    eval_rows: int = 64
    seed: int = 0
    """``run.seed`` of the recipe: the train rows and the sampling seeds derive from it as in ``vlrl train``."""
    rows_per_step: int = 8
    repeats: int = 8
    max_tokens: int = 4
    temperature: float = 1.0
    lr: float = 3e-3
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 1.0
    steps: int = 60
    eval_every: int = 10
    stop_at: float | None = None
    """Stop after an eval at or above this reward."""


def _episode(row, renderer):
    """``(model input, rendered prompt)`` of a row's first observation."""
    env = env_from_row(row.as_dict())
    try:
        messages, _ = env.init(row.prompt)
    finally:
        env.close()
    return conversation_input(messages, renderer)


def _reward(row, text: str) -> float:
    env = env_from_row(row.as_dict())
    try:
        env.init(row.prompt)
        return env.step(text).reward
    finally:
        env.close()


def _grpo(rewards: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    centered = rewards - rewards.mean()
    return centered / (rewards.std(ddof=1) + eps) if len(rewards) > 1 else centered


def evaluate(sampler, rows, renderer, max_tokens: int) -> float:
    """Mean reward of greedy completions over ``rows``."""
    prompts = [_episode(row, renderer)[0] for row in rows]
    params = types.SamplingParams(max_tokens=max_tokens, temperature=0.0)
    futures = [sampler.sample(p, 1, params) for p in prompts]
    tok = renderer.tokenizer
    texts = [tok.decode(f.result().sequences[0].tokens, skip_special_tokens=True) for f in futures]
    return float(np.mean([_reward(row, t) for row, t in zip(rows, texts)]))


def _sample_groups(sampler, rows, renderer, cfg: LoopConfig, step: int) -> list[tuple]:
    """``cfg.repeats`` completions of each row's prompt, scored in its env: per row ``(model input, rendered prompt,
    sequences, rewards, GRPO advantages)``."""
    episodes = [_episode(row, renderer) for row in rows]
    # one request per completion, seeded as vlrl's rollout seeds it (run seed, step, row, repeat), so this loop
    # draws the completions ``vlrl train`` draws from the same weights
    base = cfg.seed * 1_000_003 + step
    params = [
        [
            types.SamplingParams(max_tokens=cfg.max_tokens, temperature=cfg.temperature, seed=turn_seed(base, g, r, 0))
            for r in range(cfg.repeats)
        ]
        for g in range(len(rows))
    ]
    futures = [[sampler.sample(mi, 1, p) for p in params[g]] for g, (mi, _) in enumerate(episodes)]
    groups = []
    for row, (mi, rendered), futs in zip(rows, episodes, futures):
        seqs = [f.result().sequences[0] for f in futs]
        rewards = np.array([_reward(row, renderer.tokenizer.decode(s.tokens, skip_special_tokens=True)) for s in seqs])
        groups.append((mi, rendered, seqs, rewards, _grpo(rewards)))
    return groups


def _datums(groups: list[tuple]) -> list:
    """The ``importance_sampling`` datums of the step's groups: each completion's tokens after its prompt, the
    sampler's logprobs and the advantage divided by the step's generated tokens (vlrl's ``token_mean``) on them."""
    n_tokens = sum(len(s.tokens) for g in groups for s in g[2])
    data = []
    for mi, rendered, seqs, _rewards, adv in groups:
        if not np.any(adv):
            continue  # a group whose completions all scored the same teaches nothing
        p = len(rendered.token_ids)
        for s, a in zip(seqs, adv):
            toks = list(s.tokens)
            data.append(
                types.Datum(
                    model_input=append_tokens(mi, toks[:-1]),
                    loss_fn_inputs={
                        "target_tokens": list(rendered.token_ids[1:]) + toks,
                        "logprobs": [0.0] * (p - 1) + list(s.logprobs),
                        "advantages": [0.0] * (p - 1) + [float(a) / n_tokens] * len(toks),
                    },
                )
            )
    return data


def rl_loop(service_client, renderer, cfg: LoopConfig, log: Callable[[dict], None] = lambda m: None) -> list[dict]:
    """Train a full fine-tuning client (``rank=0``) on ``cfg.env``; returns the eval history."""
    tc = service_client.create_lora_training_client(base_model=cfg.model_name, rank=0).result()
    train = make_rows(cfg.env, train_seeds(cfg.train_rows, cfg.seed), cfg.extras)
    evals = make_rows(cfg.env, eval_seeds(cfg.eval_rows), cfg.extras)
    adam = types.AdamParams(
        learning_rate=cfg.lr, beta1=cfg.betas[0], beta2=cfg.betas[1], eps=1e-8, grad_clip_norm=cfg.grad_clip
    )

    def sampler_at(step: int):
        path = tc.save_weights_for_sampler(f"step-{step}").result().path
        return service_client.create_sampling_client(model_path=path).result()

    sampler = sampler_at(0)
    history = [{"step": 0, "eval": evaluate(sampler, evals, renderer, cfg.max_tokens)}]
    log(history[-1])
    for step in range(cfg.steps):
        rows = [train[(step * cfg.rows_per_step + i) % len(train)] for i in range(cfg.rows_per_step)]
        groups = _sample_groups(sampler, rows, renderer, cfg, step)
        data = _datums(groups)
        grad_norm = 0.0
        if data:
            tc.forward_backward(data, "importance_sampling").result()
            grad_norm = (tc.optim_step(adam).result().metrics or {}).get("grad_norm", 0.0)
        sampler = sampler_at(step + 1)
        mean_reward = float(np.mean([g[3].mean() for g in groups]))
        entry = {"step": step + 1, "reward": mean_reward, "data": len(data), "grad_norm": grad_norm}
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
            entry["eval"] = evaluate(sampler, evals, renderer, cfg.max_tokens)
        history.append(entry)
        log(entry)
        if cfg.stop_at is not None and entry.get("eval", -1.0) >= cfg.stop_at:
            break
    return history
