"""A context too small for the first observation is refused up front, with the numbers — never a run
that exits 0 having generated and trained nothing; and a step with nothing to train on is an error."""

from __future__ import annotations

import json
import os

import pytest
from reliability_helpers import faulty_row

from vlrl.cli import main
from vlrl.engines.types import SamplingParams
from vlrl.errors import ContextOverflowError
from vlrl.rollout.generator import RolloutConfig, RolloutGenerator
from vlrl.train.config import load_config
from vlrl.train.loop import NothingToTrainError, train

SMALL = (
    "sft.steps=1",
    "sft.rows_per_step=2",
    "rollout.rows_per_step=2",
    "rollout.repeats=2",
    "data.eval_rows=2",
    "data.train_rows=4",
    "run.steps=1",
    "run.eval_every=0",
    "run.samples=0",
    "run.progress=False",
)


@pytest.mark.parametrize("mode", ["multi_turn", "step"])
def test_rollout_refuses_a_first_observation_with_no_room(tiny, faulty_env, mode):
    bundle = tiny("qwen2_vl")
    first = bundle.renderer.render(bundle_messages(faulty_env))
    cfg = RolloutConfig(sampling=SamplingParams(max_tokens=4), max_context=len(first), mode=mode, progress=False)
    with pytest.raises(ContextOverflowError) as err:
        RolloutGenerator(bundle.renderer, bundle.engine, cfg).run([faulty_row(0), faulty_row(1)])
    assert f"renders to {len(first)} tokens" in str(err.value) and f"context of {len(first)} tokens" in str(err.value)
    fits = RolloutConfig(sampling=SamplingParams(max_tokens=4), max_context=len(first) + 1, mode=mode, progress=False)
    (traj,) = RolloutGenerator(bundle.renderer, bundle.engine, fits).run([faulty_row(0)])
    assert len(traj.turns) == 1 and traj.stop_reason == "length"  # one token of room: one token generated


def bundle_messages(env_class: str) -> list[dict]:
    from vlrl.envs import make_env

    return make_env(env_class, {}, 0).init(None)[0]


def test_train_with_a_too_small_context_fails_with_the_numbers(tmp_path, vlrl_model_dir, capsys):
    small = tmp_path / "small_context_model"
    small.mkdir()
    source = vlrl_model_dir("qwen2_5_vl")
    for f in source.iterdir():
        os.symlink(f, small / f.name)
    config = json.loads((source / "config.json").read_text())
    config["text_config"]["max_position_embeddings"] = 40
    (small / "config.json").unlink()
    (small / "config.json").write_text(json.dumps(config))
    rc = main(["train", "color_square", *SMALL, f"model.path={small}", f"run.out={tmp_path / 'run'}"])
    err = [line for line in capsys.readouterr().err.splitlines() if line and not line.startswith("Loading weights")]
    assert rc == 1 and len(err) == 1 and "leaves no room to generate in a context of 40 tokens" in err[0], err
    metrics = tmp_path / "run" / "metrics.jsonl"
    assert not metrics.exists() or metrics.read_text() == ""


def test_a_step_with_nothing_to_train_on_is_an_error(tmp_path, faulty_env):
    cfg = load_config(
        "color_square",
        [*SMALL, "sft.steps=0", f"data.env={faulty_env}", "data.extras={'init_raises': True}", f"run.out={tmp_path}"],
    )
    with pytest.raises(NothingToTrainError, match=r"RL step 1: none of the 4 episodes .*env_error.*faulty env init"):
        train(cfg)
