"""One episode: env ↔ renderer ↔ policy, turn by turn, into :class:`Trajectory` objects.

Multi-turn mode builds one token sequence (see :mod:`vlrl.rollout.splice` for how each turn's
prompt extends the last); step-wise mode makes one trajectory per turn from that turn's render.
Errors of the env, of its observations and of the engine end the episode (stop reason and
``error`` say which); a :class:`~vlrl.rollout.splice.PrefixError` escapes, because a template that
rewrites history poisons every episode.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Protocol

from vlrl.engines.types import Generation, SamplingParams
from vlrl.errors import BadInputError, ContextOverflowError
from vlrl.render.types import PlaceholderRange, RenderedPrompt, Renderer
from vlrl.rollout.splice import check_earlier_images, shift_placeholders, splice_turn
from vlrl.rollout.types import StopReason, Trajectory, TurnSpan


class Policy(Protocol):
    async def agenerate(self, prompt: RenderedPrompt, params: SamplingParams) -> Generation: ...


@dataclass(frozen=True)
class EpisodeSpec:
    """What one episode needs besides the parts: its id, group, turn budget and per-turn sampling."""

    uid: str
    group: int
    max_turns: int
    max_context: int
    params: tuple[SamplingParams, ...]
    """One per turn (per-turn seeds)."""
    step_wise: bool = False


@dataclass
class PlayedTurn:
    prompt: RenderedPrompt
    gen: Generation
    tokens: tuple[int, ...]
    """The generated ids, plus ``<|im_end|>`` when appended."""
    eos_appended: bool
    text: str
    reward: float = 0.0


@dataclass
class TokenSeq:
    """A growing token sequence with its per-token fields (the response part only)."""

    prompt_ids: tuple[int, ...]
    render: RenderedPrompt
    """The last render spliced in: its vision tensors cover every image of the sequence."""
    placeholders: tuple[PlaceholderRange, ...]
    """Image placeholders in sequence coordinates."""
    response: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    tops: list[tuple] = field(default_factory=list)
    spans: list[TurnSpan] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.response)

    def prompt(self) -> RenderedPrompt:
        """What the engine is asked to continue: the sequence so far with all its images."""
        return dataclasses.replace(
            self.render, token_ids=self.prompt_ids + tuple(self.response), placeholders=self.placeholders
        )

    def extend(self, tokens, mask, logprobs) -> None:
        self.response.extend(tokens)
        self.mask.extend(mask)
        self.logprobs.extend(logprobs)
        self.rewards.extend([0.0] * len(tokens))
        self.tops.extend([()] * len(tokens))

    def add_turn(self, k: int, turn: PlayedTurn, obs_start: int) -> None:
        n_gen = len(turn.gen.token_ids)
        gen_start = len(self)
        self.extend(
            turn.tokens,
            [1] * n_gen + [0] * turn.eos_appended,
            [float(x) for x in turn.gen.logprobs] + [0.0] * turn.eos_appended,
        )
        # The turn's reward sits on its last generated token (on the appended end of turn when a
        # stop string cut the reply to nothing; the episode return is the same either way).
        if turn.tokens:
            self.rewards[gen_start - len(self.prompt_ids) + max(n_gen, 1) - 1] = turn.reward
        at = gen_start - len(self.prompt_ids)
        self.tops[at : at + len(turn.gen.top_logprobs)] = list(turn.gen.top_logprobs)
        self.spans.append(
            TurnSpan(
                index=k,
                obs_start=obs_start,
                gen_start=gen_start,
                gen_end=len(self),
                reward=turn.reward,
                finish_reason=turn.gen.finish_reason,
                eos_appended=turn.eos_appended,
                text=turn.text,
                images_before=turn.prompt.n_images,
            )
        )


@dataclass
class Outcome:
    stop: StopReason = "max_turns"
    error: str | None = None
    metas: list[dict[str, Any]] = field(default_factory=list)
    versions: set[int] = field(default_factory=set)


class EpisodeRunner:
    """Plays an env to the end with a policy (see the module docstring for what ends an episode)."""

    def __init__(self, renderer: Renderer, tokenizer: Any):
        self.renderer = renderer
        self.tokenizer = tokenizer
        self.end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.terminators = {self.end_id, tokenizer.convert_tokens_to_ids("<|endoftext|>")}
        self.assistant_header = tuple(tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False))
        """What opens an assistant turn (where a render's turns are found: ``vlrl.rollout.scripted_once``)."""

    async def run(self, env, messages: list[dict], policy: Policy, spec: EpisodeSpec) -> list[Trajectory]:
        """Play from the env's first messages; one trajectory (multi-turn) or one per turn (step-wise)."""
        try:
            render = await self.renderer.arender(messages)
        except BadInputError as exc:
            return [failed_episode(spec, messages, f"the env's first observation cannot be rendered: {exc}")]
        except Exception as exc:  # noqa: BLE001 — a renderer server that went away ends this episode only
            return [
                failed_episode(spec, messages, f"the renderer failed: {type(exc).__name__}: {exc}", stop="engine_error")
            ]
        refuse_no_room(render, spec)
        if spec.step_wise:
            return await self._run_steps(env, messages, render, policy, spec)
        seq = TokenSeq(prompt_ids=render.token_ids, render=render, placeholders=render.placeholders)
        out = Outcome()
        obs_start, pending = 0, []
        for k in range(spec.max_turns):
            if len(seq) >= spec.max_context:
                out.stop = "length"
                break
            turn = await self._turn(policy, seq.prompt(), spec, k, out)
            if turn is None:
                break
            result = self._step(env, turn, out)
            seq.add_turn(k, turn, obs_start)
            assistant = {"role": "assistant", "content": turn.text}
            pending = [assistant]
            if result is None or self._ended(result, k, spec, out):
                break
            obs_start = len(seq)
            if not await self._extend(seq, messages + [assistant] + list(result.observations), turn.text, k, spec, out):
                break
            messages, pending = messages + [assistant] + list(result.observations), []
        # The trajectory's conversation holds what its tokens hold (a dropped observation is left out).
        return [build_trajectory(spec.uid, spec, seq, out, messages + pending)]

    # ------------------------------------------------------------------ pieces of a turn

    async def _turn(
        self, policy: Policy, prompt: RenderedPrompt, spec: EpisodeSpec, k: int, out: Outcome
    ) -> PlayedTurn | None:
        try:
            gen = await policy.agenerate(prompt, spec.params[k])
        except Exception as exc:  # noqa: BLE001 — a failed engine ends this episode, keeping its turns
            out.stop, out.error = "engine_error", f"turn {k}: {type(exc).__name__}: {exc}"
            return None
        out.versions.add(gen.weight_version)
        return self.closed(prompt, gen, len(prompt) + len(gen.token_ids) < spec.max_context)

    def closed(self, prompt: RenderedPrompt, gen: Generation, room: bool) -> PlayedTurn:
        """The turn ``gen`` makes: its ids, ``<|im_end|>`` appended when generation did not end with a terminator
        (stop string, stop token, max_tokens) and the context has ``room`` for it (the template closes every
        assistant turn with it), and the text the conversation gets (the ids before a terminator)."""
        ids = tuple(gen.token_ids)
        ended = bool(ids) and ids[-1] in self.terminators
        body = ids[:-1] if ended else ids
        append = not ended and room
        text = self.tokenizer.decode(list(body), skip_special_tokens=False)
        return PlayedTurn(prompt, gen, ids + ((self.end_id,) if append else ()), append, text)

    @staticmethod
    def _step(env, turn: PlayedTurn, out: Outcome):
        try:
            result = env.step(turn.text)
        except Exception as exc:  # noqa: BLE001 — an env bug ends this episode only
            out.stop, out.error = "env_error", f"env.step raised {type(exc).__name__}: {exc}"
            return None
        turn.reward = result.reward
        out.metas.append(dict(result.metadata))
        return result

    @staticmethod
    def _ended(result, k: int, spec: EpisodeSpec, out: Outcome) -> bool:
        if result.done:
            out.stop = "done"
            return True
        if k + 1 == spec.max_turns:
            out.stop = "max_turns"
            return True
        return False

    async def _extend(
        self, seq: TokenSeq, messages: list[dict], text: str, k: int, spec: EpisodeSpec, out: Outcome
    ) -> bool:
        """Re-render with the new observations and splice them onto the sequence if they fit."""
        try:
            new = await self.renderer.arender(messages)
        except BadInputError as exc:
            out.stop, out.error = "env_error", f"turn {k}: the env's observation cannot be rendered: {exc}"
            return False
        except Exception as exc:  # noqa: BLE001 — a renderer server that went away ends this episode only
            out.stop, out.error = "engine_error", f"turn {k}: the renderer failed: {type(exc).__name__}: {exc}"
            return False
        splice = splice_turn(self.tokenizer, seq.render, new, text, k)
        if len(seq) + len(splice.obs_tokens) >= spec.max_context:
            out.stop = "length"  # the observation is dropped: tensors stay those of the kept images
            return False
        delta = len(seq) - splice.obs_start_in_render
        seq.placeholders += shift_placeholders(new.placeholders[seq.render.n_images :], delta)
        n = len(splice.obs_tokens)
        seq.extend(splice.obs_tokens, [0] * n, [0.0] * n)
        seq.render = new
        return True

    # ------------------------------------------------------------------ step-wise

    async def _run_steps(
        self, env, messages: list[dict], render: RenderedPrompt, policy: Policy, spec: EpisodeSpec
    ) -> list[Trajectory]:
        """One trajectory per turn: prompt = that turn's render, response = its generated tokens."""
        out, seqs = Outcome(), []
        for k in range(spec.max_turns):
            if len(render) >= spec.max_context:
                out.stop = "length"
                break
            turn = await self._turn(policy, render, spec, k, out)
            if turn is None:
                break
            result = self._step(env, turn, out)
            seq = TokenSeq(prompt_ids=render.token_ids, render=render, placeholders=render.placeholders)
            seq.add_turn(k, turn, 0)
            seqs.append((seq, messages + [{"role": "assistant", "content": turn.text}]))
            if result is None or self._ended(result, k, spec, out):
                break
            messages = seqs[-1][1] + list(result.observations)
            prev = render
            try:
                render = await self.renderer.arender(messages)
            except BadInputError as exc:
                out.stop, out.error = "env_error", f"turn {k}: the env's observation cannot be rendered: {exc}"
                break
            except Exception as exc:  # noqa: BLE001 — as in multi-turn mode: the renderer's failure, not the env's
                out.stop, out.error = "engine_error", f"turn {k}: the renderer failed: {type(exc).__name__}: {exc}"
                break
            check_earlier_images(prev, render, k, offsets=False)  # a PrefixError escapes, as in multi-turn
        episode_return = sum(s.spans[0].reward for s, _ in seqs)
        trajs = [
            build_trajectory(f"{spec.uid}/t{k}", spec, s, out, m, step_of=spec.uid) for k, (s, m) in enumerate(seqs)
        ]
        for t in trajs:
            t.metrics["episode_return"] = episode_return
        return trajs


def _metrics(seq: TokenSeq, out: Outcome) -> dict[str, Any]:
    valid = [m["valid_action"] for m in out.metas if isinstance(m.get("valid_action"), bool)]
    metrics: dict[str, Any] = {
        "return": float(sum(s.reward for s in seq.spans)),
        "turns": len(seq.spans),
        "stop_reason": out.stop,
    }
    if valid:
        metrics["valid_action_rate"] = sum(valid) / len(valid)
    if out.metas and "terminated" in out.metas[-1]:
        metrics["terminated"] = bool(out.metas[-1]["terminated"])
    if len(out.versions) > 1:
        metrics["weight_versions"] = sorted(out.versions)
    return metrics


def build_trajectory(
    uid: str, spec: EpisodeSpec, seq: TokenSeq, out: Outcome, messages: list[dict], step_of: str | None = None
) -> Trajectory:
    r = seq.render
    return Trajectory(
        uid=uid,
        group=spec.group,
        prompt_ids=seq.prompt_ids,
        response_ids=tuple(seq.response),
        loss_mask=tuple(seq.mask),
        logprobs=tuple(seq.logprobs),
        rewards=tuple(seq.rewards),
        pixel_values=r.pixel_values,
        image_grid_thw=r.image_grid_thw,
        placeholders=seq.placeholders,
        image_hashes=r.image_hashes,
        turns=tuple(seq.spans),
        stop_reason=out.stop,
        temperature=spec.params[0].temperature if spec.params else 1.0,
        messages=tuple(messages),
        metrics=_metrics(seq, out),
        error=out.error,
        weight_version=min(out.versions, default=0),
        step_of=step_of,
        top_logprobs=tuple(seq.tops) if any(seq.tops) else (),
    )


def failed_episode(spec: EpisodeSpec, messages: list[dict], error: str, stop: StopReason = "env_error") -> Trajectory:
    """An episode that ended before its first turn: no tokens, ``stop`` and ``error`` say why."""
    return Trajectory(
        uid=spec.uid,
        group=spec.group,
        prompt_ids=(),
        response_ids=(),
        loss_mask=(),
        logprobs=(),
        rewards=(),
        pixel_values=None,
        image_grid_thw=None,
        placeholders=(),
        image_hashes=(),
        turns=(),
        stop_reason=stop,
        temperature=spec.params[0].temperature if spec.params else 1.0,
        messages=tuple(messages),
        metrics={"return": 0.0, "turns": 0, "stop_reason": stop},
        error=error,
    )


def refuse_no_room(render: RenderedPrompt, spec: EpisodeSpec) -> None:
    """The first observation must leave room for one generated token: a context too small for it is the
    run's configuration, not this episode's outcome (it would give a run that generates nothing)."""
    if spec.max_turns > 0 and len(render) >= spec.max_context:
        raise ContextOverflowError(
            len(render),
            spec.max_context,
            (
                f"the env's first observation renders to {len(render)} tokens ({render.n_images} image(s)), "
                f"which leaves no room to generate in a context of {spec.max_context} tokens: use a model (or "
                f"max_context) with more than {len(render)} tokens, or a smaller first observation"
            ),
        )
