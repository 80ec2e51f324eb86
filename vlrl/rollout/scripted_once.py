"""Scripted episodes played to the end first, then rendered once.

The rollout path (:meth:`vlrl.rollout.episode.EpisodeRunner.run`) renders the whole conversation again every turn:
message preparation, chat template and tokenizer grow with the conversation, so an episode's render work grows
with the square of its turns. On maze2d/easy the expert SFT batches that the farm's CPU workers built that way
fell behind the GPU's steps (83-100 % fresh batches); built this way, 8 workers keep pace (docs/maze.md, item 23).
A scripted episode without a scorer never
reads its prompts, so it can play the env to the end and render the finished conversation once; the trajectory
is cut from that one render at the assistant turns: the first render's ids, then each turn's scripted ids (made
and closed by the rollout path's own code: ``scripted_generation``, ``EpisodeRunner.closed``) and the tokens
between turns.

That is the rollout path's trajectory token for token when the template renders history as the rollout path
splices it. Here the first render and each turn's scripted ids are checked against the one render; a template
that rewrites history further on is not caught here but by the rollout path's splice check
(``vlrl.rollout.splice``), which every policy rollout (evals among them) runs each turn. What this path does not
reproduce, it hands back (``None``) and the caller plays the episode the per-turn way, which stays the reference:
a turn the script leaves to the engine (``None``) or does not hold, a text longer than ``max_tokens``, an env that
raises, an observation that does not render, a render that differs from the scripted ids (a text starting with a
newline merges with ``assistant\\n``; a text a special token ends is left unclosed), a conversation longer than the
context. Measured on maze2d/easy and
compared with the rollout path: ``benchmarks/expert_render_once.py``; tested: ``tests/rollout/test_scripted_once.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from vlrl.render.types import RenderedPrompt
from vlrl.rollout.episode import (
    EpisodeRunner,
    EpisodeSpec,
    Outcome,
    PlayedTurn,
    TokenSeq,
    build_trajectory,
    refuse_no_room,
)
from vlrl.rollout.scripted import scripted_generation
from vlrl.rollout.types import Trajectory


async def play_once(
    runner: EpisodeRunner, env: Any, messages: list[dict], texts: Iterable[str | None], spec: EpisodeSpec
) -> Trajectory | None:
    """The episode of ``texts`` from the env's first ``messages`` (multi-turn), or None where only the rollout
    path can play it (module docstring)."""
    try:
        first = await runner.renderer.arender(messages)
    except Exception:  # noqa: BLE001 — the rollout path meets it again and says what it was
        return None
    refuse_no_room(first, spec)  # the rollout path's own check: a configuration error, raised either way
    out = Outcome()
    convo, played = _play(runner, first, env, list(messages), iter(texts), spec, out)
    if not played:
        return None
    try:
        final = await runner.renderer.arender(convo, add_generation_prompt=False)
    except Exception:  # noqa: BLE001 — as above
        return None
    seq = _cut(runner, first.token_ids, final, played)
    if seq is None or len(seq) > spec.max_context:  # within it, no turn was cut and every end of turn appended
        return None
    return build_trajectory(spec.uid, spec, seq, out, convo)


def _play(
    runner: EpisodeRunner,
    first: RenderedPrompt,
    env: Any,
    convo: list[dict],
    texts: Iterator[str | None],
    spec: EpisodeSpec,
    out: Outcome,
) -> tuple[list[dict], list[PlayedTurn]]:
    """Step the env through the script: the conversation to its last assistant turn, and the turns played, made and
    closed as the rollout path makes them (none when a turn needs the rollout path; each turn's prompt is ``first``
    until :func:`_cut` finds it)."""
    played = []
    for k in range(spec.max_turns):
        text = next(texts, None)
        if text is None:  # the engine's turn, or the script ran out
            return convo, []
        gen = scripted_generation(runner.tokenizer, text, spec.params[k], spec.params[k].max_tokens)
        if gen.finish_reason == "length":  # cut by max_tokens
            return convo, []
        turn = runner.closed(first, gen, room=True)  # the room is checked on the whole sequence at the end
        try:
            result = env.step(turn.text)
        except Exception:  # noqa: BLE001 — the rollout path ends the episode on it (env_error)
            return convo, []
        turn.reward = result.reward
        played.append(turn)
        out.metas.append(dict(result.metadata))
        out.versions.add(gen.weight_version)
        convo.append({"role": "assistant", "content": turn.text})
        if result.done or k + 1 == spec.max_turns:
            out.stop = "done" if result.done else "max_turns"
            break
        convo += list(result.observations)
    return convo, played


def _cut(runner: EpisodeRunner, first: Sequence[int], final: Any, played: list[PlayedTurn]) -> TokenSeq | None:
    """The sequence the rollout path would have built, from the one render ``final`` (None if it differs)."""
    ids = tuple(final.token_ids)
    starts = _assistant_starts(runner, ids)
    if len(starts) != len(played) or starts[0] != len(first) or ids[: len(first)] != tuple(first):
        return None
    seq = TokenSeq(prompt_ids=ids[: starts[0]], render=final, placeholders=final.placeholders)
    obs_start = 0
    for k, (turn, start) in enumerate(zip(played, starts, strict=True)):
        if ids[start : start + len(turn.tokens)] != turn.tokens:  # e.g. a text a special token ends, left unclosed
            return None
        obs = ids[len(seq) : start]
        seq.extend(obs, [0] * len(obs), [0.0] * len(obs))
        shown = tuple(p for p in final.placeholders if p.offset < start)
        turn.prompt = dataclasses.replace(final, token_ids=ids[:start], placeholders=shown)
        turn.gen = dataclasses.replace(turn.gen, prompt_len=start)
        seq.add_turn(k, turn, obs_start)
        obs_start = len(seq)
    return seq


def _assistant_starts(runner: EpisodeRunner, ids: Sequence[int]) -> list[int]:
    """Where each assistant turn's content starts: after each ``<|im_start|>assistant\\n``."""
    header = runner.assistant_header
    n = len(header)
    return [i + n for i, t in enumerate(ids) if t == header[0] and tuple(ids[i : i + n]) == header]
