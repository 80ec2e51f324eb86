"""Dataset rows ``{prompt, env_class, extras, seed}`` and their parquet files.

On disk (via pandas + pyarrow): ``prompt`` and ``extras`` are JSON strings (sorted keys), because
pyarrow would otherwise turn nested dicts into structs that come back with missing keys filled
by None and lists as numpy arrays; ``env_class`` is a string; ``seed`` is a nullable int64.
:func:`read_rows` returns exactly the rows :func:`write_rows` was given.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlrl.errors import BadInputError

COLUMNS = ("prompt", "env_class", "extras", "seed")


@dataclass(frozen=True)
class EnvRow:
    """One dataset row: the prompt (messages; a placeholder for env tickets), the env and its seed."""

    prompt: list[dict[str, Any]]
    env_class: str
    extras: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None

    def to_record(self) -> dict[str, Any]:
        """The row as flat parquet columns (nested fields as JSON strings)."""
        return {
            "prompt": json.dumps(self.prompt, sort_keys=True, ensure_ascii=False),
            "env_class": self.env_class,
            "extras": json.dumps(self.extras, sort_keys=True, ensure_ascii=False),
            "seed": self.seed,
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> EnvRow:
        missing = [c for c in ("prompt", "env_class") if c not in record]
        if missing:
            raise BadInputError(f"dataset row lacks column(s) {missing}")
        prompt, extras = record["prompt"], record.get("extras")
        try:
            prompt = json.loads(prompt) if isinstance(prompt, str) else prompt
            extras = json.loads(extras) if isinstance(extras, str) else (extras or {})
        except json.JSONDecodeError as exc:
            raise BadInputError(f"the prompt or extras column is not JSON ({exc})") from None
        if not isinstance(extras, dict):
            raise BadInputError(f"extras must be a JSON object, got {type(extras).__name__}")
        seed = record.get("seed")
        seed = None if seed is None or seed != seed else int(seed)  # NaN / pd.NA -> None
        return cls(prompt=prompt, env_class=str(record["env_class"]), extras=extras, seed=seed)

    def as_dict(self) -> dict[str, Any]:
        """The row as the mapping :func:`vlrl.envs.env_from_row` takes."""
        return {"prompt": self.prompt, "env_class": self.env_class, "extras": self.extras, "seed": self.seed}


def write_rows(rows: Iterable[EnvRow], path: str | Path) -> Path:
    """Write rows to a parquet file (parent folders created); returns the path."""
    import pandas as pd

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame([r.to_record() for r in rows], columns=list(COLUMNS))
    frame["seed"] = frame["seed"].astype("Int64")
    frame.to_parquet(path, index=False)
    return path


def read_rows(path: str | Path) -> list[EnvRow]:
    """Read rows written by :func:`write_rows` (or any parquet with these columns)."""
    import pandas as pd

    try:
        frame = pd.read_parquet(path)
    except FileNotFoundError:
        raise
    except Exception as exc:  # noqa: BLE001 — pyarrow's errors for a file that is not parquet vary by version
        raise BadInputError(f"{path}: not a readable parquet dataset ({type(exc).__name__}: {exc})") from None
    records = frame.astype(object).where(frame.notna(), None).to_dict(orient="records")
    rows = []
    for i, record in enumerate(records):
        try:
            rows.append(EnvRow.from_record(record))
        except BadInputError as exc:
            raise BadInputError(f"{path}, row {i}: {exc}") from None
    return rows
