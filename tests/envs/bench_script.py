"""The benchmarks' scripts (files, not a package) loaded as modules, for the tests of their functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load(relpath: str, name: str | None = None) -> ModuleType:
    """``benchmarks/<relpath>`` as a module (``name``: the module's name, the file's stem by default), registered in
    ``sys.modules`` as an import would be: a script's dataclasses look their module up there."""
    path = BENCHMARKS / relpath
    name = name or path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
