"""Servers killed during a rollout. Two servers behind one client: when one dies, its requests (and
renders) fail over to the other and every trajectory completes, with logprobs still in agreement.
When the last one dies: a clear error per trajectory (stop_reason "engine_error", naming the URLs),
each keeps the turns it had, and the rollout returns promptly. Runs last for its arch (it kills)."""

from __future__ import annotations

import asyncio
import time
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
ARCH = "qwen2_vl"
DESTRUCTIVE = True
N = 4
GATE_S = 120.0
ROWS: list[dict[str, Any]] = [{"prompt": None, "env_class": "maze2d/easy", "extras": {}, "seed": s} for s in range(N)]


class KillBeforeTurn1:
    """The engine, except that once all N episodes have asked for turn 1 (each has finished and
    rendered turn 0), ``kill`` runs — at once, or ``delay_s`` after the turn-1 requests are sent (in flight)."""

    def __init__(self, engine, kill, *, delay_s: float | None = None, turn1_params: SamplingParams | None = None):
        self.engine, self.kill, self.delay_s, self.turn1_params = engine, kill, delay_s, turn1_params
        self.calls, self.gate = 0, None

    def __getattr__(self, name):
        return getattr(self.engine, name)

    async def agenerate(self, prompt, params, **kw):
        self.calls += 1
        if self.calls <= N:
            return await self.engine.agenerate(prompt, params, **kw)
        self.gate = self.gate or asyncio.Event()
        if self.calls == 2 * N:
            if self.delay_s is None:
                self.kill()
            else:
                asyncio.get_running_loop().call_later(self.delay_s, self.kill)
            self.gate.set()
        try:  # bounded: an episode that ended at turn 0 would leave the gate shut, and the rollout hung for good
            await asyncio.wait_for(self.gate.wait(), GATE_S)
        except TimeoutError:
            asked = self.calls - N
            raise RuntimeError(f"only {asked} of {N} episodes asked for turn 1 within {GATE_S:.0f} s") from None
        return await self.engine.agenerate(prompt, self.turn1_params or params, **kw)


def _rollout(stack, engine):
    cfg = RolloutConfig(sampling=SamplingParams(temperature=1.0, max_tokens=8), max_turns=2, seed=3, progress=False)
    return RolloutGenerator(stack.renderer, engine, cfg).run(ROWS)


def test_servers_killed_mid_rollout(vllm_stack, tiny):
    """One test, two phases on the same two-server stack (the fixture would restart a stack with a dead server)."""
    stack = vllm_stack(ARCH, 2)
    first, last = stack.servers
    assert stack.engine.client.live_urls() == (first.url, last.url)

    # 1. one of two servers killed between turns: its requests and renders fail over; every trajectory completes
    trajs = _rollout(stack, KillBeforeTurn1(stack.engine, first.kill))
    assert not first.alive()
    assert [t.stop_reason for t in trajs] == ["max_turns"] * N, [(t.stop_reason, t.error) for t in trajs]
    assert all(len(t.turns) == 2 for t in trajs)
    assert stack.engine.client.live_urls() == (last.url,)
    batch = collate(trajs, CollateSpec.from_model(tiny(ARCH).model))
    with torch.no_grad():  # the failed-over turns are right too
        assert_logprobs_agree(batch, policy_forward(tiny(ARCH).model, batch), bounds=agreement_bounds())

    # 2. the last server killed while every trajectory's turn-1 request is in flight
    long = SamplingParams(temperature=1.0, max_tokens=3000, ignore_eos=True)  # still generating when killed
    t0 = time.monotonic()
    trajs = _rollout(stack, KillBeforeTurn1(stack.engine, last.kill, delay_s=1.0, turn1_params=long))
    elapsed = time.monotonic() - t0
    assert not last.alive() and elapsed < 60
    assert len(trajs) == N and [t.stop_reason for t in trajs] == ["engine_error"] * N
    for t in trajs:  # a clear error naming the servers; turn 0 kept
        assert t.error.startswith("turn 1: VllmServerError") and "unreachable" in t.error, t.error
        assert last.url in t.error and first.url in t.error
        assert len(t.turns) == 1 and sum(t.loss_mask) > 0 and len(t.logprobs) == len(t.response_ids)
    with pytest.raises(Exception, match="unreachable"):
        stack.server_renderer.render([{"role": "user", "content": "hi"}])
