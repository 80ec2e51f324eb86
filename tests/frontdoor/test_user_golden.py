"""A user's own goldens, end to end in a fresh project outside the repo: their env, their scenarios, their test.

`vlrl golden regen --scenarios` writes only their file; `pytest` there is green; a planted change to the env's
prompt fails with the command that fixes that file; running that command makes it green again.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

QUADRANT_ENV = '''
"""Which quadrant is the dot in: one image, one answer."""
import numpy as np

from vlrl.envs.contract import StepResult
from vlrl.messages import image_part, text_part

QUADRANTS = ("top-left", "top-right", "bottom-left", "bottom-right")
PROMPT = (
    "Which quadrant is the dot in? "
    "Answer with <answer>QUADRANT</answer>: top-left, top-right, bottom-left or bottom-right."
)


class QuadrantEnv:
    max_turns = 1

    def __init__(self, seed, size=56):
        self.rng = np.random.default_rng(seed)
        self.size = size
        self.done = True

    def init(self, prompt):
        self.answer = int(self.rng.integers(4))
        half = self.size // 2
        img = np.full((self.size, self.size, 3), 255, dtype=np.uint8)
        top, left = (self.answer // 2) * half + half // 2, (self.answer % 2) * half + half // 2
        img[top - 3 : top + 3, left - 3 : left + 3] = (0, 0, 0)
        self.done = False
        return [{"role": "user", "content": [image_part(img), text_part(PROMPT)]}], {}

    def step(self, action_text):
        self.done = True
        right = QUADRANTS[self.answer] in action_text
        return StepResult([], 1.0 if right else 0.0, True, {"answer": QUADRANTS[self.answer]})

    def close(self):
        pass


def make_env(seed, **extras):
    return QuadrantEnv(seed, **extras)
'''

SCENARIOS = """
from vlrl.golden import Scenario

SCENARIOS = [
    Scenario("dot_answer", env="quadrant_env:make_env", actions=("<answer>top-left</answer>",), seed=3),
    Scenario("dot_small", env="quadrant_env:make_env", actions=("bottom-right",), seed=1, extras={"size": 28}),
]
"""

TEST = """
import pytest

from my_scenarios import SCENARIOS


@pytest.mark.parametrize("scenario", SCENARIOS, ids=str)
def test_golden(vlrl_golden, scenario):
    vlrl_golden.check_scenario(scenario)
"""


def run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("PYTEST_XDIST_WORKER", None)
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def vlrl(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "vlrl", *args], cwd)


def user_pytest(cwd: Path) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "test_golden.py"], cwd)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    assert ROOT not in tmp_path.resolve().parents  # a project outside the repo
    (tmp_path / "quadrant_env.py").write_text(textwrap.dedent(QUADRANT_ENV))
    (tmp_path / "my_scenarios.py").write_text(SCENARIOS)
    (tmp_path / "test_golden.py").write_text(TEST)
    return tmp_path


def goldens(project: Path) -> list[str]:
    return sorted(str(p.relative_to(project / "golden")) for p in (project / "golden").rglob("*"))


@pytest.mark.slow
def test_a_user_pins_their_env_changes_it_and_fixes_it_with_the_named_command(project, vlrl_model_dir):
    vlrl_model_dir("qwen2_5_vl")  # the subprocesses use the same checkpoint cache

    regen = vlrl("golden", "regen", "--scenarios", "my_scenarios", cwd=project)
    assert regen.returncode == 0, regen.stdout + regen.stderr
    assert goldens(project) == ["qwen2_5_vl", "qwen2_5_vl/dot_answer.golden", "qwen2_5_vl/dot_small.golden"]
    text = (project / "golden/qwen2_5_vl/dot_answer.golden").read_text()
    assert "'Which'" in text and "' quadrant'" in text  # the env's own prompt, token by token
    assert "<|image_pad|>" in text and "  1  " in text  # image pads and generated (loss-masked) tokens

    green = user_pytest(project)
    assert green.returncode == 0, green.stdout + green.stderr
    assert "2 passed" in green.stdout and "no test used" not in green.stdout

    # plant a change: the env's prompt text
    env_file = project / "quadrant_env.py"
    env_file.write_text(env_file.read_text().replace("Which quadrant is the dot in?", "Where is the dot?"))
    red = user_pytest(project)
    assert red.returncode == 1, red.stdout + red.stderr
    assert "golden file qwen2_5_vl/dot_answer.golden differs" in red.stdout
    fix = "vlrl golden regen --scenarios my_scenarios --only dot_answer"
    assert f"`{fix}`" in red.stdout, red.stdout
    assert "first token divergence" in red.stdout

    fixed = vlrl(*fix.split()[1:], cwd=project)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "wrote golden/qwen2_5_vl/dot_answer.golden" in fixed.stdout and "dot_small" not in fixed.stdout
    still = user_pytest(project)  # dot_small differs too (same prompt): its own commands are named
    assert "--only dot_small" in still.stdout and "--only dot_answer" not in still.stdout, still.stdout
    # the plugin's route this time: the pytest command the message names for that test id
    named = "pytest --vlrl-update-golden 'test_golden.py::test_golden[dot_small]'"
    assert f"`{named}`" in still.stdout, still.stdout
    update = run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *shlex.split(named)[1:]], project)
    assert update.returncode == 1 and "dot_small.golden rewritten" in update.stdout, update.stdout

    green = user_pytest(project)
    assert green.returncode == 0, green.stdout + green.stderr
    assert goldens(project) == ["qwen2_5_vl", "qwen2_5_vl/dot_answer.golden", "qwen2_5_vl/dot_small.golden"]


def test_plain_regen_in_a_user_project_refuses_to_write_vlrls_goldens(project):
    result = vlrl("golden", "regen", cwd=project)
    assert result.returncode == 2
    assert "vlrl golden regen --scenarios MODULE" in result.stderr, result.stderr
    assert not (project / "golden").exists()
