"""The maze curriculum's SFT pool (``vlrl.envs.maze_sft_pool``): filled first, it builds ``size`` batches and then
cycles over them; filled in the background, a thread keeps building real expert batches while steps train, the
pool a sliding window of the freshest, a step waiting only while the pool is empty."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from vlrl.envs.maze_curriculum import LevelPlan, level_config, sft_phase
from vlrl.envs.maze_sft_pool import SftPool

CPU = (
    "model.device=cpu",
    "sft.rows_per_step=2",
    "optim.micro_batch_size=2",
    "data.train_rows=64",
    "data.eval_rows=4",
    'data.extras={"expert_noise":0.0,"max_turns":3}',
)


@pytest.fixture
def run(tmp_path):
    from vlrl.train.run import Run

    run = Run(level_config(LevelPlan("5x5", 600, 0, overrides=CPU), tmp_path))
    yield run
    run.close()


def test_filled_first_it_builds_size_batches_then_cycles(run):
    pool = SftPool(run, 2, masked=True)
    got = [pool.batch(k, first=False) for k in range(5)]
    assert pool.built == {True: 0, False: 2} and run.state.data_position == 4  # two batches of two rows drawn
    assert got[2] is got[0] and got[3] is got[1] and got[4] is got[0] and got[0] is not got[1]
    first = pool.batch(5, first=True)
    assert pool.built[True] == 1 and first.input_ids.shape[1] < got[0].input_ids.shape[1]  # cut to one turn
    assert pool.episodes() == 6


def test_filled_in_the_background_the_pool_slides_while_steps_train(run):
    pool = SftPool(run, 2, masked=True, fill="background")
    try:
        t = time.time()
        batches = [pool.batch(0, first=False)]  # the pool is empty: the first step waits for a batch
        assert time.time() - t > 0 and pool.built[False] == 1
        while pool.built[False] < 5 and time.time() - t < 120:
            batches.append(pool.batch(len(batches), first=False))  # never waits: a kept batch is there
            time.sleep(0.05)  # "training"
        assert pool.built[False] >= 5  # the builder went on in the background
        assert len(pool.kept[False]) == 2  # a window of the freshest two
        assert len({id(b) for b in batches}) > 2  # more distinct batches than a first-filled pool of 2 ever holds
        assert all(b is not batches[0] for b in pool.kept[False])  # the oldest left the window
    finally:
        pool.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("vlrl-sft-pool")]  # the builder stopped
    drawn = run.state.data_position
    assert drawn in (2 * pool.built[False], 2 * pool.built[False] + 2)  # rows drawn by the caller, in order


def test_the_background_builder_stops_before_the_deadline(run):
    pool = SftPool(run, 4, masked=True, fill="background", deadline=time.time() + 0.5)
    try:
        pool.batch(0, first=False)
        time.sleep(1.0)
        pool.batch(1, first=False)
        assert pool._pending is None  # past the deadline no batch is started (the phase would wait on it)
    finally:
        pool.close()


def test_a_sharded_run_cannot_fill_in_the_background():
    sharded = SimpleNamespace(dist=SimpleNamespace(sharded=True))
    with pytest.raises(ValueError, match="single-process"):
        SftPool(sharded, 2, masked=True, fill="background")


def test_sft_phase_trains_from_a_background_pool(tmp_path):
    from vlrl.train.run import Run

    plan = LevelPlan("5x5", 600, 0, overrides=(*CPU, "sft.steps=4"), sft_pool=2, sft_fill="background")
    run = Run(level_config(plan, tmp_path))
    try:
        steps, episodes = sft_phase(run, time.time() + plan.sft_seconds, plan)
    finally:
        run.close()
    assert steps == 4 and episodes >= 2
    assert not [t for t in threading.enumerate() if t.name.startswith("vlrl-sft-pool")]
