"""Golden token / loss-mask files. For your own env's files, the public API is :class:`Scenario`
(see :mod:`vlrl.golden.user`): a ``SCENARIOS`` list in a module of your project, then
``vlrl golden regen --scenarios <module>`` and, in pytest, ``vlrl_golden.check_scenario(scenario)``."""

from vlrl.golden.user import Scenario, ScenarioError, load_scenarios

__all__ = ["Scenario", "ScenarioError", "load_scenarios"]
