"""Running the suite on pytest-xdist workers: ``pytest -n 2 --dist loadgroup --no-loadscope-reorder``.

Each test gets one ``xdist_group``, so the tests that share an expensive fixture run on one worker and
build it once:

- ``vllm``: every test of a vLLM server (marker ``vllm`` or the ``vllm_stack`` fixture): one worker starts
  the servers, in ``pytest_vlrl.vllm``'s order (grouped by arch, destructive tests last);
- a module's ``XDIST_GROUP`` (tests that start no server, such as vLLM in the test's own process): one worker,
  beside the servers' (the in-process engine's tests took 5 min on the servers' worker, the CI's critical path);
- ``color_square_warm_start``: the RL tests that start from the session's format-only warm start;
- else the test's file (module-scoped fixtures, such as the FSDP runs, are built once).

The marks are added in a ``tryfirst`` hook: xdist reads them in its own ``pytest_collection_modifyitems``
(it appends the group to the node id), so a mark added after it would leave each worker its own vLLM servers.
Groups are queued longest first as far as the marks tell (vLLM, then any with a ``train`` or ``slow`` test), so
the last ones handed out are short. On a worker torch runs one intra-op thread (two workers, two cores), set
after collection so that collection-time checks (a ``skipif`` on the thread count) see the process default.
"""

from __future__ import annotations

import os

import pytest

SHARED_FIXTURE_GROUPS = ("color_square_warm_start",)
"""Session fixtures whose tests must share a worker: each is built once (about a minute or more)."""

_GROUP = pytest.StashKey[str]()


def on_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def group_of(item: pytest.Item) -> str:
    names = getattr(item, "fixturenames", ())
    own = getattr(getattr(item, "module", None), "XDIST_GROUP", None)
    if own and "vllm_stack" not in names:
        return str(own)  # a module that starts no server (e.g. vLLM in the test's process) may run beside them
    if item.get_closest_marker("vllm") or "vllm_stack" in names:
        return "vllm"
    for fixture in SHARED_FIXTURE_GROUPS:
        if fixture in names:
            return fixture
    return item.nodeid.split("::", 1)[0]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Before xdist reads them: one ``xdist_group`` per test."""
    if not on_worker(config):
        return
    for item in items:
        group = group_of(item)
        item.stash[_GROUP] = group
        item.add_marker(pytest.mark.xdist_group(group))


def _rank(group: str, members: list[pytest.Item]) -> int:
    if group == "vllm" or any(it.get_closest_marker("vllm") for it in members):
        return 0
    if any(it.get_closest_marker("train") or it.get_closest_marker("slow") for it in members):
        return 1
    return 2


class _LongGroupsFirst:
    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        """After the other hooks ordered the tests: each group's tests together, in that order, long groups first."""
        if config.getvalue("loadgroup") and items and "@" not in items[0].nodeid:
            # xdist marks a group by renaming the node id; pytest 9.2 ignores the rename (pyproject pins <9.2)
            pytest.exit("xdist_group was not applied: each worker would start its own vLLM servers", returncode=3)
        groups: dict[str, list[pytest.Item]] = {}
        for item in items:
            groups.setdefault(item.stash[_GROUP], []).append(item)
        order = sorted(groups, key=lambda g: _rank(g, groups[g]))  # stable: collection order within a rank
        items[:] = [it for g in order for it in groups[g]]


def pytest_configure(config: pytest.Config) -> None:
    if on_worker(config):
        config.pluginmanager.register(_LongGroupsFirst(), "vlrl-long-groups-first")
        # two workers share two cores: a vLLM server starts in up to twice its time alone (240 s was missed once)
        os.environ.setdefault("VLRL_VLLM_STARTUP_TIMEOUT", "600")


_DEFAULT_THREADS = pytest.StashKey[int]()


def pytest_collection_finish(session: pytest.Session) -> None:
    if not on_worker(session.config):
        return
    import torch

    session.config.stash[_DEFAULT_THREADS] = torch.get_num_threads()
    torch.set_num_threads(1)


@pytest.fixture
def torch_default_threads(request: pytest.FixtureRequest):
    """For a test about torch's thread counts: the process default for its duration (a worker runs one)."""
    import torch

    default = request.config.stash.get(_DEFAULT_THREADS, None)
    if default is None:
        yield torch.get_num_threads()
        return
    torch.set_num_threads(default)
    try:
        yield default
    finally:
        torch.set_num_threads(1)
