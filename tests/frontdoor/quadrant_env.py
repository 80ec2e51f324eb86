"""Which quadrant is the dot in? A user's env, written against vlrl's env contract only."""

import random

import numpy as np

from vlrl.envs import StepResult
from vlrl.messages import image_part, text_part, user_message

ANSWERS = ("nw", "ne", "sw", "se")


class QuadrantEnv:
    max_turns = 1

    def __init__(self, seed, size=56, dot=12):
        self.rng = random.Random(seed)
        self.size, self.dot = size, dot
        self.quadrant = self.rng.randrange(4)
        self.done = False

    def image(self):
        img = np.full((self.size, self.size, 3), 255, dtype=np.uint8)
        half = self.size // 2
        row, col = divmod(self.quadrant, 2)
        y = row * half + self.rng.randrange(half - self.dot + 1)
        x = col * half + self.rng.randrange(half - self.dot + 1)
        img[y : y + self.dot, x : x + self.dot] = (0, 0, 0)
        return img

    def init(self, prompt):
        question = "Which quadrant is the dot in? Answer nw, ne, sw or se."
        return [user_message(image_part(self.image()), text_part(question))], {"answer": ANSWERS[self.quadrant]}

    def step(self, action_text):
        from vlrl.envs import EpisodeDoneError

        if self.done:
            raise EpisodeDoneError("episode is over")
        self.done = True
        said = str(action_text)[-64:].strip().lower().rstrip(".")
        reward = 1.0 if said == ANSWERS[self.quadrant] else 0.0
        return StepResult([], reward, True, {"answer": ANSWERS[self.quadrant], "said": said[:8]})

    def close(self):
        self.done = True


def make_env(seed=None, size=56, dot=12):
    return QuadrantEnv(seed, size, dot)


def expert(env, row):
    yield ANSWERS[env.quadrant]
