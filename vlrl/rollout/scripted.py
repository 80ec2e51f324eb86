"""A scripted policy: plays given assistant texts through the rollout path, as if generated.

Used for expert trajectories (SFT data from the maze BFS solver, color_square answers) and for
golden files, whose actions must be readable and stable. The texts are tokenised with the
checkpoint's tokenizer and end with ``<|im_end|>`` unless a stop string, ``max_tokens`` or the
context ends them first — the same rules the engines apply. Logprobs are NaN unless a ``scorer``
is given (NaN, not 0: a scripted trajectory fed to a policy-gradient loss by mistake fails loudly).
A ``None`` in the script hands that turn to ``fallback`` (the rollout's engine): the policy plays it, and the
script may go on from whatever state that left (the maze's takeover episodes, ``vlrl.envs.maze_sft_data``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Iterator, Sequence

from vlrl.engines.types import FinishReason, Generation, SamplingParams
from vlrl.errors import ConfigError, VlrlError
from vlrl.render.types import RenderedPrompt
from vlrl.rollout.episode import Policy

Scorer = Callable[[RenderedPrompt, Sequence[int], float], Sequence[float]]
"""``(prompt, token_ids, temperature) -> logprobs`` under the engine logprob contract."""


class ScriptExhaustedError(VlrlError):
    """The episode asked for more turns than the script holds."""


def _apply_stop(text: str, params: SamplingParams) -> tuple[str, str | None]:
    """Cut ``text`` at the earliest stop string (kept if ``include_stop_str_in_output``)."""
    hits = [(text.find(s), s) for s in params.stop if s and text.find(s) >= 0]
    if not hits:
        return text, None
    at, stop = min(hits)
    return (text[: at + len(stop)] if params.include_stop_str_in_output else text[:at]), stop


def scripted_generation(tokenizer, text: str, params: SamplingParams, room: int) -> Generation:
    """``text`` as an engine would have generated it with ``room`` tokens of context left: cut at the earliest stop
    string, ``<|im_end|>`` appended when none cut it, cut to ``max_tokens`` or ``room`` (``length``); NaN logprobs."""
    text, stop = _apply_stop(text, params)
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    finish: FinishReason = "stop"
    reason: str | int | None = stop
    if stop is None:
        eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
        ids.append(eos)
        reason = eos
    budget = min(params.max_tokens, room)
    if len(ids) > budget:
        ids, finish, reason = ids[:budget], "length", None
    return Generation(
        token_ids=tuple(ids),
        logprobs=(math.nan,) * len(ids),
        finish_reason=finish,
        stop_reason=reason,
        text=tokenizer.decode(ids, skip_special_tokens=True),
        meta={"scripted": True},
    )


class ScriptedPolicy:
    """``agenerate(prompt, params)`` returning the next scripted text as a :class:`Generation`."""

    def __init__(
        self,
        texts: Iterable[str | None],
        tokenizer,
        *,
        max_context: int,
        scorer: Scorer | None = None,
        fallback: Policy | None = None,
    ):
        self._texts: Iterator[str | None] = iter(texts)  # lazy: an expert may read the env as the episode goes
        self.tokenizer = tokenizer
        self.max_context = max_context
        self.scorer = scorer
        self.fallback = fallback

    def generation(self, prompt: RenderedPrompt, params: SamplingParams, text: str) -> Generation:
        gen = scripted_generation(self.tokenizer, text, params, self.max_context - len(prompt.token_ids))
        gen = dataclasses.replace(gen, prompt_len=len(prompt))
        if self.scorer is None:
            return gen
        logprobs = tuple(float(x) for x in self.scorer(prompt, list(gen.token_ids), params.temperature))
        return dataclasses.replace(gen, logprobs=logprobs)

    async def agenerate(self, prompt: RenderedPrompt, params: SamplingParams) -> Generation:
        try:
            text = next(self._texts)
        except StopIteration:
            raise ScriptExhaustedError("the scripted episode ran out of assistant texts") from None
        if text is None:
            if self.fallback is None:
                raise VlrlError("the script handed a turn to the engine, but this rollout has no engine")
            return await self.fallback.agenerate(prompt, params)
        return self.generation(prompt, params, text)


def refuse_cut(trajs: Sequence, what: str, *, cap: str = "rollout.max_turns") -> None:
    """Raise where the context ended a scripted (expert) episode before its env did: SFT would train on an episode
    that never reaches its end, silently (at maze hard 56 of 64 did, docs/maze.md item 30). Names the turns that
    fit and ``cap``, the setting that bounds them."""
    cut = [t for t in trajs if t.stop_reason == "length"]
    if cut:
        fits = min(len(t.turns) for t in cut) - 1  # the last turn may be the one the context cut
        raise ConfigError(
            f"{len(cut)} of {len(trajs)} {what} outgrew the model's context after {fits} turns, before the env "
            f"ended them: set {cap} to {fits} or fewer, or use a model with a longer context"
        )
