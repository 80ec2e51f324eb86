"""vlrl.algos stays import-light: torch, the standard library and vlrl.registry (stdlib only) only."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import vlrl.algos

ALGOS_DIR = Path(vlrl.algos.__file__).parent
ALLOWED_ROOTS = {"torch", "vlrl"} | set(sys.stdlib_module_names)


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_sources_import_only_torch_stdlib_and_vlrl_algos():
    offenders = {}
    for path in sorted(ALGOS_DIR.glob("*.py")):
        bad = {
            m
            for m in imported_modules(path)
            if m.split(".")[0] not in ALLOWED_ROOTS
            or (m.startswith("vlrl") and m != "vlrl.registry" and not m.startswith("vlrl.algos"))
        }
        if bad:
            offenders[path.name] = sorted(bad)
    assert not offenders


def test_importing_does_not_load_heavy_packages():
    code = (
        "import sys, vlrl.algos; heavy = {'transformers', 'PIL', 'vllm', 'vlrl.messages'}; "
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_files_and_functions_stay_small():
    for path in ALGOS_DIR.glob("*.py"):
        source = path.read_text()
        assert source.count("\n") <= 400, path.name
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef):
                assert node.end_lineno - node.lineno + 1 <= 60, f"{path.name}:{node.name}"
