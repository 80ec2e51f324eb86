"""SFT episodes of the maze expert with its detours kept in the history but out of the loss.

The recovery expert (``expert_noise``, :func:`vlrl.envs.maze_text.expert_turns`) plays a detour now and
then and comes back. Trained on as they are, the detours teach the policy to make them (the sampled
policy inherits about ``expert_noise`` of random moves, which GRPO then has to undo); masked, the
policy still sees the mistake and the wall feedback in its context and learns only the way back
(DART-style noise injection with the noise turns out of the loss).

Takeover episodes (:func:`takeover_episodes`) put the policy's own mistakes in the history instead: the policy
(the run's engine, greedy) plays the first k turns of an episode, k drawn per row from 0 to ``turns``, then the
expert plays on from wherever that left the agent (DAgger-style: the states the policy reaches, labelled by the
expert). The policy's turns stay in the history but out of the loss, as detours do. Why: at easy the policy's
failures go down a wrong branch, come back, and take the same branch again (docs/maze.md item 19); the
expert's own detours are random branches, where these are the branches the policy believes in.

Two phases: the policy's turns on the engine, batched (:func:`policy_prefixes`), then the whole episode rendered
as an expert episode that replays those texts first (:func:`expert_episodes` with ``prefixes``), so the expert
farm's workers (``vlrl.envs.maze_sft_farm``) can build it. Why: rendered in the training process, every turn of
64 episodes one after another, a takeover step took 31 s on the H200 against 3.3 s for a step on a farm batch
(chain_v12). The replayed turns are the policy's texts re-tokenised, out of the loss: context, not training
targets (they match the engine's ids unless it sampled a non-canonical tokenisation).

Mazes picked for their forks (:func:`fork_rows`): a batch may take part of its rows from mazes whose shortest path
passes a fork where heading for the goal turns from the right way, the fork a maze policy misses most
(docs/maze.md item 28).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from vlrl.rollout.scripted import refuse_cut

if TYPE_CHECKING:
    from vlrl.envs.maze2d import Start


class DetourRecorder:
    """A rollout ``script`` (the maze expert) that records, per row seed, which of its turns were detours.

    ``prefixes``: per row seed, the texts of turns played first by someone else (the policy's, for takeover
    episodes), replayed as they are before the expert plays on and recorded as detours."""

    def __init__(self, prefixes: Mapping[Any, Sequence[str]] | None = None) -> None:
        self.detours: dict[Any, list[bool]] = {}
        self.prefixes = dict(prefixes or {})

    def __call__(self, env: Any, row: Mapping[str, Any]) -> Iterator[str]:
        from vlrl.envs.maze_text import expert_turns

        flags = self.detours.setdefault(row.get("seed"), [])
        flags.clear()
        for text in self.prefixes.get(row.get("seed"), ()):
            flags.append(True)
            yield text
        for text, detour in expert_turns(env, row):
            flags.append(detour)
            yield text


def first_turn_row(row: Any, start: Start = "corner") -> Any:
    """``row`` (an ``EnvRow``) cut to its first turn (``max_turns`` 1): the expert plays the shortest path's first
    move (a one-turn budget leaves no room for a detour and the way back), from the maze's ``start``."""
    extras = {**row.extras, "max_turns": 1} | ({"start": start} if start != "corner" else {})
    return dataclasses.replace(row, extras=extras)


def takeover_turns(seed: Any, turns: int) -> int:
    """How many turns the policy plays first on the row of ``seed``: drawn from 0 to ``turns``."""
    return random.Random(f"maze2d-takeover/{seed}").randint(0, turns)


def policy_prefixes(run: Any, rows: Sequence[Any], seed: int, *, turns: int) -> dict[Any, tuple[str, ...]]:
    """Per row seed, the texts of the first k turns the policy plays (``run.rollout`` on its engine, greedy:
    ``rollout.eval_temperature``, the states the eval reaches), k = :func:`takeover_turns`. The expert plays at
    least one turn: an episode that ends sooner (solved, a stop, the env's budget) leaves its last to the expert.
    Rows drawn k = 0 are not rolled out."""
    want = {_seed(r): takeover_turns(_seed(r), turns) for r in rows}
    played = [r for r in rows if want[_seed(r)] > 0]
    if not played:
        return {}
    temperature = run.cfg.rollout.eval_temperature
    caps = tuple(want[_seed(r)] + 1 for r in played)  # each row's k, and the turn left to the expert
    trajs = run.rollout(played, seed=seed, repeats=1, temperature=temperature, max_turns=caps)
    texts: dict[int, list[str]] = {}
    for t in trajs:  # (row, turn) order: several per row in step-wise mode
        texts.setdefault(t.group, []).extend(span.text for span in t.turns)
    out = {}
    for g, row in enumerate(played):
        got = texts.get(g, [])
        out[_seed(row)] = tuple(got[: max(0, min(want[_seed(row)], len(got) - 1))])
    return out


