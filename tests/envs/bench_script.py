"""The benchmarks' scripts (files, not a package) loaded as modules, for the tests of their functions."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load(relpath: str, name: str | None = None) -> ModuleType:
    """``benchmarks/<relpath>`` as a module (``name``: the module's name, the file's stem by default)."""
    path = BENCHMARKS / relpath
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
