"""A fresh project outside the repo, as a new user makes one: its own env module, a TOML, an installed
package's entry points (a ``.dist-info`` on the path), and a test file that uses the plugin. It runs
``vlrl check-env module:factory``, ``vlrl train`` with ``data.env=module:factory``, and ``pytest`` there,
each as the user would: a subprocess in the project directory, nothing of this repo's test setup."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
TINY = [  # a few seconds of training on 2 cores: what is asserted is the plumbing, not learning
    "data.train_rows=16",
    "data.eval_rows=4",
    "sft.steps=3",
    "sft.rows_per_step=8",
    "run.steps=2",
    "rollout.rows_per_step=4",
    "rollout.repeats=2",
    "run.eval_every=0",
    "run.samples=1",
]

RECIPE = """\
name = "quadrant"

[data]
env = "quadrant"            # by name: the entry point of the installed package (quadpkg)
extras = { dot = 14 }
train_rows = 16
eval_rows = 4

[sft]
steps = 3                   # expert "quadrant": registered by the package's module entry point
rows_per_step = 8
lr = 3e-3

[rollout]
rows_per_step = 4
repeats = 2
max_tokens = 4

[run]
steps = 2
eval_every = 0
samples = 1
"""

USER_TEST = """\
import pytest


@pytest.mark.train
def test_quadrant_trains(vlrl_train):
    run = vlrl_train("quadrant.toml")
    run.assert_agreement_held()
    run.assert_all_parameters_changed()
    assert run.summary["steps"] == 2 and run.summary["sft_steps"] == 3
"""

EXPERTS = """\
from vlrl.envs import register_expert

from quadrant_env import expert

register_expert("quadrant", expert)
"""

ENTRY_POINTS = "[vlrl.envs]\nquadrant = quadrant_env:make_env\nquadrant_experts = quadrant_experts\n"


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("user_project")
    shutil.copy(HERE / "quadrant_env.py", root / "quadrant_env.py")
    (root / "quadrant_experts.py").write_text(EXPERTS)
    (root / "quadrant.toml").write_text(RECIPE)
    (root / "test_quadrant.py").write_text(USER_TEST)
    dist = root / "quadpkg-0.1.dist-info"  # what `pip install` of the user's package would leave
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: quadpkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(ENTRY_POINTS)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [env.get("PYTHONPATH")])])
    env["OMP_NUM_THREADS"] = "1"  # one core, as on an xdist worker (CI: two workers, two cores)
    for key in ("PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST"):
        env.pop(key, None)
    return root, env


def run(project, *argv: str, timeout: int = 300) -> subprocess.CompletedProcess:
    root, env = project
    done = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"{argv} -> {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def test_check_env_passes_the_users_env(project):
    done = run(project, sys.executable, "-m", "vlrl", "check-env", "quadrant_env:make_env", "--n-hostile", "5")
    assert "quadrant_env:make_env: PASS" in done.stdout


@pytest.mark.train
def test_vlrl_train_takes_the_users_module_factory(project):
    root, _ = project
    out = root / "runs" / "cli"
    argv = ["data.env=quadrant_env:make_env", "data.extras={}", "sft.expert=quadrant_env:expert", *TINY]
    done = run(project, sys.executable, "-m", "vlrl", "train", "color_square", *argv, f"run.out={out}")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert (summary["steps"], summary["sft_steps"]) == (2, 3)
    assert 'env = "quadrant_env:make_env"' in (out / "config.toml").read_text()
    assert (out / "metrics.jsonl").read_text().strip()  # the run wrote its metrics


@pytest.mark.train
def test_pytest_in_the_users_project_with_the_plugin(project):
    done = run(project, sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_quadrant.py")
    assert "1 passed" in done.stdout
