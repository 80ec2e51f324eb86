"""pytest-vlrl: the pytest plugin over ``vlrl.checks``. Hooks and fixtures only; the checks
themselves are library code, importable without pytest."""

import pytest

pytest.register_assert_rewrite("pytest_vlrl.assertions")

# After the registration above, so the comparators get pytest's assertion rewriting.
from pytest_vlrl.assertions import assert_logprobs_agree  # noqa: E402

__all__ = ["assert_logprobs_agree"]
