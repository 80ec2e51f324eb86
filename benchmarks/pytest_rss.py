"""A pytest plugin that logs each test's process RSS after it finishes, one file per xdist worker: which tests
leave the CI workers' memory high (they grow to ~8-10 GB each over the suite on a 23 GB machine).

    PYTHONPATH=benchmarks .venv/bin/python -m pytest -p pytest_rss --html=/tmp/rss.html   # logs in /tmp/pytest_rss/
    python benchmarks/pytest_rss.py /tmp/pytest_rss [--out benchmarks/results/test_memory_cpu.json]   # the summary
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

LOGS = Path(os.environ.get("PYTEST_RSS_DIR", "/tmp/pytest_rss"))


def _rss_mb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
    return 0


def pytest_runtest_logfinish(nodeid: str, location: object) -> None:
    LOGS.mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(LOGS / f"rss_{worker}.log", "a") as f:
        f.write(f"{time.time():.0f} {_rss_mb()} {nodeid}\n")


def summarise(logs: Path, top: int = 8) -> dict:
    """Per worker: tests run, RSS at its first and last test and its peak (MB), and the tests that raised it most."""
    out = {}
    for path in sorted(logs.glob("rss_gw*.log")):
        rows = [line.split(" ", 2) for line in path.read_text().splitlines()]
        rss = [int(r[1]) for r in rows]
        deltas = sorted(((b - a, r[2]) for a, b, r in zip(rss, rss[1:], rows[1:])), reverse=True)[:top]
        out[path.stem.removeprefix("rss_")] = {
            "tests": len(rows),
            "first_mb": rss[0],
            "last_mb": rss[-1],
            "peak_mb": max(rss),
            "largest_rises_mb": [{"test": n, "mb": d} for d, n in deltas],
        }
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", type=Path)
    ap.add_argument("--out", default="benchmarks/results/test_memory_cpu.json")
    args = ap.parse_args()
    Path(args.out).write_text(json.dumps(summarise(args.logs), indent=1) + "\n")
