"""The front door: a user's own env (``quadrant_env.py`` here, copied into a fresh project by the tests)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.fixture
def user_env(tmp_path, monkeypatch):
    """A fresh directory holding ``quadrant_env.py`` (under a name of its own), first on ``sys.path``;
    the module name, so each test's import is its own."""
    name = f"quadrant_env_{abs(hash(str(tmp_path))) % 10**8}"
    shutil.copy(HERE / "quadrant_env.py", tmp_path / f"{name}.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)
    from vlrl.envs.registry import ENVS, EXPERTS

    for key in [k for k in ENVS.names() if k.startswith(name)]:
        ENVS.remove(key)
    for key in [k for k in EXPERTS.names() if k.startswith(name)]:
        EXPERTS.remove(key)
