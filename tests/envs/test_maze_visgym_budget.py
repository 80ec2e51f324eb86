"""The curriculum's eval also counts the episodes solved within VisGym's number of turns (``maze_text.VISGYM_TURNS``):
vlrl's easy allows 30 turns, VisGym's harness 20, and the aim (easy >= 90 %) is stated against the latter."""

from __future__ import annotations

from vlrl.envs import maze_curriculum
from vlrl.envs.maze_curriculum import LevelPlan, level_config
from vlrl.envs.maze_sft_data import DetourRecorder
from vlrl.envs.maze_text import VISGYM_TURNS

CPU = ("model.device=cpu", "data.train_rows=8", "data.eval_rows=12")


def _expert_eval(tmp_path, monkeypatch, level: str, extras: str):
    """``evaluate`` on the level's eval split with the BFS expert (``extras``) playing instead of the policy."""
    from vlrl.train.run import Run

    played = []

    def expert(run, rows):
        played.extend(run.rollout(rows, seed=1, repeats=1, script=DetourRecorder()))
        return played

    monkeypatch.setattr(maze_curriculum, "greedy_rollouts", expert)
    run = Run(level_config(LevelPlan(level, 0, 0, overrides=(*CPU, f"data.extras={extras}")), tmp_path))
    try:
        return maze_curriculum.evaluate(run, 0, "expert"), [len(t.turns) for t in played]
    finally:
        run.close()


def test_episodes_solved_past_visgyms_budget_are_counted_apart(tmp_path, monkeypatch):
    result, turns = _expert_eval(tmp_path, monkeypatch, "easy", '{"expert_noise":0.0,"expert_branch":0.1}')
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
    from vlrl.train.run import Run

    played = []

    def expert(run, rows):
        played.extend(run.rollout(rows, seed=1, repeats=1, script=DetourRecorder()))
        return played

    monkeypatch.setattr(maze_curriculum, "greedy_rollouts", expert)
    run = Run(level_config(LevelPlan("7x7", 0, 0, overrides=(*CPU, 'data.extras={"expert_noise":0.0}')), tmp_path))
    try:
        run.engine.max_context = 900  # the engine's own limit, set low: a 7x7 expert needs 9-17 turns
        result = maze_curriculum.evaluate(run, 0, "expert")
    finally:
        run.close()
    cut = [t for t in played if t.stop_reason == "length"]
    assert 0 < len(cut) < 12, [len(t.turns) for t in played]
    assert result.cut_by_context == len(cut) and result.solved == 12 - len(cut)
