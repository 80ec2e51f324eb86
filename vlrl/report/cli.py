"""``vlrl report RUN_DIR [--out FILE]``: one self-contained HTML report of a training run directory.

vlrl report runs/color_square            # writes runs/color_square/report.html
vlrl report runs/color_square --out reports/color_square.html
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="training run directory (metrics.jsonl, agreement.jsonl, samples/, ...)")
    parser.add_argument("--out", default=None, help="report path (default: RUN_DIR/report.html)")


def run(args: argparse.Namespace) -> int:
    from vlrl.report.training import write_report

    try:
        path = write_report(args.run_dir, args.out)
    except FileNotFoundError as exc:
        print(f"vlrl report: {exc}", file=sys.stderr)
        return 2
    size_kb = path.stat().st_size / 1024
    print(f"wrote {path} ({size_kb:.0f} kB)")
    return 0
