"""The one-rank FSDP2/plain pair ratios of every committed ``benchmarks/fsdp_vs_plain.py`` run, per run and pooled.

Each run's median of pair ratios, with a 95 % bootstrap interval (``fsdp_vs_plain.median_ci95``), and the same over
all runs' pairs together, per the dtype FSDP2 reduced in (fp32 before session 54; one rank now sums in the compute
dtype, ``vlrl.train.fsdp``): the runs differ in micro-batch and FSDP group size, whose effect measured below the spread
between runs (benchmarks/results/fsdp_h100/59cbb6e/README.md), so the pooled figure is the best estimate of the
one-rank overhead the FSDP issue bounds at 1.10. A run of FSDP2 against plain counts in either order (``--sides
plain,fsdp`` is inverted) and ``fsdp_fp32_reduce`` pools with the fp32 runs; FSDP2 against FSDP2 does not count.

    python benchmarks/fsdp_pairs_pooled.py OUT.json
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fsdp_vs_plain import median_ci95


def main() -> int:
    root = Path(__file__).resolve().parent / "results" / "fsdp_h100"
    runs, pooled = [], {}
    for path in sorted(root.glob("*/fsdp_vs_plain*.json")):
        d = json.loads(path.read_text())
        sides = d.get("sides", ["fsdp", "plain"])
        if "plain" not in sides or sides == ["plain", "plain"]:  # FSDP2 against FSDP2: not the bar's ratio
            continue
        fsdp = sides[1 - sides.index("plain")]
        # A run's ratios are its first side's times over its second's: plain first (--sides plain,fsdp) inverts them.
        pairs = d["pair_ratios"] if sides[0] == fsdp else [1 / r for r in d["pair_ratios"]]
        reduce = d.get("reduce_dtypes", {}).get(fsdp, "float32")  # runs before session 54 reduced in fp32
        pooled.setdefault(reduce, []).extend(pairs)
        runs.append(
            {
                "file": str(path.relative_to(root.parent.parent.parent)),
                "sides": sides,
                "fsdp_reduce_dtype": reduce,
                "micro_batch": d.get("micro_batch"),
                "group_fraction": d.get("group_fraction"),
                "pairs": len(pairs),
                "median": round(statistics.median(pairs), 3),
                "ci95": [round(x, 3) for x in median_ci95(pairs)],
            }
        )
    result = {
        "runs": runs,
        "pooled": {  # by the dtype FSDP2 summed and reduced gradients in: one figure per library behaviour
            reduce: {
                "pairs": len(pairs),
                "median": round(statistics.median(pairs), 3),
                "ci95": [round(x, 3) for x in median_ci95(pairs)],
            }
            for reduce, pairs in pooled.items()
        },
    }
    Path(sys.argv[1]).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["pooled"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
