"""Run logs: ``metrics.jsonl``, ``agreement.jsonl``, ``image_sensitivity.jsonl`` and ``weight_sync.jsonl``
(one JSON object per line) and TensorBoard.

The files are the contract the HTML report reads (``vlrl.report``); TensorBoard (tensorboardX)
mirrors every scalar of ``metrics.jsonl`` under ``<phase>/<name>``. A resumed run trims every log
back to its size at the checkpoint (:meth:`RunLog.trim`) and rebuilds TensorBoard from the trimmed
``metrics.jsonl``, so nothing done after the checkpoint — and redone after the resume — appears twice.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path

from vlrl.durable import write_atomic

LOGS = ("metrics.jsonl", "agreement.jsonl", "image_sensitivity.jsonl", "weight_sync.jsonl")
"""Every append-only log of a run."""
RUN_FILES = (*LOGS, "summary.json", "report.html")
RUN_DIRS = ("tb", "samples", "checkpoints")


class RunLog:
    def __init__(self, out_dir: Path, *, tensorboard: bool = True, t0: float | None = None):
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.t0 = time.time() if t0 is None else t0
        self._tensorboard = tensorboard
        self.tb = self._writer()

    def _writer(self):
        if not self._tensorboard:
            return None
        try:
            from tensorboardX import SummaryWriter
        except ImportError:  # optional: the JSONL files are the record
            return None
        return SummaryWriter(str(self.dir / "tb"))

    # ------------------------------------------------------------------ resume and restart

    def sizes(self) -> dict[str, int]:
        """Bytes of every log now (recorded in each checkpoint)."""
        return {name: (self.dir / name).stat().st_size for name in LOGS if (self.dir / name).exists()}

    def trim(self, sizes: dict[str, int]) -> None:
        """Cut every log back to ``sizes`` (a checkpoint's) and rebuild TensorBoard from metrics.jsonl."""
        for name in LOGS:
            path = self.dir / name
            if path.exists() and path.stat().st_size > sizes.get(name, 0):
                os.truncate(path, sizes.get(name, 0))
        self._rebuild_tensorboard()

    def reset(self) -> None:
        """A fresh run in this directory: remove what an earlier run here wrote (logs, TensorBoard,
        samples, checkpoints), so its steps and checkpoints never mix with this run's."""
        self.close()
        for name in RUN_FILES:
            (self.dir / name).unlink(missing_ok=True)
        for name in RUN_DIRS:
            shutil.rmtree(self.dir / name, ignore_errors=True)
        self.tb = self._writer()

    def _rebuild_tensorboard(self) -> None:
        self.close()
        shutil.rmtree(self.dir / "tb", ignore_errors=True)
        self.tb = self._writer()
        path = self.dir / "metrics.jsonl"
        if self.tb is None or not path.exists():
            return
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            self._scalars(row)
        self.tb.flush()

    def metrics(self, step: int, phase: str, values: dict) -> dict:
        row = {
            "step": step,
            "phase": phase,
            "time": round(time.time() - self.t0, 3),
            **{k: _num(v) for k, v in values.items()},
        }
        self.append("metrics.jsonl", row)
        self._scalars(row)
        return row

    def _scalars(self, row: dict) -> None:
        if self.tb is None:
            return
        for k, v in row.items():
            if k not in ("step", "phase") and isinstance(v, (int, float)):
                self.tb.add_scalar(f"{row['phase']}/{k}", v, row["step"])

    def agreement(self, step: int, report, diffs) -> dict:
        """One line per RL step: overall and per-turn |Δ| statistics and a log10 histogram."""
        import torch

        o = report.overall
        edges = [-12.0 + 0.5 * i for i in range(25)]  # log10 |Δ| from 1e-12 to 1
        # |Δ| = 0 lands in the first bin and |Δ| >= 1 in the last (histc drops values outside its range)
        d = diffs.abs().double().clamp(min=1e-12, max=0.99).log10() if diffs.numel() else torch.zeros(0)
        counts = torch.histc(d, bins=len(edges) - 1, min=edges[0], max=edges[-1]).long().tolist() if d.numel() else []
        row = {
            "step": step,
            "max_abs": o.max_abs,
            "mean_abs": o.mean_abs,
            "k3": o.k3,
            "ratio_min": o.ratio_min,
            "ratio_max": o.ratio_max,
            "breached": report.breached,
            "bound": report.bounds.max_abs,
            "turns": [{"turn": t.turn, "max_abs": t.stats.max_abs, "mean_abs": t.stats.mean_abs} for t in report.turns],
            "hist": {"edges": edges, "counts": counts},
        }
        if report.breakdown is not None:  # by context depth and first-vs-rest token of each turn
            row.update(report.breakdown.rows())
        if report.distribution is not None:
            dist = report.distribution
            row["distribution"] = {
                "positions": dist.n_positions,
                "k": dist.k,
                "vocab_kl_max": dist.vocab_kl_max,
                "topk_overlap_min": dist.tie_aware_overlap_min,
            }
        self.append("agreement.jsonl", row)
        return row

    def write_json(self, name: str, value) -> None:
        write_atomic(self.dir / name, json.dumps(value, indent=2, default=str))

    def append(self, name: str, row: dict) -> None:
        """One line to a log (``name`` in :data:`LOGS`), whole: written with one call and flushed."""
        if name not in LOGS:
            raise ValueError(f"{name!r} is not a run log; logs: {LOGS}")
        with (self.dir / name).open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
            self.tb = None


def _num(v):
    try:
        v = float(v)
    except (TypeError, ValueError):
        return v
    return None if math.isnan(v) else v
