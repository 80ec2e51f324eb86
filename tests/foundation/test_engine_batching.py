"""How the embedded engine forms batches: one generate call is one batch; cancelled requests are dropped
before they reach a batch, so a crashed caller (a rollout whose coroutines were cancelled) never
poisons the requests of the next one."""

from __future__ import annotations

import threading
import time

import pytest

from vlrl.engines.types import Generation, SamplingParams

PARAMS = SamplingParams(temperature=1.0, max_tokens=3, seed=0, ignore_eos=True)


@pytest.fixture
def engine(tiny):
    from vlrl.engines.embedded import EmbeddedEngine

    b = tiny("qwen2_5_vl")
    eng = EmbeddedEngine(b.engine.model, b.tokenizer)  # its own queue and worker
    batches: list[int] = []
    decode = eng._decode
    eng._decode = lambda reqs: (batches.append(len(reqs)), decode(reqs))[1]
    eng.batches = batches
    yield eng, b.renderer
    eng.close()


def _prompts(renderer, n):
    return [renderer.render([{"role": "user", "content": "word " * (3 + 5 * i)}]) for i in range(n)]


def test_one_generate_call_is_one_batch(engine):
    eng, renderer = engine
    out = eng.generate(_prompts(renderer, 5), PARAMS)
    assert eng.batches == [5] and all(isinstance(g, Generation) for g in out)
    eng.max_batch = 2
    eng.generate(_prompts(renderer, 5), PARAMS)
    assert eng.batches[1:] == [2, 2, 1]


def test_cancelled_request_is_dropped_and_the_rest_of_its_batch_survives(engine):
    eng, renderer = engine
    a, b, c = _prompts(renderer, 3)
    eng._lock.acquire()  # the worker takes A into a batch and waits for the lock
    try:
        fa = eng.submit(a, PARAMS)
        for _ in range(200):
            if eng._queue.empty():
                break
            time.sleep(0.01)
        fb, fc = eng.submit(b, PARAMS), eng.submit(c, PARAMS)
        assert fb.cancel()  # still queued: cancellable
    finally:
        eng._lock.release()
    assert isinstance(fa.result(timeout=60), Generation)
    assert isinstance(fc.result(timeout=60), Generation)  # B's cancellation did not reach C
    assert fb.cancelled()
    assert sum(eng.batches) == 2, eng.batches  # B was never decoded


@pytest.mark.parametrize("gather_s, want", [(0.05, [4]), (0.0, [1, 3])])
def test_requests_queued_a_few_ms_apart_share_a_batch(engine, gather_s, want):
    """Concurrent episodes queue their turns a few ms apart (each renders first): a batch that is not full waits
    ``gather_s`` after each arrival, so they decode together; without the wait the first went alone."""
    eng, renderer = engine
    eng.gather_s = gather_s
    prompts = _prompts(renderer, 4)
    eng._lock.acquire()  # with no wait, the first request's batch forms alone and waits for the lock
    try:
        futures = [eng.submit(prompts[0], PARAMS)]
        for p in prompts[1:]:
            time.sleep(0.01)
            futures.append(eng.submit(p, PARAMS))
        time.sleep(0.1)  # all queued (or taken) before the worker may decode
    finally:
        eng._lock.release()
    assert all(isinstance(f.result(timeout=60), Generation) for f in futures)
    assert eng.batches == want


def test_a_generate_calls_batch_starts_without_waiting(engine):
    """A generate call is a whole batch as its caller meant it: it does not wait for requests queued after it."""
    eng, renderer = engine
    eng.gather_s = eng.gather_cap_s = 1.0
    a, b, c = _prompts(renderer, 3)
    eng._lock.acquire()  # the generate call's batch forms and waits for the lock
    try:
        done: list = []
        call = threading.Thread(target=lambda: done.append(eng.generate([a, b], PARAMS)))
        call.start()
        for _ in range(200):
            if eng._queue.empty():
                break
            time.sleep(0.01)
        time.sleep(0.1)
        late = eng.submit(c, PARAMS)
    finally:
        eng._lock.release()
    call.join(timeout=60)
    assert isinstance(late.result(timeout=60), Generation) and len(done[0]) == 2
    assert eng.batches == [2, 1]


def test_close_finishes_what_is_queued_then_frees_the_engine(tiny):
    """The worker thread holds its engine (the model copy a Run gives it, a prefix cache of up to 1 GiB, CUDA graphs)
    for as long as it runs: before close() existed every Run's engine outlived the run, and a process of several
    runs (the maze curriculum's levels, a test session) kept them all."""
    import gc
    import weakref

    from vlrl.engines.embedded import EmbeddedEngine

    b = tiny("qwen2_5_vl")
    eng = EmbeddedEngine(b.engine.model, b.tokenizer)
    prompts = _prompts(b.renderer, 3)
    futures = [eng.submit(p, PARAMS) for p in prompts]
    eng.close()
    assert all(f.done() and len(f.result().token_ids) == 3 for f in futures)  # queued work ends before the stop
    assert len(eng.generate(prompts[:1], PARAMS)[0].token_ids) == 3  # a later request starts a new worker
    eng.close()
    ref = weakref.ref(eng)
    del eng
    gc.collect()
    assert ref() is None
