"""FSDP2 through torchrun on CPU (gloo, 2 processes): the distributed step is the one-process step, and
distributed checkpoints resume exactly on another number of processes.

Within 1e-5: the two runs sum the same gradients in another order (shards reduce-scattered, micro-batches per
rank), and Adam's first steps divide each coordinate by its own gradient's size, so a coordinate whose
gradient is near Adam's eps turns a 1e-7 relative rounding difference into up to ~lr x 1e-3 (measured: 2.6e-6
at sft.lr 1e-3, 7.8e-6 at 3e-3).
"""

from __future__ import annotations

import pytest
from fsdp_helpers import checkpoint_weights, max_abs_diff, phase, run_plain, run_torchrun

from vlrl.checks.training import RunRecord, agreement_held
from vlrl.models.build import cached_model_dir
from vlrl.models.load import load_model
from vlrl.train.config import LORA_TARGETS

pytestmark = pytest.mark.train

TOL = 1e-5


@pytest.fixture(scope="module")
def one(tmp_path_factory):
    """The plain one-process run (pytest's own process)."""
    return run_plain(tmp_path_factory.mktemp("fsdp") / "one")


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """The same run on two torchrun processes (FSDP2, gloo)."""
    return run_torchrun(2, tmp_path_factory.mktemp("fsdp") / "two")


def assert_same_steps(a: list[dict], b: list[dict], keys=("loss", "grad_norm")) -> None:
    assert [m["step"] for m in a] == [m["step"] for m in b]
    for x, y in zip(a, b):
        for key in keys:
            assert abs(x[key] - y[key]) <= TOL * max(1.0, abs(x[key])), (x["phase"], x["step"], key, x[key], y[key])


def test_two_processes_take_the_one_process_steps(one, two):
    assert_same_steps(phase(one, "sft"), phase(two, "sft"))
    per_module = ("grad_norm/language", "grad_norm/vision")  # every rank's shards: clip_gradients sums their squares
    assert_same_steps(
        phase(one, "rl"), phase(two, "rl"), keys=("loss", "grad_norm", *per_module, "entropy", "reward_mean")
    )
    assert all(m["grad_norm"] > 0 for m in phase(one, "rl")), "the RL steps must train, or equality proves nothing"
    initial = {n: p.detach() for n, p in load_model(cached_model_dir("qwen2_5_vl", "tiny")).named_parameters()}
    for step in ("step_000000", "step_000001", "step_000002"):  # after SFT, after each RL step
        a = checkpoint_weights(one / "checkpoints" / step)
        b = checkpoint_weights(two / "checkpoints" / step)
        diff, name = max_abs_diff(a, b)
        assert diff <= TOL, f"{step}: {name} differs by {diff:.2e}"
    unmoved = [n for n in a if bool((a[n] == initial[n]).all())]
    assert not unmoved, f"parameters that never moved cannot show equal updates: {unmoved}"
    agreement_held(RunRecord.load(two), steps=2)  # the gathered logprobs agreed with rank 0's rollout
    # the distributed checkpoints are DCP, a shard file written by each rank
    assert len(list((two / "checkpoints" / "step_000002" / "dcp" / "model").glob("*.distcp"))) == 2


def test_a_two_process_checkpoint_resumes_in_one_process(two, tmp_path):
    resumed = run_plain(tmp_path / "resumed", f"run.resume={two / 'checkpoints' / 'step_000001'}")
    assert_same_steps(phase(two, "rl")[1:], phase(resumed, "rl"), keys=("loss", "grad_norm", "entropy"))
    diff, name = max_abs_diff(
        checkpoint_weights(two / "checkpoints" / "step_000002"),
        checkpoint_weights(resumed / "checkpoints" / "step_000002"),
    )
    assert diff <= TOL, f"{name} differs by {diff:.2e}"


def test_a_one_process_checkpoint_resumes_in_two_processes(one, tmp_path):
    resumed = run_torchrun(2, tmp_path / "resumed", f"run.resume={one / 'checkpoints' / 'step_000001'}")
    assert_same_steps(phase(one, "rl")[1:], phase(resumed, "rl"), keys=("loss", "grad_norm", "entropy"))
    diff, name = max_abs_diff(
        checkpoint_weights(one / "checkpoints" / "step_000002"),
        checkpoint_weights(resumed / "checkpoints" / "step_000002"),
    )
    assert diff <= TOL, f"{name} differs by {diff:.2e}"


def test_lora_and_fsdp_compose(tmp_path):
    """LoRA adapters on a sharded policy: the same steps as one process, and only the adapters in the DCP files."""
    lora = ("model.lora.rank=4", "model.lora.alpha=16", "run.steps=1", "sft.lr=3e-3")
    one = run_plain(tmp_path / "one", *lora)
    two = run_torchrun(2, tmp_path / "two", *lora)
    assert_same_steps(phase(one, "sft"), phase(two, "sft"))
    assert_same_steps(phase(one, "rl"), phase(two, "rl"), keys=("loss", "grad_norm", "entropy"))
    agreement_held(RunRecord.load(two), steps=1)  # the engine on rank 0 got the merged, gathered weights
    spec = {"rank": 4, "alpha": 16, "targets": LORA_TARGETS}
    a = checkpoint_weights(one / "checkpoints" / "step_000001", spec)
    b = checkpoint_weights(two / "checkpoints" / "step_000001", spec)
    diff, name = max_abs_diff(a, b)
    assert diff <= TOL, f"{name} differs by {diff:.2e}"
    from torch.distributed.checkpoint import FileSystemReader

    saved = FileSystemReader(str(two / "checkpoints" / "step_000001" / "dcp" / "model")).read_metadata()
    assert saved.state_dict_metadata and all(".lora_" in key for key in saved.state_dict_metadata)


def test_bf16_fsdp_starts_from_the_plain_runs_masters(tmp_path):
    """bf16 with fp32 masters from the fp32 tiny checkpoint: FSDP's sharded fp32 parameters must start where the
    plain trainer's masters do (the bf16-rounded weights), or the runs round to different weights from the first
    update on (vlrl.train.master.round_masters_; without it the second SFT loss differed by 1.2e-3 here and the
    2b policies by 0.18 nats per token on the H100)."""
    bf16 = ("model.dtype=bfloat16", "sft.steps=2", "run.steps=1", "run.samples=0")
    plain = run_plain(tmp_path / "plain", *bf16)
    fsdp = run_torchrun(1, tmp_path / "fsdp", *bf16)
    # 8e-5 apart with the fix (plain clips bf16 gradients, FSDP fp32 ones), 1.2e-3 without it
    assert [m["loss"] for m in phase(plain, "sft")] == pytest.approx(
        [m["loss"] for m in phase(fsdp, "sft")], rel=0, abs=5e-4
    )
    # One rank's engine weights are its shards cast to bf16 (no all-gather, vlrl.train.fsdp.full_weights):
    # the engine's rollouts after SFT must be what the trainer then scores.
    agreement_held(RunRecord.load(fsdp), steps=1)
