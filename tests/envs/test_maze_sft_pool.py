"""The maze curriculum's SFT pool (``vlrl.envs.maze_sft_pool``): filled first, it builds ``size`` batches and then
cycles over them; filled in the background, a thread keeps building real expert batches while steps train, the
pool a sliding window of the freshest, a step waiting only while the pool is empty; filled by worker processes
(``vlrl.envs.maze_sft_farm``), the same window from several builders at once, each batch the one the run's own
renderer builds."""

from __future__ import annotations

import os
import threading
import time
from types import SimpleNamespace

import pytest
import torch
from maze_cpu import cpu_overrides  # tests/envs is on sys.path (as sample_envs)

from vlrl.envs.maze_curriculum import LevelPlan, level_config, sft_phase
from vlrl.envs.maze_sft_pool import SftPool

CPU = cpu_overrides(64)


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
        assert not pool._inflight  # past the deadline no batch is started (the phase would wait on it)
    finally:
        pool.close()


def test_a_sharded_run_cannot_fill_in_the_background():
    sharded = SimpleNamespace(dist=SimpleNamespace(sharded=True))
    with pytest.raises(ValueError, match="single-process"):
        SftPool(sharded, 2, masked=True, fill="background")


def test_with_forks_a_whole_episode_batch_draws_candidates_its_builder_picks_from(run, monkeypatch):
    import vlrl.envs.maze_sft_data as data

    asked, real = [], data.fork_rows
    monkeypatch.setattr(
        data, "fork_rows", lambda rows, n, share: asked.append((len(rows), n, share)) or real(rows, n, share)
    )
    pool = SftPool(run, 4, masked=True, forks=(0.5, 3))
    whole = pool.batch(0, first=False)
    assert asked == [(6, 2, 0.5)] and run.state.data_position == 6  # 2 rows a step, 3 candidates each
    assert whole.input_ids.shape[0] == 2  # the batch is the picked rows
    pool.batch(1, first=True)
    assert len(asked) == 1 and run.state.data_position == 8  # first turns: the rows as drawn, none picked
    plain = SftPool(run, 4, masked=True)
    plain.batch(0, first=False)
    assert len(asked) == 1 and run.state.data_position == 10


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


def test_the_plans_fork_mazes_reach_its_pool(tmp_path):
    from vlrl.train.run import Run

    plan = LevelPlan("5x5", 600, 0, overrides=(*CPU, "sft.steps=2"), sft_pool=2, fork_mazes=(0.5, 3))
    run = Run(level_config(plan, tmp_path))
    try:
        assert sft_phase(run, time.time() + plan.sft_seconds, plan) == (2, 4)
        assert run.state.data_position == 12  # two batches of two rows, from three candidates a row
    finally:
        run.close()


def test_worker_processes_keep_the_window_filled_several_at_once(run):
    pool = SftPool(run, 2, masked=True, fill="processes", builders=2)
    farm = pool._farm
    try:
        batches = [pool.batch(0, first=False)]  # waits for the workers' first batch
        assert farm is not None and farm.workers == 2 and pool.parallel == 2
        t, most = time.time(), 0
        while pool.built[False] < 6 and time.time() - t < 120:
            batches.append(pool.batch(len(batches), first=False))
            most = max(most, len(pool._inflight))
            # Never more batches started than the steps so far use, beyond one a builder.
            assert pool.built[False] + len(pool._inflight) <= len(batches) + 2
            # A "step" far faster than a batch builds (a worker renders two episodes, then pickles them back), so
            # the steps keep both builders busy; at 50 ms a step, builds that fast on a loaded machine showed one.
            time.sleep(0.001)
        assert most == 2  # both workers building at once
        assert pool.built[False] >= 6 and len(pool.kept[False]) == 2  # a sliding window over many more batches
        assert len({id(b) for b in batches}) > 2
    finally:
        pool.close()
    assert pool._farm is None and not os.path.exists(farm._spool)  # workers stopped, spool removed


