"""Fixtures of the rollout tests: the probe env, registered for the session."""

from __future__ import annotations

import pytest
from rollout_env import PROBE, ProbeEnv

from vlrl.envs.registry import register_env, unregister_env


@pytest.fixture(scope="session")
def probe_env():
    register_env(PROBE, lambda extras, seed: ProbeEnv(extras, seed), replace=True)
    yield PROBE
    unregister_env(PROBE)
