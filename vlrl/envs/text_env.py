"""One text-contract wrapper for every frame-based env: a gymnasium env (``render_mode="rgb_array"``,
``Discrete`` actions) driven through ``init``/``step`` with model text.

maze2d and color_square are themselves ``gymnasium.Env``s, and ``gym/<id>`` wraps any gymnasium
env, so all three share this file: parsing, feedback, the step counter, turn limits and
done-semantics live here once. Each turn the policy sees one user message ``[image, text]``
(image first, as the VisGym harness does): the rendered frame and the feedback text.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from vlrl.envs.contract import EnvError, EpisodeDoneError, Message, StepResult, clip_action
from vlrl.messages import image_part, user_message


@dataclass(frozen=True)
class ParsedAction:
    """A parser's verdict on one model turn.

    action: the gymnasium action, or None when the text held no valid action.
    name: the action's keyword (for metadata), None when invalid.
    feedback: why the text was refused (shown to the policy); empty when valid.
    """

    action: int | None
    name: str | None = None
    feedback: str = ""


ActionParser = Callable[[str], ParsedAction]


def step_counter_text(k: int, max_turns: int) -> str:
    """The VisGym step counter for the upcoming step ``k`` (1-based)."""
    return f"This is step {k}. You are allowed to take {max_turns - k} more steps."


def fresh_seed() -> int:
    """A seed from OS entropy for rows without one; recorded in info so the episode can be replayed."""
    return secrets.randbits(31)


def _json_scalar(value: Any) -> Any:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if isinstance(value, str):
        return value
    if isinstance(value, (tuple, list)) and len(value) <= 16:
        items = [_json_scalar(v) for v in value]
        return None if any(i is None for i in items) else items
    return None


def json_info(info: dict[str, Any]) -> dict[str, Any]:
    """The JSON-friendly part of a gymnasium info dict (scalars and short tuples; arrays dropped)."""
    out = {}
    for key, value in info.items():
        conv = _json_scalar(value)
        if conv is not None:
            out[str(key)] = conv
    return out


class GymTextEnv:
    """Text contract over a gymnasium env. See the module docstring.

    gym_env: a gymnasium env with ``render_mode="rgb_array"`` and a ``Discrete`` action space.
    parser: model text -> :class:`ParsedAction`. A refused text costs a turn and does not step the env.
    prompt: the task description shown on turn 1.
    max_turns: turns until ``done`` (the harness limit; the gym env may end earlier).
    step_counter: append the VisGym "This is step k ..." line to every observation.
    seed: reset seed; ``None`` draws one from OS entropy (reported in ``info["seed"]``).
    example_actions: one valid text per action, for demos and the conformance check.
    """

    def __init__(
        self,
        gym_env: Any,
        *,
        parser: ActionParser,
        prompt: str,
        max_turns: int,
        seed: int | None = None,
        step_counter: bool = True,
        env_class: str = "",
        default_feedback: str = "Action executed successfully.",
        example_actions: Sequence[str] = (),
    ) -> None:
        if int(max_turns) < 1:
            raise EnvError(f"max_turns must be >= 1, got {max_turns}")
        if not hasattr(gym_env.action_space, "n"):
            raise EnvError(
                f"{env_class or gym_env}: only Discrete action spaces are supported, got {gym_env.action_space}"
            )
        self.gym_env = gym_env
        self.parser = parser
        self.prompt = prompt
        self.max_turns = int(max_turns)
        self.seed = fresh_seed() if seed is None else int(seed)
        self.step_counter = step_counter
        self.env_class = env_class
        self.default_feedback = default_feedback
        self.example_actions = list(example_actions)
        self.turn = 0
        self.last_info: dict[str, Any] = {}
        self._started = False
        self._done = False
        self._closed = False

    # ------------------------------------------------------------------ contract

    def init(self, prompt: list[Message] | None = None) -> tuple[list[Message], dict[str, Any]]:
        """Reset the gym env with this env's seed; returns ``[user: [frame, prompt + counter]]``, info.

        The row prompt is a ticket placeholder here: the env writes its own first message, and the
        same seed gives the same message byte for byte (so image-prompt datasets can store it).
        """
        if self._closed:
            raise EpisodeDoneError(f"{self.env_class}: init() after close()")
        _, info = self.gym_env.reset(seed=self.seed)
        self.turn, self._started, self._done = 0, True, False
        self.last_info = json_info(info)
        text = self.prompt
        if self.step_counter:
            text += "\n" + step_counter_text(1, self.max_turns)
        meta = {"seed": self.seed, "env_class": self.env_class, "max_turns": self.max_turns, **self.last_info}
        return [user_message(image_part(self._frame()), text)], meta

    def step(self, action_text: str) -> StepResult:
        """Parse ``action_text``, step the gym env if it held a valid action, and report the turn."""
        self._check_can_step()
        self.turn += 1
        parsed = self.parser(clip_action(action_text))
        reward, terminated, truncated = 0.0, False, False
        if parsed.action is not None and self.gym_env.action_space.contains(parsed.action):
            _, reward, terminated, truncated, info = self.gym_env.step(parsed.action)
            self.last_info = json_info(info)
            feedback = str(info.get("env_feedback") or self.default_feedback)
            valid = True
        else:
            valid = False
            feedback = parsed.feedback or "The action could not be parsed."
        self._done = bool(terminated or truncated or self.turn >= self.max_turns)
        metadata = {
            "turn": self.turn,
            "action": parsed.name if valid else None,
            "valid_action": valid,
            "feedback": feedback,
            "terminated": bool(terminated),
            "truncated": bool(truncated),
            "env_info": dict(self.last_info),
        }
        return StepResult(self._observation(feedback), float(reward), self._done, metadata)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.gym_env.close()

    # ------------------------------------------------------------------ helpers

    def _check_can_step(self) -> None:
        if self._closed:
            raise EpisodeDoneError(f"{self.env_class}: step() after close()")
        if not self._started:
            raise EnvError(f"{self.env_class}: step() before init()")
        if self._done:
            raise EpisodeDoneError(
                f"{self.env_class}: step() after the episode ended (done=True); make a new env or call init() again"
            )

    def _observation(self, feedback: str) -> list[Message]:
        if self._done:
            return []
        text = f"Environment feedback: {feedback}"
        if self.step_counter:
            text += "\n\n" + step_counter_text(self.turn + 1, self.max_turns)
        return [user_message(image_part(self._frame()), text)]

    def _frame(self) -> np.ndarray:
        """The current RGB frame, ``[H, W, 3]`` uint8."""
        frame = self.gym_env.render()
        if not isinstance(frame, np.ndarray) or frame.ndim != 3 or frame.shape[2] != 3:
            raise EnvError(
                f"{self.env_class}: render() must return an [H, W, 3] array "
                f"(render_mode='rgb_array'), got {type(frame).__name__}"
            )
        return np.ascontiguousarray(frame, dtype=np.uint8)
