"""The curriculum's eval also counts the episodes solved within VisGym's number of turns (``maze_text.VISGYM_TURNS``):
vlrl's easy allows 30 turns, VisGym's harness 20, and the aim (easy >= 90 %) is stated against the latter."""

from __future__ import annotations

from vlrl.envs import maze_curriculum
from vlrl.envs.maze_curriculum import LevelPlan, level_config
from vlrl.envs.maze_sft_data import DetourRecorder
from vlrl.envs.maze_text import VISGYM_TURNS

CPU = ("model.device=cpu", "data.train_rows=8", "data.eval_rows=12")


def _expert_eval(tmp_path, monkeypatch, level: str, extras: str, max_context: int | None = None):
    """``evaluate`` on the level's eval split with the BFS expert (``extras``) playing instead of the policy, and
    the episodes it played; ``max_context``: the engine's context limit (None: the model's)."""
    from vlrl.train.run import Run

    played = []

    def expert(run, rows):
        played.extend(run.rollout(rows, seed=1, repeats=1, script=DetourRecorder()))
        return played

    monkeypatch.setattr(maze_curriculum, "greedy_rollouts", expert)
    run = Run(level_config(LevelPlan(level, 0, 0, overrides=(*CPU, f"data.extras={extras}")), tmp_path))
    try:
        if max_context is not None:
            run.engine.max_context = max_context
        return maze_curriculum.evaluate(run, 0, "expert"), played
    finally:
        run.close()


def test_episodes_solved_past_visgyms_budget_are_counted_apart(tmp_path, monkeypatch):
    result, played = _expert_eval(tmp_path, monkeypatch, "easy", '{"expert_noise":0.0,"expert_branch":0.1}')
    turns = [len(t.turns) for t in played]
    assert result.solved == result.episodes == 12  # the expert solves every maze within vlrl's 30 turns
    longer = sum(n > VISGYM_TURNS["easy"] for n in turns)
    assert 0 < longer < 12, turns  # its branch detours take some episodes past 20 turns, not all
    assert result.within_visgym == 12 - longer


def test_levels_visgym_lacks_have_no_such_count(tmp_path, monkeypatch):
    result, _ = _expert_eval(tmp_path, monkeypatch, "5x5", '{"expert_noise":0.0}')
    assert result.solved == 12 and result.within_visgym is None


def test_episodes_the_models_context_ends_are_counted(tmp_path, monkeypatch):
    """hard's 46 turns do not fit the small model's 4,096 tokens (turn 37, ~111 tokens a turn): the eval says how
    many episodes the context ended, where they would otherwise read as the policy's failures."""
    # a context below the longest 7x7 expert episode's (9-17 turns, 824-1,457 tokens on the tiny model)
    result, played = _expert_eval(tmp_path, monkeypatch, "7x7", '{"expert_noise":0.0}', max_context=900)
    cut = [t for t in played if t.stop_reason == "length"]
    assert 0 < len(cut) < 12, [len(t.turns) for t in played]
    assert result.cut_by_context == len(cut) and result.solved == 12 - len(cut)
