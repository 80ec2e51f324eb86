"""vlrl.checks: conformance checks as plain functions (pytest_vlrl wraps them as fixtures).

Env conformance: :func:`vlrl.checks.envs.check_env`. Engine logprobs vs a full forward:
:func:`vlrl.checks.logprobs.full_forward_logprobs`.
"""