def mask_detours(trajs: Sequence[Any], seeds: Sequence[Any], detours: Mapping[Any, list[bool]]) -> list[Any]:
    """``trajs`` (multi-turn, one per row, ``t.group`` = the row's index in ``seeds``) with the loss mask
    cleared on the generated tokens of every detour turn."""
    out = []
    for t in trajs:
        flags = detours.get(seeds[t.group], [])
        mask, base = list(t.loss_mask), len(t.prompt_ids)
        for span, detour in zip(t.turns, flags, strict=False):
            if detour:
                mask[span.gen_start - base : span.gen_end - base] = [0] * (span.gen_end - span.gen_start)
        out.append(dataclasses.replace(t, loss_mask=tuple(mask)))
    return out


def has_away_fork(row: Any) -> bool:
    """Whether the expert's path through ``row``'s maze (an ``EnvRow`` of ``maze2d/<level>``) passes a fork where
    heading for the goal turns from the right way (``"away"`` of :func:`vlrl.envs.maze_solver.path_choices`)."""
    from vlrl.envs.maze_solver import path_choices
    from vlrl.envs.maze_text import make_maze2d

    env = make_maze2d(row.env_class.removeprefix("maze2d/"), row.extras, row.seed)
    env.init()
    game = env.gym_env.unwrapped
    return "away" in path_choices(game.maze_map, game.agent, game.target)


def fork_rows(rows: Sequence[Any], n: int, share: float) -> list[Any]:
    """``n`` of a batch's candidate ``rows``: up to ``round(n * share)`` with an away fork (:func:`has_away_fork`),
    then the rest in the order drawn (all from the rest when too few have one). Why: lease_v3's easy policy
    missed 41 % of such forks, and they are 3 % of an easy path's choices, so of the SFT's (docs/maze.md item 28)."""
    want = round(n * share)
    forky: list[Any] = []
    rest: list[Any] = []
    for row in rows:
        (forky if len(forky) < want and has_away_fork(row) else rest).append(row)
        if len(forky) == want and len(forky) + len(rest) >= n:
            break
    return forky + rest[: n - len(forky)]


def expert_episodes(
    run: Any,
    rows: Sequence[Any],
    seed: int,
    *,
    masked: bool,
    prefixes: Mapping[Any, Sequence[str]] | None = None,
    pick: tuple[int, float] | None = None,
) -> list[Any]:
    """One SFT batch's expert episodes of ``rows`` through ``run.rollout`` (after each row's ``prefixes``, if
    any: :class:`DetourRecorder`); detour turns out of the loss when ``masked``. ``pick`` ``(n, share)``: ``rows``
    are candidates, the batch :func:`fork_rows` of them (picked where the batch is built: a farm worker's, off the
    training loop, ~1.3 ms a candidate at easy)."""
    rows = fork_rows(rows, *pick) if pick else rows
    recorder = DetourRecorder(prefixes)
    trajs = run.rollout(rows, seed=seed, repeats=1, script=recorder)
    # hard's branch detours fill its 46 turns; the small model's 4,096 tokens hold ~36 (docs/maze.md item 30)
    refuse_cut(trajs, "expert SFT episodes", cap="data.extras.max_turns")
    if not masked:
        return trajs
    return mask_detours(trajs, [_seed(r) for r in rows], recorder.detours)


def takeover_episodes(run: Any, rows: Sequence[Any], seed: int, *, turns: int) -> list[Any]:
    """One SFT batch of takeover episodes of ``rows`` (module docstring), built in this process: the policy's
    turns (:func:`policy_prefixes`), then the expert's; the policy's out of the loss."""
    prefixes = policy_prefixes(run, rows, seed, turns=turns)
    return expert_episodes(run, rows, seed, masked=True, prefixes=prefixes)


def _seed(row: Any) -> Any:
    return row.get("seed") if isinstance(row, Mapping) else getattr(row, "seed", None)
