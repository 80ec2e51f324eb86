"""Golden scenarios played with vLLM's renderer reproduce the golden files byte for byte."""

from __future__ import annotations

from pathlib import Path

import pytest

from vlrl.golden.files import golden_diff, golden_path, render_scenario
from vlrl.golden.scenarios import SCENARIOS

pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parents[2] / "golden"
N_SERVERS = {"qwen2_vl": 2}


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl", "qwen2_vl"])
def test_goldens_through_vllm(vllm_stack, arch):
    """Every scenario (maze2d_multi_turn and geometry_tool_calls among them), renderer and engine from vLLM."""
    stack = vllm_stack(arch, N_SERVERS.get(arch, 1))
    assert {"maze2d_multi_turn", "geometry_tool_calls"} <= set(SCENARIOS)
    for name in sorted(SCENARIOS):
        want = golden_path(ROOT, arch, name).read_text(encoding="utf-8")
        got = render_scenario(arch, name, stack.server_renderer, stack.engine.max_context)
        assert got == want, f"{arch}/{name}.golden through vLLM:\n{golden_diff(want, got)}"
