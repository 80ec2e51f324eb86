"""Run logs: ``metrics.jsonl`` and ``agreement.jsonl`` (one JSON object per line) and TensorBoard.

The files are the contract the HTML report reads (``vlrl.report``); TensorBoard (tensorboardX)
mirrors every scalar under ``<phase>/<name>``.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path


class RunLog:
    def __init__(self, out_dir: Path, *, tensorboard: bool = True, t0: float | None = None):
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.t0 = time.time() if t0 is None else t0
        self.tb = None
        if tensorboard:
            try:
                from tensorboardX import SummaryWriter

                self.tb = SummaryWriter(str(self.dir / "tb"))
            except ImportError:  # optional: the JSONL files are the record
                self.tb = None

    def metrics(self, step: int, phase: str, values: dict) -> dict:
        row = {"step": step, "phase": phase, "time": round(time.time() - self.t0, 3),
               **{k: _num(v) for k, v in values.items()}}
        self._append("metrics.jsonl", row)
        if self.tb is not None:
            for k, v in row.items():
                if k not in ("step", "phase") and isinstance(v, (int, float)):
                    self.tb.add_scalar(f"{phase}/{k}", v, step)
        return row

    def agreement(self, step: int, report, diffs) -> dict:
        """One line per RL step: overall and per-turn |Δ| statistics and a log10 histogram."""
        import torch

        o = report.overall
        edges = [-12.0 + 0.5 * i for i in range(25)]  # log10 |Δ| from 1e-12 to 1
        d = diffs.abs().double().clamp(min=1e-12).log10() if diffs.numel() else torch.zeros(0)
        counts = torch.histc(d, bins=len(edges) - 1, min=edges[0], max=edges[-1]).long().tolist() if d.numel() else []
        row = {"step": step, "max_abs": o.max_abs, "mean_abs": o.mean_abs, "k3": o.k3, "ratio_min": o.ratio_min,
               "ratio_max": o.ratio_max, "breached": report.breached, "bound": report.bounds.max_abs,
               "turns": [{"turn": t.turn, "max_abs": t.stats.max_abs, "mean_abs": t.stats.mean_abs}
                         for t in report.turns],
               "hist": {"edges": edges, "counts": counts}}
        if report.breakdown is not None:  # by context depth and first-vs-rest token of each turn
            row.update(report.breakdown.rows())
        if report.distribution is not None:
            dist = report.distribution
            row["distribution"] = {"positions": dist.n_positions, "k": dist.k, "vocab_kl_max": dist.vocab_kl_max,
                                   "topk_overlap_min": dist.tie_aware_overlap_min}
        self._append("agreement.jsonl", row)
        return row

    def write_json(self, name: str, value) -> None:
        (self.dir / name).write_text(json.dumps(value, indent=2, default=str))

    def _append(self, name: str, row: dict) -> None:
        with (self.dir / name).open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def _num(v):
    try:
        v = float(v)
    except (TypeError, ValueError):
        return v
    return None if math.isnan(v) else v
