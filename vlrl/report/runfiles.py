"""Reading a training run directory, tolerant of a run that is still being written.

Layout (every file optional):

    config.toml            the resolved run config
    metrics.jsonl          {"step", "phase": "sft"|"rl"|"eval", "time", ...numbers} per line
    agreement.jsonl        per rl step: {"step", "max_abs", "mean_abs", "k3", "ratio_min", "ratio_max",
                           "breached", "turns": [...], "hist": {"edges", "counts"}}
    samples/step_<N>.jsonl trajectory records (vlrl.rollout.io.trajectory_record) at eval steps
    summary.json           {"eval_before", "eval_after", "steps", "seconds", ...}
    image_sensitivity.jsonl per probe: {"step", "label", "turns", "sensitive_fraction", "passed", ...}

agreement.jsonl rows also carry "by_depth" and "by_turn_position": [{"bin", "n_tokens", "max_abs",
"mean_abs"}] (where the disagreement sits: context depth, first token of a turn vs the rest).

The trainer appends to the JSONL files while it runs, so a torn last line (or any unreadable line)
is skipped and counted in ``RunFiles.warnings`` rather than failing the report.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

_STEP_FILE = re.compile(r"step_(\d+)\.jsonl$")


@dataclass
class RunFiles:
    root: Path
    config_text: str | None = None
    metrics: list[dict[str, Any]] = field(default_factory=list)
    agreement: list[dict[str, Any]] = field(default_factory=list)
    samples: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    """step -> trajectory records, steps ascending."""
    summary: dict[str, Any] | None = None
    image_sensitivity: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def phase(self, name: str) -> list[dict[str, Any]]:
        return [m for m in self.metrics if m.get("phase") == name]

    @property
    def empty(self) -> bool:
        return not (self.config_text or self.metrics or self.agreement or self.samples or self.summary)


def read_run(run_dir: str | Path) -> RunFiles:
    """Everything readable under ``run_dir``; raise only when the directory itself is missing."""
    root = Path(run_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"run directory {root} does not exist (or is not a directory)")
    run = RunFiles(root=root)
    config = root / "config.toml"
    if config.is_file():
        run.config_text = config.read_text(encoding="utf-8", errors="replace")
    run.metrics = read_jsonl(root / "metrics.jsonl", run.warnings)
    run.agreement = sorted(read_jsonl(root / "agreement.jsonl", run.warnings), key=_step_key)
    run.samples = read_samples(root / "samples", run.warnings)
    run.summary = _read_json(root / "summary.json", run.warnings)
    run.image_sensitivity = read_jsonl(root / "image_sensitivity.jsonl", run.warnings)
    return run


def read_jsonl(path: Path, warnings: list[str] | None = None) -> list[dict[str, Any]]:
    """The JSON objects of ``path`` (``[]`` when absent); bad lines are skipped with a warning."""
    if not path.is_file():
        return []
    rows, bad = [], 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if isinstance(obj, dict):
            rows.append(obj)
        else:
            bad += 1
    if bad and warnings is not None:
        warnings.append(f"{path.name}: skipped {bad} unreadable line(s)")
    return rows


def read_samples(folder: Path, warnings: list[str] | None = None) -> dict[int, list[dict[str, Any]]]:
    if not folder.is_dir():
        return {}
    found = {}
    for path in folder.iterdir():
        match = _STEP_FILE.search(path.name)
        if match:
            found[int(match.group(1))] = read_jsonl(path, warnings)
    return dict(sorted(found.items()))


def _read_json(path: Path, warnings: list[str]) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        warnings.append(f"{path.name}: unreadable ({exc})")
        return None
    return obj if isinstance(obj, dict) else None


def _step_key(row: dict[str, Any]) -> float:
    step = row.get("step")
    return float(step) if isinstance(step, (int, float)) else float("inf")


def series(rows: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """``(steps, values)`` of the rows that hold a finite number under ``key`` and a numeric step."""
    xs, ys = [], []
    for row in rows:
        step, value = row.get("step"), row.get(key)
        if _is_number(step) and _is_number(value) and value == value and abs(value) != float("inf"):
            xs.append(float(step))
            ys.append(float(value))
    return xs, ys


def _is_number(x: Any) -> TypeGuard[int | float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool)
