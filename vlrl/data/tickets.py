"""Build train/eval splits of env rows.

- Env tickets: the prompt is a placeholder; the env writes the first message from its seed.
- Image-prompt rows (``with_prompts``): the prompt is the env's own first message, images inside
  as data URIs; facts the env needs to grade it (``ground_truth``) go into ``extras``.

Seeds: the eval split uses seeds ``0..M-1`` (fixed: identical rows on every run); the train split
draws seeds from ``[TRAIN_SEED_LOW, 2**31)`` with a generator seeded by ``train_seed`` (fresh OS
entropy when None), so train and eval never share a seed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from vlrl.data.rows import EnvRow
from vlrl.envs import PLACEHOLDER_PROMPT, make_env

TRAIN_SEED_LOW = 1_000_000
GRADING_KEYS = ("ground_truth",)


def eval_seeds(n: int) -> list[int]:
    return list(range(n))


def train_seeds(n: int, train_seed: int | None = None) -> list[int]:
    """``n`` distinct seeds in ``[TRAIN_SEED_LOW, 2**31)`` drawn from ``default_rng(train_seed)``."""
    rng = np.random.default_rng(train_seed)
    seeds: dict[int, None] = {}  # ordered set: redraw the (rare) duplicates
    while len(seeds) < n:
        for s in rng.integers(TRAIN_SEED_LOW, 2**31, size=n - len(seeds)):
            seeds[int(s)] = None
    return list(seeds)


def make_rows(
    env_class: str, seeds: list[int], extras: Mapping[str, Any] | None = None, with_prompts: bool = False
) -> list[EnvRow]:
    """One row per seed; see the module docstring for tickets vs image-prompt rows."""
    rows = []
    for seed in seeds:
        row_extras = dict(extras or {})
        prompt = [dict(m) for m in PLACEHOLDER_PROMPT]
        if with_prompts:
            env = make_env(env_class, row_extras, seed)
            try:
                prompt, info = env.init(prompt)
            finally:
                env.close()
            row_extras.update({k: info[k] for k in GRADING_KEYS if k in info})
        rows.append(EnvRow(prompt=prompt, env_class=env_class, extras=row_extras, seed=seed))
    return rows


def build_splits(
    env_class: str,
    n_train: int,
    n_eval: int,
    *,
    extras: Mapping[str, Any] | None = None,
    with_prompts: bool = False,
    train_seed: int | None = None,
) -> dict[str, list[EnvRow]]:
    """``{"train": rows, "eval": rows}``."""
    return {
        "train": make_rows(env_class, train_seeds(n_train, train_seed), extras, with_prompts),
        "eval": make_rows(env_class, eval_seeds(n_eval), extras, with_prompts),
    }
