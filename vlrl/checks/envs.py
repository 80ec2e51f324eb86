"""Env conformance: ``check_env(factory)`` runs an env through its contract and lists what breaks.

``factory(seed) -> Env`` (or a registered env name). Checks, each by name in the report:

- ``construct``/``init``: the factory and ``init`` work; ``init`` returns ``(list of messages, dict)``.
- ``types``: ``step`` returns a :class:`~vlrl.envs.StepResult` (finite float reward, bool done, dict metadata).
- ``messages``: every message list passes ``validate_messages`` and is JSON-serialisable; ``images``:
  every image part decodes and its sides lie in ``[min_image_side, max_image_side]``.
- ``done``: observations are empty exactly when done; episodes end within ``max_turns`` steps;
  ``step_after_done`` raises :class:`~vlrl.envs.EpisodeDoneError`.
- ``determinism``: the same seed and actions give identical messages (image bytes included),
  rewards and done flags.
- ``close``: ``close()`` twice raises nothing.
- ``hostile``: hostile texts (fixed corpus + hypothesis) never raise and keep the contract;
  ``no_execution``: while stepping them nothing executes text or writes files (see
  :mod:`vlrl.checks.hostile`); ``canary``: no canary payload left a trace. ``slow``: no step over
  ``max_step_seconds``.
"""

from __future__ import annotations

import json
import math
import random
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vlrl.envs.contract import PLACEHOLDER_PROMPT, Env, EpisodeDoneError, StepResult
from vlrl.errors import BadInputError, VlrlError
from vlrl.messages import IMAGE_PART_TYPES, iter_parts, load_image, validate_messages

CHECKS: tuple[str, ...] = (
    "construct",
    "init",
    "types",
    "messages",
    "images",
    "done",
    "step_after_done",
    "determinism",
    "close",
    "hostile",
    "no_execution",
    "canary",
    "slow",
)
"""The names a failure is filed under (:attr:`CheckFailure.check`), in the order :func:`check_env` runs them."""

GENERIC_ACTIONS = [
    "<action>left</action>",
    "<action>stop</action>",
    "('move', 0)",
    "<answer>red</answer>",
    "\\boxed{1}",
    "hello",
]


@dataclass(frozen=True)
class CheckFailure:
    check: str
    detail: str


@dataclass(frozen=True)
class EnvCheckReport:
    """What :func:`check_env` found. ``ok`` when ``failures`` is empty."""

    name: str
    checks: tuple[str, ...]
    failures: tuple[CheckFailure, ...]
    n_steps: int
    n_hostile: int
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.failures

    def summary(self) -> str:
        head = (
            f"{self.name}: {'PASS' if self.ok else 'FAIL'} ({len(self.checks)} checks, {self.n_steps} steps, "
            f"{self.n_hostile} hostile texts, {self.seconds:.1f}s)"
        )
        return "\n".join([head, *(f"  [{f.check}] {f.detail}" for f in self.failures)])


class EnvConformanceError(VlrlError, AssertionError):
    """Raised by :func:`check_env` when an env fails; ``report`` holds the details."""

    def __init__(self, report: EnvCheckReport):
        self.report = report
        super().__init__(report.summary())


def _short(text: Any, n: int = 80) -> str:
    s = repr(text)
    return s if len(s) <= n else f"{s[:n]}... ({len(text) if isinstance(text, str) else '?'} chars)"


