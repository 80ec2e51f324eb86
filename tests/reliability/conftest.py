"""Fixtures of the reliability suite: the faulty env, registered for the session."""

from __future__ import annotations

import pytest
from reliability_helpers import FAULTY, FaultyEnv

from vlrl.envs.registry import register_env, unregister_env


@pytest.fixture(scope="session")
def faulty_env():
    register_env(FAULTY, lambda extras, seed: FaultyEnv(extras, seed), replace=True)
    yield FAULTY
    unregister_env(FAULTY)
