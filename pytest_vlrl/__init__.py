"""pytest-vlrl: the pytest plugin over ``vlrl.checks``. Hooks and fixtures only; the checks
themselves are library code, importable without pytest."""

import pytest

pytest.register_assert_rewrite("pytest_vlrl.assertions")