def test_a_workers_batch_is_the_runs_own_token_for_token_and_pixel_for_pixel(run):
    """The workers' renderer is the engine's, built from the model's directory: same rows, same seed, same batch."""
    import dataclasses

    from vlrl.envs.maze_sft_farm import ExpertFarm

    # Detours (drawn per row seed), out of the loss: the mask setting travels to the worker too.
    rows = [dataclasses.replace(r, extras={"expert_noise": 0.5, "max_turns": 6}) for r in run.next_rows(2)]
    farm = ExpertFarm(run, 1)
    try:
        theirs = farm.load(farm.submit(rows, 3, True, "SFT batch 1"))
        picked = farm.load(farm.submit(rows, 3, True, "SFT batch 2", pick=(1, 1.0)))  # one of the two, in the worker
    finally:
        farm.close()
    mine = SftPool(run, 1, masked=True)._build(rows, 3, False)
    for field in ("input_ids", "attention_mask", "loss_mask", "pixel_values", "image_grid_thw", "turn_index"):
        assert torch.equal(getattr(mine, field), getattr(theirs, field)), field
    assert theirs.uids == mine.uids and theirs.loss_mask.sum() > 0
    first = SftPool(run, 1, masked=True)._build(rows[:1], 3, False)  # 5x5 mazes have no away fork: the first row
    assert picked.input_ids.shape[0] == 1 and torch.equal(picked.input_ids, first.input_ids)
    unmasked = SftPool(run, 1, masked=False)._build(rows, 3, False)
    assert unmasked.loss_mask.sum() > mine.loss_mask.sum()  # these rows do take detours


def test_the_default_worker_count_fits_the_cores_and_the_memory(tmp_path, monkeypatch):
    from vlrl.envs.maze_sft_farm import WORKER_MEMORY, default_workers

    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    info = tmp_path / "meminfo"
    info.write_text(f"MemTotal: 1 kB\nMemAvailable: {(5 * WORKER_MEMORY) >> 10} kB\n")
    assert default_workers(str(info)) == 5  # memory binds
    info.write_text(f"MemAvailable: {(100 * WORKER_MEMORY) >> 10} kB\n")
    assert default_workers(str(info)) == 14  # cores bind: all but two
    assert default_workers(str(tmp_path / "missing")) == 14
    info.write_text("MemAvailable: 1 kB\n")
    assert default_workers(str(info)) == 1


