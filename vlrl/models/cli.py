"""``vlrl build-model``: write a random-init Qwen-VL checkpoint directory, offline."""

from __future__ import annotations

import argparse
import json

from vlrl.cli import count
from vlrl.models.archs import ARCHS, SIZES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arch", choices=ARCHS, default="qwen2_5_vl", help="transformers architecture")
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny", help="named size (tiny: CPU tests; 2b: GPU)")
    parser.add_argument("--seed", type=count(0), default=0, help="weights are a pure function of (arch, size, seed)")
    parser.add_argument("--out", required=True, help="directory to write (created)")


def run(args: argparse.Namespace) -> int:
    from vlrl.models.build import MANIFEST, write_checkpoint

    path = write_checkpoint(args.out, args.arch, args.size, args.seed)
    print(json.dumps({"path": str(path), **json.loads((path / MANIFEST).read_text())}))
    return 0
