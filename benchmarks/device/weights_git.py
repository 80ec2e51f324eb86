"""Keep a lease's weights in this repo's history, out of its working tree: the one store that outlasts a session.

Why: a device machine's disk goes with its lease, and this checkout's ignored files (``.gpuwork/``) outlasted some
sessions and not others — session 74 found lease_v4's and lease_h3's weights gone, four leases of easy (73.6 GPU
minutes) and three of hard behind them. What has landed on ``main`` is what a new session's checkout holds. The
working tree cannot hold them: every device call carries it, 64 MiB in all with what the call carries, and the small
model's parts are ~57 MiB. So ``archive`` commits the parts (``benchmarks/device/weights_parts.py``'s, as a call
brought them back) under ``benchmarks/weights/NAME/`` and, in a second commit, removes them again: the first commit
keeps them, the tree stays as it was. ``restore`` finds that commit by the path alone and writes the parts out::

    python benchmarks/device/weights_git.py archive lease_v5 .gpuwork/lease_v5/p1 -m "easy from random init, 93.5 %"
    python benchmarks/device/weights_git.py restore lease_v5 .gpuwork/lease_v5/p1
    python benchmarks/device/weights_git.py list

Each archive adds its parts' size to the repository's history (a fresh clone fetches it); archive what a later
lease starts from, not every snapshot. Only the two commits' own paths are committed: anything else staged stays
staged.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
from pathlib import Path

ROOT = "benchmarks/weights"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def _git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"git {' '.join(args)}: {out.stderr.strip() or out.stdout.strip()}")
    return out.stdout


def archived(repo: Path) -> dict[str, str]:
    """Every archived name and the commit that added its parts, newest first."""
    found: dict[str, str] = {}
    sha = ""
    for line in _git(repo, "log", "--diff-filter=A", "--name-only", "--format=%H", "--", ROOT).splitlines():
        if re.fullmatch(r"[0-9a-f]{40}", line):
            sha = line
        elif line.startswith(ROOT + "/"):
            found.setdefault(line.split("/")[2], sha)
    return found


def archive(repo: Path, name: str, parts: Path, message: str = "") -> str:
    """Commit ``parts``' ``part.NN`` files under ``ROOT/name`` and then remove them; returns the commit that holds
    them."""
    if not NAME.fullmatch(name):
        raise ValueError(f"archive name {name!r}: letters, digits, '.', '_' and '-' only")
    files = sorted(parts.glob("part.*"))
    if not files:
        raise FileNotFoundError(f"no part.NN files in {parts}")
    kept = archived(repo).get(name)
    if kept:
        raise ValueError(f"{name} is archived already (commit {kept[:10]}): choose another name")
    rel = f"{ROOT}/{name}"
    dst = repo / rel
    if dst.exists():
        raise FileExistsError(f"{dst} exists: move it away first")
    dst.mkdir(parents=True)
    for f in files:
        shutil.copyfile(f, dst / f.name)
    mib = sum(f.stat().st_size for f in files) / 2**20
    sha = ""
    try:
        _git(repo, "add", "-f", "--", rel)
        head = f"weights {name}: {len(files)} parts, {mib:.1f} MiB (benchmarks/device/weights_git.py)"
        _git(repo, "commit", "-q", "-m", head + (f"\n\n{message}" if message else ""), "--", rel)
        sha = _git(repo, "rev-parse", "HEAD").strip()
        _git(repo, "rm", "-r", "-q", "--", rel)
        _git(repo, "commit", "-q", "-m", f"weights {name}: out of the working tree, kept at {sha[:10]}", "--", rel)
    except RuntimeError as e:
        if not sha:  # nothing committed: the index as it was
            subprocess.run(["git", "-C", str(repo), "reset", "-q", "--", rel], capture_output=True)
            raise
        raise RuntimeError(f"{e}; the parts are kept at {sha[:10]} but still tracked: git rm -r {rel}, commit") from e
    finally:
        shutil.rmtree(dst, ignore_errors=True)
    return sha


def restore(repo: Path, name: str, dst: Path) -> list[Path]:
    """The archived ``name``'s parts written into ``dst`` (``weights_parts.py unpack`` makes the model of them)."""
    known = archived(repo)
    sha = known.get(name)
    if sha is None:
        raise KeyError(f"no archived weights named {name!r} (archived: {', '.join(sorted(known)) or 'none'})")
    paths = _git(repo, "ls-tree", "-r", "--name-only", sha, "--", f"{ROOT}/{name}/").split()
    dst.mkdir(parents=True, exist_ok=True)
    out = []
    for path in paths:
        blob = subprocess.run(["git", "-C", str(repo), "show", f"{sha}:{path}"], capture_output=True, check=True)
        out.append(dst / Path(path).name)
        out[-1].write_bytes(blob.stdout)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[2])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("archive", help="parts -> two commits (added, then removed from the tree)")
    a.add_argument("name")
    a.add_argument("parts", type=Path)
    a.add_argument("-m", "--message", default="", help="what the weights are (the commit's body)")
    r = sub.add_parser("restore", help="archived parts -> a directory")
    r.add_argument("name")
    r.add_argument("dst", type=Path)
    sub.add_parser("list", help="archived names and their commits")
    args = ap.parse_args()
    if args.cmd == "archive":
        print(f"{args.name}: kept at {archive(args.repo, args.name, args.parts, args.message)}")
    elif args.cmd == "restore":
        got = restore(args.repo, args.name, args.dst)
        print(f"{len(got)} parts, {sum(p.stat().st_size for p in got) / 2**20:.1f} MiB, under {args.dst}")
    else:
        for name, sha in archived(args.repo).items():
            print(f"{name}\t{sha}")


if __name__ == "__main__":
    main()
