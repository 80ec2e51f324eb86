"""Summarise py-spy's collapsed stacks (``--format raw --subprocesses --threads``) into JSON: busy samples per
process and thread, and each process's top frames by self samples (the leaf) and by inclusive samples.

    python benchmarks/pyspy_summary.py pyspy_raw.txt OUT.json [--top 30]
"""

import argparse
import collections
import json
import re


def parse(path: str):
    """Yield ``(process, thread, frames, samples)`` per collapsed line."""
    with open(path, errors="replace") as f:
        text = f.read()
    # a process's cmdline may hold newlines; lines end with " <count>"
    for m in re.finditer(r"(.*?) (\d+)\n", text, flags=re.S):
        line, proc = m[1], "?"
        at = line.rfind("process ")  # the innermost process; its cmdline is quoted and may hold ';'
        if at >= 0:
            end = line.find('";', at)
            proc, line = (line[at:], "") if end < 0 else (line[at : end + 1], line[end + 2 :])
        parts = line.split(";") if line else []
        thread = parts.pop(0)[:60] if parts and parts[0].startswith("thread ") else "?"
        yield re.sub(r"\s+", " ", proc)[:160], thread, parts, int(m[2])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("raw")
    ap.add_argument("out")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    per_proc: dict = collections.defaultdict(
        lambda: {
            "samples": 0,
            "threads": collections.Counter(),
            "self": collections.Counter(),
            "inclusive": collections.Counter(),
        }
    )
    for proc, thread, frames, n in parse(args.raw):
        p = per_proc[proc]
        p["samples"] += n
        p["threads"][thread] += n
        if frames:
            p["self"][frames[-1]] += n
            for fr in set(frames):
                p["inclusive"][fr] += n
    out = {
        proc: {
            "samples": p["samples"],
            "threads": dict(p["threads"].most_common(12)),
            "self": dict(p["self"].most_common(args.top)),
            "inclusive": dict(p["inclusive"].most_common(args.top)),
        }
        for proc, p in sorted(per_proc.items(), key=lambda kv: -kv[1]["samples"])
    }
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