class _Checker:
    """State of one check_env run: options, failures, counters."""

    def __init__(
        self,
        factory: Callable[[int], Env],
        *,
        prompt: list[dict[str, Any]],
        min_side: int,
        max_side: int,
        max_step_seconds: float,
    ):
        self.factory, self.prompt = factory, prompt
        self.min_side, self.max_side, self.max_step_seconds = min_side, max_side, max_step_seconds
        self.failures: list[CheckFailure] = []
        self.n_steps = 0

    def fail(self, check: str, detail: str) -> None:
        if len([f for f in self.failures if f.check == check]) < 5:  # the first few of a kind say enough
            self.failures.append(CheckFailure(check, detail))

    # ---------------------------------------------------------------- pieces

    def start(self, seed: int) -> tuple[Env | None, list[Any]]:
        """Make and init an env; returns it (None on failure) and the canonical init messages."""
        try:
            env = self.factory(seed)
        except Exception as exc:  # noqa: BLE001 — any failure of the env is a finding, not a crash
            self.fail("construct", f"factory({seed}) raised {type(exc).__name__}: {exc}")
            return None, []
        max_turns = getattr(env, "max_turns", None)
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or not 1 <= max_turns <= 10_000:
            self.fail("types", f"max_turns must be an int in 1..10000, got {max_turns!r}")
            return None, []
        try:
            out = env.init([dict(m) for m in self.prompt])
        except Exception as exc:  # noqa: BLE001 — any failure of the env is a finding, not a crash
            self.fail("init", f"init raised {type(exc).__name__}: {exc}")
            return None, []
        if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], list) and isinstance(out[1], dict)):
            self.fail("init", f"init must return (list of messages, dict), got {type(out).__name__}")
            return None, []
        self.check_messages(out[0], "init")
        return env, [self.canon(out[0], "init")]

    def check_messages(self, messages: list[Any], where: str) -> None:
        try:
            validate_messages(messages)
        except BadInputError as exc:
            self.fail("messages", f"{where}: {exc}")
            return
        for mi, pi, part in iter_parts(messages):
            if part.get("type") not in IMAGE_PART_TYPES:
                continue
            try:
                image = load_image(part, message_index=mi, part_index=pi)
            except BadInputError as exc:
                self.fail("images", f"{where}: {exc}")
                continue
            if not all(self.min_side <= side <= self.max_side for side in image.size):
                self.fail(
                    "images",
                    f"{where}: image {image.size[0]}x{image.size[1]} outside "
                    f"[{self.min_side}, {self.max_side}] px per side",
                )

    def canon(self, messages: Any, where: str) -> str:
        try:
            return json.dumps(messages, sort_keys=True)
        except (TypeError, ValueError) as exc:
            self.fail("messages", f"{where}: messages are not JSON-serialisable ({exc})")
            return repr(messages)

    def step(self, env: Env, text: str, where: str) -> StepResult | None:
        """One checked step; None when it raised or broke the contract."""
        t0 = time.perf_counter()
        try:
            result = env.step(text)
        except Exception as exc:  # noqa: BLE001 — any failure of the env is a finding, not a crash
            self.fail(
                "hostile" if where.startswith("hostile") else "step",
                f"{where}: step({_short(text)}) raised {type(exc).__name__}: {_short(str(exc), 200)}",
            )
            return None
        finally:
            self.n_steps += 1
        elapsed = time.perf_counter() - t0
        if elapsed > self.max_step_seconds:
            self.fail("slow", f"{where}: step({_short(text)}) took {elapsed:.1f}s")
        if not isinstance(result, StepResult):
            self.fail("types", f"{where}: step returned {type(result).__name__}, not StepResult")
            return None
        if not math.isfinite(result.reward):
            self.fail("types", f"{where}: reward {result.reward} is not finite")
        if result.done and result.observations:
            self.fail("done", f"{where}: done=True but {len(result.observations)} observation(s) returned")
        if not result.done:
            if not result.observations:
                self.fail("done", f"{where}: not done but no observations to continue from")
            else:
                self.check_messages(result.observations, where)
        try:
            json.dumps(result.metadata)
        except (TypeError, ValueError) as exc:
            self.fail("types", f"{where}: metadata is not JSON-serialisable ({exc})")
        return result

    def after_done(self, env: Env, where: str) -> None:
        try:
            env.step("<action>stop</action>")
        except EpisodeDoneError:
            return
        except Exception as exc:  # noqa: BLE001 — any failure of the env is a finding, not a crash
            self.fail(
                "step_after_done",
                f"{where}: step after done raised {type(exc).__name__} instead of EpisodeDoneError: {_short(str(exc))}",
            )
            return
        self.fail("step_after_done", f"{where}: step after done returned instead of raising EpisodeDoneError")

    def close(self, env: Env, where: str) -> None:
        try:
            env.close()
            env.close()
        except Exception as exc:  # noqa: BLE001 — any failure of the env is a finding, not a crash
            self.fail("close", f"{where}: close() twice raised {type(exc).__name__}: {exc}")

    # ---------------------------------------------------------------- phases

    def episode(self, seed: int, script: Sequence[str]) -> list[Any] | None:
        """Play ``script`` (cycled) from ``seed`` to done; return the transcript for determinism checks."""
        env, transcript = self.start(seed)
        if env is None:
            return None
        where = f"seed {seed}"
        done = False
        for turn in range(env.max_turns + 1):
            result = self.step(env, script[turn % len(script)], f"{where} turn {turn + 1}")
            if result is None:
                break
            transcript.append([self.canon(result.observations, where), result.reward, result.done])
            if result.done:
                done = True
                break
        else:
            self.fail("done", f"{where}: not done after max_turns={env.max_turns} steps")
        if done:
            self.after_done(env, where)
        self.close(env, where)
        return transcript

    def determinism(self, seed: int, n_episodes: int, actions: Sequence[str]) -> None:
        """Each of ``n_episodes`` seeds played twice with the same random script must give the same transcript."""
        for k in range(n_episodes):
            script = random.Random(seed + k).choices(actions, k=64)
            first, second = self.episode(seed + k, script), self.episode(seed + k, script)
            if first is not None and second is not None and first != second:
                at = next((i for i, (a, b) in enumerate(zip(first, second)) if a != b), min(len(first), len(second)))
                self.fail(
                    "determinism",
                    f"seed {seed + k}: two runs with the same actions differ at {'init' if at == 0 else f'turn {at}'}",
                )

    def hostile(self, texts: Sequence[str], seed: int, sentinel: Any) -> None:
        """Step every text (fresh env whenever the last one finished) under the execution sentinel."""
        env = None
        for i, text in enumerate(texts):
            if env is None:
                env, _ = self.start(seed + i)
                if env is None:
                    return
            with sentinel.watch() as events:
                result = self.step(env, text, f"hostile #{i}")
            for event in events:
                self.fail("no_execution", f"stepping {_short(text)} caused {event}")
            if result is None or result.done:
                self.close(env, f"hostile #{i}")
                env = None
        if env is not None:
            self.close(env, "hostile")


