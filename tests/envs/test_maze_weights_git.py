"""A lease's weights kept in git history, out of the working tree (benchmarks/device/weights_git.py).

What must hold: after ``archive`` the working tree and the index are as they were (the device carries the tree, and
a staged change of the user's stays staged, uncommitted), yet a fresh clone restores the parts byte for byte; a name
archived twice and an unknown name are one-line errors that name it. A temporary repository; ~1 s.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from bench_script import load  # tests/envs is on sys.path (as maze_cpu)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def repo(tmp_path, monkeypatch):
    for k in ("GIT_AUTHOR", "GIT_COMMITTER"):  # a CI machine may have no git identity
        monkeypatch.setenv(f"{k}_NAME", "t")
        monkeypatch.setenv(f"{k}_EMAIL", "t@t")
    r = tmp_path / "repo"
    r.mkdir()
    _git(r, "init", "-q", "-b", "main")
    (r / "README.md").write_text("x\n")
    _git(r, "add", "README.md")
    _git(r, "commit", "-q", "-m", "first")
    return r


@pytest.fixture
def parts(tmp_path):
    d = tmp_path / "p1"
    d.mkdir()
    for i, n in enumerate((3000, 1500)):
        (d / f"part.{i:02d}").write_bytes(os.urandom(n))
    return d


def test_archive_keeps_the_parts_in_history_and_leaves_the_tree_and_index_as_they_were(repo, parts, tmp_path):
    wg = load("device/weights_git.py")
    (repo / "README.md").write_text("staged, not for the archive\n")
    _git(repo, "add", "README.md")
    sha = wg.archive(repo, "lease_x", parts, "what they are")
    assert not (repo / wg.ROOT).exists()
    assert _git(repo, "status", "--porcelain").splitlines() == ["M  README.md"]  # still staged, not committed
    assert _git(repo, "show", "-s", "--format=%B", sha).strip().endswith("what they are")
    assert _git(repo, "ls-tree", "-r", "--name-only", "HEAD", "--", wg.ROOT) == ""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
    assert wg.archived(clone) == {"lease_x": sha}
    got = wg.restore(clone, "lease_x", tmp_path / "back")
    assert [p.name for p in got] == ["part.00", "part.01"]
    assert [p.read_bytes() for p in got] == [(parts / p.name).read_bytes() for p in got]


def test_a_name_archived_twice_or_unknown_is_an_error_that_names_it(repo, parts, tmp_path):
    wg = load("device/weights_git.py")
    wg.archive(repo, "lease_x", parts)
    with pytest.raises(ValueError, match="lease_x is archived already"):
        wg.archive(repo, "lease_x", parts)
    with pytest.raises(KeyError, match="no archived weights named 'lease_y' \\(archived: lease_x\\)"):
        wg.restore(repo, "lease_y", tmp_path / "back")
    with pytest.raises(FileNotFoundError, match="no part.NN files"):
        wg.archive(repo, "lease_z", tmp_path)
    assert not (repo / wg.ROOT).exists()


def test_a_refused_commit_leaves_the_index_and_tree_as_they_were(repo, parts):
    """A commit hook that refuses (the fault injected: a real hook) must not leave the parts staged or on disk."""
    wg = load("device/weights_git.py")
    hook = repo / ".git" / "hooks" / "pre-commit"
    hook.write_text("#!/bin/sh\necho no weights here >&2\nexit 1\n")
    hook.chmod(0o755)
    with pytest.raises(RuntimeError, match="no weights here"):
        wg.archive(repo, "lease_x", parts)
    assert _git(repo, "status", "--porcelain") == ""
    assert wg.archived(repo) == {}
