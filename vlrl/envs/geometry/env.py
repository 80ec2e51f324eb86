"""The geometry env: image once, then text-only feedback from a ``calc_score`` oracle, at most 3 turns.

Not a gymnasium env on purpose: there is no frame per turn and no action space, only a question
and a grader, so the frame wrapper would add nothing.

Each turn the policy either calls the oracle::

    <tool_call>{"name": "calc_score", "arguments": {"answer": "..."}}</tool_call>

(last tool call wins; ``{"function": {...}}`` nesting and a JSON-string ``arguments`` are accepted),
or gives a final answer (last ``\\boxed{}``, else its last non-empty line). Reward is 1/0 and comes
only on the turn that ends the episode:
- final answer: graded, episode over;
- correct ``calc_score``: 1.0, episode over; wrong: feedback, over on the last turn;
- malformed tool call: feedback, reward 0, over on the last turn.

Problems come from the seed, or, for image-prompt rows, from the row itself: a prompt carrying
the images plus ``extras["ground_truth"]`` (or ``extras["reward_spec"]["ground_truth"]``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from vlrl.envs.contract import EnvError, EpisodeDoneError, Message, StepResult, clip_action, is_placeholder
from vlrl.envs.geometry.diagrams import draw_problem, make_problem
from vlrl.envs.geometry.grading import extract_answer, grade
from vlrl.envs.text_env import fresh_seed
from vlrl.messages import image_part, text_part, validate_messages

MAX_TURNS = 3
INSTRUCTIONS = (
    "You are a math/geometry expert. Solve the user's question carefully and verify your work. Reason step by "
    "step as an internal monologue wrapped inside <think>...</think> tags.\n\nYou have access to a tool to check "
    'your answer:\n  <tool_call>{"name": "calc_score", "arguments": {"answer": "<your_answer>"}}</tool_call>\n\n'
    "Use this tool to verify your solution. If your answer is wrong, you can try again with a different "
    "approach.\nWhen you are confident in your final answer, present it as: Answer: \\boxed{$Answer}\n\n"
)
BAD_TOOL = (
    'Invalid tool call. The only tool is calc_score, called as <tool_call>{"name": "calc_score", '
    '"arguments": {"answer": "<your_answer>"}}</tool_call>.'
)
WRONG = (
    "calc_score result: 0.0. Parsed answer '{answer}' does not match the reference. Your answer is wrong. "
    "You may need to reason in a different way. Don't repeat your answer unless necessary."
)
LAST_CHANCE = (
    " Since you only have one chance to answer, don't call tool again. Provide your final answer in "
    "the form: Answer: \\boxed{$Answer}"
)
_TOOL_OPEN, _TOOL_CLOSE = "<tool_call>", "</tool_call>"
_TOOL_BODY = re.compile(r"\s*(\{.*?\})\s*</tool_call>", re.DOTALL)
MAX_TOOL_CHARS = 4096


def find_tool_call(text: str) -> tuple[bool, str | None]:
    """``(found, answer)``: whether a ``<tool_call>`` is present, and the calc_score answer if well formed.

    Scans back from the last opening tag over at most 8 candidates, each at most 4 KiB: bounded work
    on hostile text (a plain DOTALL regex over megabytes of open tags is quadratic).
    """
    pos, tries = text.rfind(_TOOL_OPEN), 0
    found = pos != -1
    while pos != -1 and tries < 8:
        tries += 1
        body = _TOOL_BODY.match(text[pos + len(_TOOL_OPEN) : pos + len(_TOOL_OPEN) + MAX_TOOL_CHARS])
        if body:
            return True, _calc_score_answer(body.group(1))
        pos = text.rfind(_TOOL_OPEN, 0, pos)
    return found, None


def _calc_score_answer(raw: str) -> str | None:
    """The ``answer`` argument of a calc_score call in JSON ``raw``, or None if malformed."""
    try:
        call = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if isinstance(call, dict) and isinstance(call.get("function"), dict):
        call = call["function"]
    if not isinstance(call, dict) or call.get("name") != "calc_score":
        return None
    args = call.get("arguments")
    if isinstance(args, str) and len(args) <= MAX_TOOL_CHARS:
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            return None
    answer = args.get("answer") if isinstance(args, dict) else None
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
        return None
    return str(answer)[:512]


class GeometryEnv:
    """See the module docstring. ``ground_truth`` / ``prompt`` come from the row or the seeded problem."""

    def __init__(self, *, seed: int | None = None, ground_truth: str | None = None, max_turns: int = MAX_TURNS):
        if not 1 <= int(max_turns) <= 10:
            raise EnvError(f"geometry max_turns must be 1..10, got {max_turns}")
        self.seed = fresh_seed() if seed is None else int(seed)
        self.max_turns = int(max_turns)
        self.ground_truth = ground_truth
        self.turn, self._started, self._done, self._closed = 0, False, False, False
        self.example_actions = [
            "\\boxed{40}",
            '<tool_call>{"name": "calc_score", "arguments": {"answer": "5"}}</tool_call>',
            "Answer: \\boxed{2\\sqrt{13}}",
        ]

    def init(self, prompt: list[Message] | None = None) -> tuple[list[Message], dict[str, Any]]:
        """The problem message ``[image, text]``: the row's own prompt when it carries one, else generated."""
        if self._closed:
            raise EpisodeDoneError("geometry: init() after close()")
        self.turn, self._started, self._done = 0, True, False
        if prompt is not None and not is_placeholder(prompt) and self.ground_truth is not None:
            validate_messages(prompt)
            return [dict(m) for m in prompt], {"seed": self.seed, "ground_truth": self.ground_truth}
        problem = make_problem(np.random.default_rng(self.seed))
        self.ground_truth = problem.answer
        message = {
            "role": "user",
            "content": [image_part(draw_problem(problem)), text_part(INSTRUCTIONS + problem.question)],
        }
        return [message], {"seed": self.seed, "kind": problem.kind, "ground_truth": problem.answer}

    def step(self, action_text: str) -> StepResult:
        truth = self._check_can_step()
        self.turn += 1
        text = clip_action(action_text)
        last = self.turn >= self.max_turns
        has_call, answer = find_tool_call(text)
        meta: dict[str, Any] = {"turn": self.turn, "tool_call": has_call, "answer": answer}
        if not has_call:
            answer = extract_answer(text)
            correct = grade(answer, truth)
            return self._end(1.0 if correct else 0.0, {**meta, "answer": answer, "acc": float(correct)})
        if answer is None:
            return self._end(0.0, {**meta, "acc": 0.0}) if last else self._feedback(BAD_TOOL, meta)
        if grade(answer, truth):
            return self._end(1.0, {**meta, "acc": 1.0})
        if last:
            return self._end(0.0, {**meta, "acc": 0.0})
        note = WRONG.format(answer=answer[:200]) + (LAST_CHANCE if self.turn + 1 >= self.max_turns else "")
        return self._feedback(note, meta)

    def close(self) -> None:
        self._closed = True

    def _end(self, reward: float, meta: dict[str, Any]) -> StepResult:
        self._done = True
        return StepResult([], reward, True, {**meta, "turns": self.turn})

    def _feedback(self, text: str, meta: dict[str, Any]) -> StepResult:
        return StepResult([{"role": "user", "content": [text_part(text)]}], 0.0, False, {**meta, "feedback": text})

    def _check_can_step(self) -> str:
        """Refuse a step the episode cannot take; returns the ground truth that init() set."""
        if self._closed:
            raise EpisodeDoneError("geometry: step() after close()")
        if not self._started or self.ground_truth is None:
            raise EnvError("geometry: step() before init()")
        if self._done:
            raise EpisodeDoneError("geometry: step() after the episode ended (done=True)")
        return self.ground_truth


def make_geometry(extras: Mapping[str, Any], seed: int | None) -> GeometryEnv:
    """``geometry``. extras: ``ground_truth`` (or ``reward_spec.ground_truth``) for image-prompt rows, ``max_turns``."""
    truth = extras.get("ground_truth")
    spec = extras.get("reward_spec")
    if truth is None and isinstance(spec, Mapping):
        truth = spec.get("ground_truth")
    return GeometryEnv(
        seed=seed,
        ground_truth=None if truth is None else str(truth).strip(),
        max_turns=int(extras.get("max_turns", MAX_TURNS)),
    )
