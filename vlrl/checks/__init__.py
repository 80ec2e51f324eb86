"""vlrl.checks: conformance checks as plain functions (pytest_vlrl wraps them as fixtures).

Env conformance: :func:`vlrl.checks.envs.check_env`.
"""