def check_env(
    factory: Callable[[int], Env] | str,
    *,
    name: str | None = None,
    seed: int = 0,
    actions: Sequence[str] | None = None,
    n_episodes: int = 2,
    n_hostile: int = 40,
    prompt: list[dict[str, Any]] | None = None,
    min_image_side: int = 8,
    max_image_side: int = 1024,
    max_step_seconds: float = 5.0,
    raise_on_failure: bool = True,
) -> EnvCheckReport:
    """Run the conformance checks (module docstring) on envs from ``factory``; see :class:`EnvCheckReport`.

    actions: texts to play episodes with; default ``env.example_actions`` if present, else generic ones.
    n_hostile: hypothesis-generated hostile texts on top of the fixed corpus (0 = corpus only).
    Raises :class:`EnvConformanceError` listing the failures unless ``raise_on_failure`` is False.
    """
    from vlrl.checks.hostile import ExecutionSentinel, canary_traces, fixed_corpus, hypothesis_texts
    from vlrl.envs.registry import env_factory

    if isinstance(factory, str):
        name, factory = name or factory, env_factory(factory)
    name = name or str(getattr(factory, "__name__", repr(factory)))
    t0 = time.perf_counter()
    checker = _Checker(
        factory,
        prompt=prompt or [dict(m) for m in PLACEHOLDER_PROMPT],
        min_side=min_image_side,
        max_side=max_image_side,
        max_step_seconds=max_step_seconds,
    )
    probe, _ = checker.start(seed)
    if probe is not None:
        actions = list(actions or getattr(probe, "example_actions", None) or GENERIC_ACTIONS)
        checker.close(probe, "probe")
        checker.determinism(seed, n_episodes, actions)
        with tempfile.TemporaryDirectory(prefix="vlrl-canary-") as tmp:
            texts = fixed_corpus(Path(tmp)) + hypothesis_texts(n_hostile)
            checker.hostile(texts, seed + 10_000, ExecutionSentinel())
            for trace in canary_traces(Path(tmp)):
                checker.fail("canary", f"a canary payload was executed: {trace}")
    report = EnvCheckReport(
        name,
        CHECKS,
        tuple(checker.failures),
        checker.n_steps,
        len(texts) if probe is not None else 0,
        time.perf_counter() - t0,
    )
    if raise_on_failure and not report.ok:
        raise EnvConformanceError(report)
    return report