_KILLED_PARENT = """
import json, sys, time
from vlrl.envs.maze_curriculum import LevelPlan, level_config
from vlrl.envs.maze_sft_farm import ExpertFarm
from vlrl.train.run import Run

run = Run(level_config(LevelPlan("5x5", 600, 0, overrides=tuple(sys.argv[2:])), sys.argv[1]))
farm = ExpertFarm(run, 2)
futures = [farm.submit(run.next_rows(2), seed, True, "SFT batch") for seed in (1, 2)]
[farm.load(f) for f in futures]
print(json.dumps({"workers": list(farm._pool._processes), "spool": farm._spool}), flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\tZ" not in next(line for line in f if line.startswith("State:"))  # a zombie has exited
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")
def test_workers_exit_with_a_parent_killed_outright(tmp_path):
    """SIGKILL (the out-of-memory killer, a command's hard limit) gives the parent no cleanup: its workers must
    notice on their own, exit, and take the spool with them."""
    import json
    import signal
    import subprocess
    import sys

    parent = subprocess.Popen(
        [sys.executable, "-c", _KILLED_PARENT, str(tmp_path), *CPU], stdout=subprocess.PIPE, text=True
    )
    try:
        started = json.loads(parent.stdout.readline())
        workers = started["workers"]
        assert len(workers) == 2 and all(_alive(pid) for pid in workers)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    try:
        deadline = time.time() + 30
        while time.time() < deadline and any(_alive(pid) for pid in workers):
            time.sleep(0.2)
        assert not any(_alive(pid) for pid in workers), "a worker outlived its killed parent"
        assert not os.path.exists(started["spool"])
    finally:
        for pid in filter(_alive, workers):  # a failed run leaves no orphans behind
            os.kill(pid, signal.SIGKILL)


def test_every_nth_step_trains_on_takeover_episodes_after_a_weight_sync(run, monkeypatch):
    """``takeover=(2, 2)``: steps 1 and 3 get fresh takeover batches (never kept), each built after the engine
    got the weights; steps 0 and 2 build the pool's expert batches; every batch draws its own rows."""
    synced, real = [], run.sync_weights
    monkeypatch.setattr(run, "sync_weights", lambda: synced.append(run.state.data_position) or real())
    pool = SftPool(run, 2, masked=True, takeover=(2, 2))
    got = [pool.batch(k, first=False) for k in range(4)]
    assert pool.takeovers == 2 and synced == [2, 6]  # before the rows of steps 1 and 3 were drawn
    assert pool.built[False] == 2 and pool.kept[False] == [got[0], got[2]]
    assert run.state.data_position == 8 and len({id(b) for b in got}) == 4
    assert pool.batch(4, first=True) is not None and pool.takeovers == 2  # first-turn steps: never takeover


def test_filled_by_processes_a_worker_renders_the_takeover_batch_a_later_step_trains_on(run, monkeypatch):
    """``takeover=(2, 2)`` with a worker: step 1 syncs the weights and plays the policy's turns here, a worker
    renders the episodes, and the first step after they are done trains on them (never kept). The batch is the
    in-process build of the same rows and seed, token for token (the weights unchanged)."""
    from vlrl.envs.maze_sft_data import takeover_episodes, takeover_turns
    from vlrl.envs.maze_sft_pool import TAKEOVER_SEED

    synced, real = [], run.sync_weights
    monkeypatch.setattr(run, "sync_weights", lambda: synced.append(run.state.data_position) or real())
    pool = SftPool(run, 2, masked=True, fill="processes", builders=1, takeover=(2, 2))
    try:
        got = [pool.batch(0, first=False), pool.batch(1, first=False)]
        assert synced == [2] and pool.takeovers == 0  # step 1 trained on a pool batch: the worker had just begun
        t = time.time()
        while not pool.takeovers and time.time() - t < 120:
            got.append(pool.batch(len(got), first=False))
            time.sleep(0.3)
        assert pool.takeovers == 1 and pool.takeover_s > 0
        theirs = got[-1]
        assert all(theirs is not b for b in pool.kept[False])
    finally:
        pool.close()
    rows = run.train_rows[synced[0] : synced[0] + 2]
    assert any(takeover_turns(r.seed, 2) for r in rows)  # the policy plays turns here
    mine = run.collate(takeover_episodes(run, rows, TAKEOVER_SEED + 1, turns=2))
    for field in ("input_ids", "attention_mask", "loss_mask", "pixel_values", "turn_index"):
        assert torch.equal(getattr(mine, field), getattr(theirs, field)), field


def test_a_worker_lets_go_of_each_batch_it_built(run, tmp_path, monkeypatch):
    """A worker keeps building for a whole level (~1,000 s in a lease-long run): after each batch it drops the
    renderer's caches and the decoded images (the next mazes are new), and trims the C heap once its resident set is
    TRIM_ABOVE past where its first batch left it (benchmarks/farm_worker_memory.py: with the decoded images kept, a
    worker's memory grew batch after batch)."""
    import dataclasses

    from vlrl import messages
    from vlrl.envs import maze_sft_farm as farm
    from vlrl.render.embedded import EmbeddedRenderer

    farm._malloc_trim()  # the real one: glibc's here, and harmless
    renderer = EmbeddedRenderer.from_pretrained(run.model_dir)
    monkeypatch.setitem(farm._WORKER, "renderer", renderer)  # what the worker's start sets
    monkeypatch.setitem(farm._WORKER, "spec", run.spec)
    monkeypatch.delitem(farm._WORKER, "rss_floor", raising=False)
    trims, decoded = [], []
    monkeypatch.setattr(farm, "_malloc_trim", lambda: trims.append(len(messages._DECODED)))
    forget = messages.forget_decoded
    monkeypatch.setattr(messages, "forget_decoded", lambda: (decoded.append(len(messages._DECODED)), forget()))
    config = dataclasses.replace(run.rollout_config(0, repeats=1), max_context=run.engine.max_context, progress=False)

    def build(seed):
        path = farm._build(run.next_rows(2), config, seed, True, "SFT batch", str(tmp_path / f"{seed}.pt"), None)
        assert farm.load_spool(path).loss_mask.sum() > 0

    build(3)
    assert decoded[0] > 0 and len(messages._DECODED) == 0  # the batch's images were there, then gone
    assert len(renderer._cache) == 0 and trims == [] and farm._WORKER["rss_floor"] > 0  # its first batch: the floor
    # as if the worker had grown past the margin: any resident set is above a floor of 0 (a floor kept from the first
    # batch with a margin of -1 failed once in CI, the second batch's resident set having come out below the first's)
    monkeypatch.setitem(farm._WORKER, "rss_floor", 0)
    monkeypatch.setattr(farm, "TRIM_ABOVE", 0)
    build(4)
    assert decoded[1] > 0 and trims == [0]  # trimmed, after the images went
