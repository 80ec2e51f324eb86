"""The golden scenarios: scripted episodes whose exact tokens and loss masks are pinned in ``golden/``.

Each scenario is a dataset row, a rollout config and a script (the assistant's texts), so the
files are readable and independent of random weights. Scenarios cover a single-image prompt,
several images in one message, image-returning multi-turn (maze2d), text-feedback multi-turn with
tool calls (geometry), a stop string followed by an appended end of turn, and context truncation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vlrl.engines.types import SamplingParams

MULTI_IMAGE_ENV = "golden/multi_image"


@dataclass(frozen=True)
class ScriptedEpisode:
    """One golden episode: ``row`` played with ``script`` under ``sampling`` (stop strings, budget).
    vlrl's built-ins are these; a user's project writes :class:`vlrl.golden.Scenario` instead."""

    name: str
    description: str
    row: dict[str, Any]
    script: tuple[str, ...]
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(max_tokens=128))
    max_turns: int | None = None
    max_context: int | None = None


GEOMETRY_SCRIPT = (
    "<think>The two legs are 3 and 4.</think>\n"
    '<tool_call>{"name": "calc_score", "arguments": {"answer": "5"}}</tool_call>',
    '<tool_call>{"name": "calc_score", "arguments": {"answer": "7"}}</tool_call>',
    "The hypotenuse is \\boxed{5}",
)
MAZE_SCRIPT = ("<action>left</action>", "Going up: <action>up</action>", "<action>down</action>")

SCENARIOS: dict[str, ScriptedEpisode] = {
    s.name: s
    for s in (
        ScriptedEpisode(
            "single_image",
            "color_square: one image, one answer",
            {"prompt": None, "env_class": "color_square", "extras": {}, "seed": 7},
            ("<answer>red</answer>",),
        ),
        ScriptedEpisode(
            "multi_image",
            "three images of different sizes in one user message",
            {"prompt": None, "env_class": MULTI_IMAGE_ENV, "extras": {}, "seed": 0},
            ("The second one.",),
        ),
        ScriptedEpisode(
            "maze2d_multi_turn",
            "maze2d/easy: three moves, an image back after each",
            {"prompt": None, "env_class": "maze2d/easy", "extras": {}, "seed": 0},
            MAZE_SCRIPT,
            max_turns=3,
        ),
        ScriptedEpisode(
            "geometry_tool_calls",
            "geometry: two calc_score tool calls with text feedback, then an answer",
            {"prompt": None, "env_class": "geometry", "extras": {}, "seed": 5},
            GEOMETRY_SCRIPT,
        ),
        ScriptedEpisode(
            "stop_string_eos",
            "maze2d/easy with stop string </action>: replies cut there, end of turn appended",
            {"prompt": None, "env_class": "maze2d/easy", "extras": {}, "seed": 0},
            ("<action>right</action> and then more", "<action>up</action>!"),
            sampling=SamplingParams(max_tokens=128, stop=("</action>",)),
            max_turns=2,
        ),
        ScriptedEpisode(
            "context_truncation",
            "maze2d/easy with a 350-token context: the second observation does not fit",
            {"prompt": None, "env_class": "maze2d/easy", "extras": {}, "seed": 0},
            MAZE_SCRIPT,
            max_turns=3,
            max_context=350,
        ),
    )
}


def register_scenario_envs() -> None:
    """Register the env only golden scenarios use (idempotent)."""
    from vlrl.envs.registry import register_env

    register_env(MULTI_IMAGE_ENV, lambda extras, seed: MultiImageEnv(), replace=True)


class MultiImageEnv:
    """One user message holding three solid-colour images of different sizes; one turn, no reward."""

    max_turns = 1
    SIZES = ((56, 56), (28, 112), (100, 60))

    def init(self, prompt):
        import numpy as np

        from vlrl.messages import image_part, text_part

        parts = []
        for k, (h, w) in enumerate(self.SIZES):
            img = np.zeros((h, w, 3), dtype=np.uint8)
            img[..., k] = 200
            parts.append(image_part(img))
            parts.append(text_part(f"Image {k + 1}."))
        parts.append(text_part(" Which image is green?"))
        return [{"role": "user", "content": parts}], {}

    def step(self, action_text: str):
        from vlrl.envs.contract import StepResult

        return StepResult([], 0.0, True, {})

    def close(self) -> None:
        pass
