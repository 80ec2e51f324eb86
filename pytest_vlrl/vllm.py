"""vLLM server fixtures and options (marker `vllm`).

``vllm_stack(arch)`` (session) starts a vLLM server for the tiny checkpoint of ``arch`` on first
use and returns a :class:`vlrl.vllm.stack.VllmStack` (``url``, ``renderer``, ``engine``,
``servers``). At most ``--vllm-max-servers`` run at once (2 cores here): asking for another arch
stops the least recently used one. All are stopped at session end. Without vLLM the tests skip
with the reason — except under ``CI=true``, where a missing vLLM is a failure.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from vlrl.vllm.stack import VllmStack


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("vlrl")
    group.addoption(
        "--vllm-max-servers",
        dest="vllm_max_servers",
        type=int,
        default=1,
        help="vLLM servers the vllm tests keep running at once (default 1)",
    )


def require_vllm() -> None:
    from vlrl.vllm.capabilities import vllm_available

    ok, why = vllm_available()
    if ok:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but vLLM is unavailable: {why}", pytrace=False)
    pytest.skip(f"vLLM unavailable: {why}")


@pytest.fixture(scope="session")
def vllm_stack(request: pytest.FixtureRequest, vlrl_model_dir):
    """``vllm_stack(arch, n_servers=1)`` -> a running :class:`VllmStack` for the tiny ``arch`` checkpoint.

    Reused across the session while alive and with enough servers; a test that killed a server
    gets a fresh stack on the next call.
    """
    running: OrderedDict[str, VllmStack] = OrderedDict()
    limit = max(1, request.config.getoption("vllm_max_servers"))

    def get(arch: str, n_servers: int = 1):
        require_vllm()
        if arch in running:
            stack = running.pop(arch)
            if all(s.alive() for s in stack.servers) and len(stack.servers) >= n_servers:
                running[arch] = stack
                return stack
            stack.close()  # a test killed it (or more servers are wanted): start a fresh one
        while len(running) >= limit:
            running.popitem(last=False)[1].close()
        from vlrl.vllm.stack import vllm_stack as start

        running[arch] = start(vlrl_model_dir(arch), n_servers=n_servers)
        return running[arch]

    yield get
    for stack in running.values():
        stack.close()


ARCH_ORDER = ("qwen2_5_vl", "qwen3_vl", "qwen2_vl")
"""vllm tests run grouped by arch in this order; qwen2_vl (two servers, killed at the end) last."""


def _arch_of(item: pytest.Item) -> str:
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "arch" in callspec.params:
        return str(callspec.params["arch"])
    return str(getattr(getattr(item, "module", None), "ARCH", ""))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run vllm tests last, grouped by arch (stable), so each arch's server starts once; within an
    arch, tests of modules with ``DESTRUCTIVE = True`` (they kill servers) run last."""
    vllm_items = [it for it in items if it.get_closest_marker("vllm")]
    if not vllm_items:
        return
    order = {a: i for i, a in enumerate(ARCH_ORDER)}
    for it in vllm_items:
        order.setdefault(_arch_of(it), len(order))
    others = [it for it in items if not it.get_closest_marker("vllm")]
    items[:] = others + sorted(
        vllm_items,
        key=lambda it: (order[_arch_of(it)], bool(getattr(getattr(it, "module", None), "DESTRUCTIVE", False))),
    )
