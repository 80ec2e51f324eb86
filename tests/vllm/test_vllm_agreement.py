"""Multi-turn rollouts through vLLM agree with the trainer's fp32 ``policy_forward``, per turn, at T = 1.0 and 0.7:
the sampled tokens' logprobs, and the whole distribution (vLLM's top-5 against the trainer's at every generated
token, and the vocabulary KL over them)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from vllm_cases import agreement_bounds

from pytest_vlrl import assert_logprobs_agree
from vlrl.engines.types import SamplingParams
from vlrl.rollout.generator import RolloutConfig, RolloutGenerator
from vlrl.train.batch import CollateSpec, collate
from vlrl.train.forward import policy_forward

pytestmark = pytest.mark.vllm
TOL = 1e-4
ROWS: list[dict[str, Any]] = [{"prompt": None, "env_class": "maze2d/easy", "extras": {}, "seed": s} for s in (0, 1)] + [
    {"prompt": None, "env_class": "geometry", "extras": {}, "seed": s} for s in (5, 6)
]


def rollout(stack, temperature: float, *, repeats: int = 2, max_turns: int = 3, max_tokens: int = 12):
    cfg = RolloutConfig(
        sampling=SamplingParams(temperature=temperature, max_tokens=max_tokens, logprobs_topk=5),
        repeats=repeats,
        max_turns=max_turns,
        seed=11,
        progress=False,
    )
    return RolloutGenerator(stack.renderer, stack.engine, cfg).run(ROWS)


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_multi_turn_vllm_rollout_agrees_with_trainer_per_turn(vllm_stack, tiny, arch, temperature, record_property):
    stack, model = vllm_stack(arch), tiny(arch).model
    trajs = rollout(stack, temperature)
    assert all(t.stop_reason != "engine_error" for t in trajs), [t.error for t in trajs]
    assert max(len(t.turns) for t in trajs) == 3 and sum(len(t.turns) >= 2 for t in trajs) >= 4
    assert {t.weight_version for t in trajs} == {stack.engine.weight_version}
    batch = collate(trajs, CollateSpec.from_model(model))
    with torch.no_grad():
        out = policy_forward(model, batch, probe=True)  # the trainer's top-5 where vLLM reported its own
    report = assert_logprobs_agree(batch, out, tokenizer=tiny(arch).renderer.tokenizer, bounds=agreement_bounds())
    dist = report.distribution
    assert dist is not None and dist.n_positions == report.overall.n_tokens  # every generated token probed
    assert dist.tie_aware_overlap_min == 1.0 and dist.topk_overlap_mean >= 0.99, dist
    assert dist.vocab_kl_max <= 1e-6, dist
    per_turn = {t.turn: t.stats.max_abs for t in report.turns}
    assert set(per_turn) >= {0, 1, 2}
    assert all(v <= TOL for v in per_turn.values()), per_turn
    record_property("max_abs_per_turn", per_turn)
    _measured(
        f"{arch} T={temperature}",
        {
            "overall_max_abs": report.overall.max_abs,
            "per_turn_max_abs": per_turn,
            "tokens": report.overall.n_tokens,
            "topk_overlap_mean": dist.topk_overlap_mean,
            "vocab_kl_max": dist.vocab_kl_max,
        },
    )


def _measured(key: str, value) -> None:
    """Keep the numbers for the report (``$VLRL_VLLM_MEASURE`` names a JSON file; off by default)."""
    path = os.environ.get("VLRL_VLLM_MEASURE")
    if not path:
        return
    p = Path(path)
    data = json.loads(p.read_text()) if p.exists() else {}
    data[key] = value
    p.write_text(json.dumps(data, indent=1, default=str))
