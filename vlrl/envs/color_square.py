"""color_square: one coloured square per turn; name its colour. The smallest real image env.

Frame: ``[size, size, 3]`` uint8, white background, one axis-aligned square of a palette colour
(side drawn uniformly from ``square_sizes``, position uniform). Actions: ``Discrete(len(palette))``,
the palette index. An episode has ``n_turns`` squares.

Reward: ``1 / n_turns`` for each correct answer, 0 otherwise, so the **episode return is the
fraction answered correctly** (in [0, 1]; with the default single turn it is plain 1/0).
A turn whose text holds no palette colour counts as a wrong answer on the same square.

Answer format: ``<answer>red</answer>`` (last tag wins) or just the colour word; lenient on
case, whitespace and trailing punctuation, strict on content ("red or blue" is no answer).
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator, Mapping
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from vlrl.envs.contract import EnvError
from vlrl.envs.text_env import GymTextEnv, ParsedAction

DEFAULT_PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 170, 40),
    "blue": (30, 60, 220),
    "yellow": (240, 210, 20),
}
BACKGROUND = (255, 255, 255)

_ANSWER_TAG = re.compile(r"<answer>\s*([A-Za-z]{1,20})\s*</answer>", re.IGNORECASE)
_BARE_WORD = re.compile(r"\s*([A-Za-z]{1,20})\s*[.!]?\s*")


class ColorSquareEnv(gym.Env):
    """See the module docstring. ``square_sizes = (min_side, max_side)`` in pixels."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 4}

    def __init__(
        self,
        palette: Mapping[str, tuple[int, int, int]] | None = None,
        n_turns: int = 1,
        image_size: int = 56,
        square_sizes: tuple[int, int] = (16, 32),
        render_mode: str | None = "rgb_array",
    ):
        self.palette = dict(palette or DEFAULT_PALETTE)
        self.names = list(self.palette)
        lo, hi = int(square_sizes[0]), int(square_sizes[1])
        if len(self.names) < 2 or n_turns < 1 or not (1 <= lo <= hi <= image_size):
            raise ValueError(f"need >= 2 colours, n_turns >= 1 and 1 <= {lo} <= {hi} <= image_size {image_size}")
        self.n_turns, self.image_size, self.square_sizes = int(n_turns), int(image_size), (lo, hi)
        self.render_mode = render_mode
        self.action_space = spaces.Discrete(len(self.names))
        self.observation_space = spaces.Box(0, 255, (self.image_size, self.image_size, 3), np.uint8)
        self.turn = 0
        self._draw()

    def _draw(self) -> None:
        """Pick the next square: colour index, side and top-left corner."""
        rng = getattr(self, "_np_random", None) or np.random.default_rng(0)
        self.colour = int(rng.integers(len(self.names)))
        side = int(rng.integers(self.square_sizes[0], self.square_sizes[1] + 1))
        top, left = (int(v) for v in rng.integers(0, self.image_size - side + 1, size=2))
        self.square = (top, left, side)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.turn = 0
        self._draw()
        return self.render(), self._info("")

    def step(self, action: int):
        correct = int(action) == self.colour
        feedback = "Correct." if correct else f"Wrong: the square was {self.names[self.colour]}."
        info = self._info(feedback)
        self.turn += 1
        terminated = self.turn >= self.n_turns
        if not terminated:
            self._draw()
        return self.render(), (1.0 / self.n_turns) if correct else 0.0, terminated, False, info

    def render(self) -> np.ndarray:
        frame = np.empty((self.image_size, self.image_size, 3), dtype=np.uint8)
        frame[:] = BACKGROUND
        top, left, side = self.square
        frame[top : top + side, left : left + side] = self.palette[self.names[self.colour]]
        return frame

    def _info(self, feedback: str) -> dict[str, Any]:
        return {"colour": self.names[self.colour], "turn": self.turn, "env_feedback": feedback}


def colour_parser(names: list[str]):
    """A parser mapping answer text to the palette index (see the module docstring for the format)."""
    index = {name.lower(): i for i, name in enumerate(names)}
    hint = f"Answer with <answer>COLOUR</answer> where COLOUR is one of: {', '.join(names)}."

    def parse(text: str) -> ParsedAction:
        tags = _ANSWER_TAG.findall(text)
        if tags:
            word = tags[-1].lower()
        else:
            bare = _BARE_WORD.fullmatch(text[:64]) if len(text) <= 64 else None
            word = bare.group(1).lower() if bare else ""
        if word in index:
            return ParsedAction(index[word], word)
        return ParsedAction(None, feedback=f"No colour answer found. {hint}")

    return parse


def color_square_prompt(names: list[str], n_turns: int) -> str:
    squares = "a square" if n_turns == 1 else f"{n_turns} squares, one per turn"
    return (
        f"You will be shown {squares}. What colour is the square? "
        f"Answer with <answer>COLOUR</answer> where COLOUR is one of: {', '.join(names)}."
    )


def make_color_square(extras: Mapping[str, Any], seed: int | None) -> GymTextEnv:
    """``color_square``. extras: ``n_turns`` (1), ``palette`` ({name: [r, g, b]}), ``image_size`` (56),
    ``square_sizes`` ([16, 32])."""
    try:
        gym_env = ColorSquareEnv(
            palette={k: tuple(v) for k, v in extras["palette"].items()} if "palette" in extras else None,
            n_turns=int(extras.get("n_turns", 1)),
            image_size=int(extras.get("image_size", 56)),
            square_sizes=tuple(extras.get("square_sizes", (16, 32))),
        )
    except (ValueError, TypeError, AttributeError) as exc:
        raise EnvError(f"color_square: bad extras {dict(extras)!r}: {exc}") from None
    names = gym_env.names
    return GymTextEnv(
        gym_env,
        parser=colour_parser(names),
        prompt=color_square_prompt(names, gym_env.n_turns),
        max_turns=gym_env.n_turns,
        seed=seed,
        step_counter=False,
        env_class="color_square",
        default_feedback="",
        example_actions=[f"<answer>{n}</answer>" for n in names],
    )


# ---------------------------------------------------------------- SFT experts (registered in vlrl.envs.builtin)


def color_square_expert(env: GymTextEnv, row: Mapping[str, Any]) -> Iterator[str]:
    """``color_square``: the colour of the current square as a bare word (the env accepts it; two tokens
    with the end of turn, which a tiny model learns far faster than the tagged form)."""
    game = env.gym_env.unwrapped
    for _ in range(env.max_turns):
        yield game.names[game.colour]


def color_square_format_expert(env: GymTextEnv, row: Mapping[str, Any]) -> Iterator[str]:
    """``color_square/format``: right format, colour drawn at random (seeded by the row): teaches the answer
    format only, so the policy starts RL at chance and the reward has to teach it the colours."""
    game = env.gym_env.unwrapped
    rng = random.Random(row.get("seed"))
    for _ in range(env.max_turns):
        yield rng.choice(game.names)
