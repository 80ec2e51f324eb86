"""Env conformance in pytest: run :func:`vlrl.checks.envs.check_env` over registered or user envs.

Three ways in:

- Ask for the ``vlrl_env_name`` argument and the test runs once per registered env (built-ins
  plus whatever your conftest registered with ``vlrl.envs.register_env``)::

      def test_conforms(vlrl_env_name, vlrl_check_env):
          vlrl_check_env(vlrl_env_name)

- Choose envs yourself: ``@parametrize_envs("maze2d/easy", "my_env")`` (same argument name).
- Check one factory: ``vlrl_check_env(lambda seed: MyEnv(seed=seed), n_hostile=100)``.

Failures come back as one readable list (``[check] detail`` per line), not a traceback.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

ENV_NAME_ARG = "vlrl_env_name"


def parametrize_envs(*names: str) -> pytest.MarkDecorator:
    """``@parametrize_envs("a", "b")`` over those envs, or over every registered env when none are given."""
    if not names:
        from vlrl.envs import registered_envs

        names = tuple(registered_envs())
    return pytest.mark.parametrize(ENV_NAME_ARG, list(names), ids=list(names))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Tests taking ``vlrl_env_name`` without an explicit parametrize run over every registered env."""
    if ENV_NAME_ARG not in metafunc.fixturenames:
        return
    if any(ENV_NAME_ARG in m.args[0] for m in metafunc.definition.iter_markers("parametrize")):
        return
    from vlrl.envs import registered_envs

    names = registered_envs()
    metafunc.parametrize(ENV_NAME_ARG, names, ids=names)


@pytest.fixture
def vlrl_check_env() -> Callable[..., Any]:
    """``check(factory_or_name, **check_env_kwargs) -> EnvCheckReport``; fails the test on any failure."""

    def check(factory: Any, **kwargs: Any):
        __tracebackhide__ = True
        from vlrl.checks.envs import check_env

        report = check_env(factory, raise_on_failure=False, **kwargs)
        if not report.ok:
            pytest.fail(report.summary(), pytrace=False)
        return report

    return check
