"""Small envs for testing the conformance check: one good, several broken on purpose."""

from __future__ import annotations

import itertools

import numpy as np

from vlrl.envs import EpisodeDoneError, StepResult
from vlrl.messages import image_part, user_message

_counter = itertools.count()


class GoodEnv:
    """Two turns; say 'yes' to earn 1. Frames are seeded noise."""

    max_turns = 2

    def __init__(self, seed=0):
        self.seed, self.turn, self.done, self.example_actions = seed, 0, False, ["yes", "no"]

    def _frame(self):
        rng = np.random.default_rng([self.seed, self.turn])
        return rng.integers(0, 256, size=(16, 16, 3), dtype=np.uint8)

    def init(self, prompt):
        self.turn, self.done = 0, False
        return [user_message(image_part(self._frame()), "Say yes.")], {"seed": self.seed}

    def step(self, action_text):
        if self.done:
            raise EpisodeDoneError("episode over")
        self.turn += 1
        self.done = self.turn >= self.max_turns
        reward = 1.0 if action_text.strip()[:3] == "yes" else 0.0
        obs = [] if self.done else [user_message(image_part(self._frame()), "Again.")]
        return StepResult(obs, reward, self.done, {"turn": self.turn})

    def close(self):
        pass


class EvalEnv(GoodEnv):
    """Grades with eval: the classic mistake."""

    def step(self, action_text):
        try:
            eval(action_text[:200])  # deliberately unsafe: check_env must catch it
        except Exception:  # noqa: BLE001 — whatever the text does, the env goes on
            pass
        return super().step(action_text)


class NondeterministicEnv(GoodEnv):
    def _frame(self):
        return np.full((16, 16, 3), next(_counter) % 256, dtype=np.uint8)


class NoDoneErrorEnv(GoodEnv):
    def step(self, action_text):
        self.done = False  # forgets it ended: keeps going
        return super().step(action_text)


class ObsAfterDoneEnv(GoodEnv):
    def step(self, action_text):
        result = super().step(action_text)
        if result.done:
            return StepResult([user_message("bye")], result.reward, True, {})
        return result


class CrashOnHostileEnv(GoodEnv):
    def step(self, action_text):
        if len(action_text) > 1000:
            raise KeyError("too long")
        return super().step(action_text)


class HugeImageEnv(GoodEnv):
    def _frame(self):
        return np.zeros((8, 3000, 3), dtype=np.uint8)


class BadMessagesEnv(GoodEnv):
    def init(self, prompt):
        return [{"role": "robot", "content": "hi"}], {}


class NeverDoneEnv(GoodEnv):
    def step(self, action_text):
        self.turn += 1
        return StepResult([user_message("more")], 0.0, False, {})


def make_good(seed):
    return GoodEnv(seed)


def make_eval(seed):
    return EvalEnv(seed)
