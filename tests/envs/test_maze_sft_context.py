"""An SFT expert episode the model's context ends before the goal is refused with the turn budget that fits
(``vlrl.rollout.scripted.refuse_cut``, in the maze's SFT batches and in the trainer's own SFT loop): at hard the
small model's 4,096 tokens ended 56 of 64 branch-detour episodes at turn 37 of 46, and SFT trained on them without
a word (docs/maze.md item 30)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from vlrl.envs.maze_curriculum import LevelPlan, level_config
from vlrl.envs.maze_sft_data import expert_episodes
from vlrl.errors import ConfigError
from vlrl.train.loop import sft

CPU = ("model.device=cpu", "data.train_rows=12", "data.eval_rows=4", 'data.extras={"expert_noise":0.0}')


def test_an_episode_cut_by_the_context_is_refused_and_the_budget_it_names_fits(tmp_path):
    from vlrl.train.run import Run

    run = Run(level_config(LevelPlan("7x7", 0, 0, overrides=CPU), tmp_path))
    try:
        rows = run.train_rows[:12]
        assert all(t.stop_reason == "done" for t in expert_episodes(run, rows, 1, masked=True))  # 4,096 tokens
        run.engine.max_context = 900  # the engine's own limit, set below a 17-turn 7x7 episode (1,457 tokens)
        with pytest.raises(ConfigError, match=r"outgrew the model's context") as refused:
            expert_episodes(run, rows, 1, masked=True)
        fits = int(re.search(r"data\.extras\.max_turns to (\d+)", str(refused.value)).group(1))
        assert 0 < fits < 17 and "\n" not in str(refused.value)
        budget = [dataclasses.replace(r, extras={**r.extras, "max_turns": fits}) for r in rows]
        trajs = expert_episodes(run, budget, 1, masked=True)  # the budget it names: no episode cut
        assert {t.stop_reason for t in trajs} <= {"done", "max_turns"} and max(len(t.turns) for t in trajs) == fits
    finally:
        run.close()


def test_the_trainers_own_sft_loop_refuses_them_too(tmp_path):
    from vlrl.train.run import Run

    sets = (*CPU, "sft.steps=1", "sft.rows_per_step=12")
    run = Run(level_config(LevelPlan("7x7", 0, 0, overrides=sets), tmp_path))
    try:
        run.engine.max_context = 900
        with pytest.raises(ConfigError, match=r"SFT step 1's expert episodes outgrew .* set rollout\.max_turns to"):
            sft(run)
        assert run.state.sft_step == 0  # refused before the update
    finally:
        run.close()
