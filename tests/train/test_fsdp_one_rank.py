"""On one rank the FSDP2 step is the plain trainer's step, bit for bit (bf16, several micro-batches a step).

One rank reduces nothing, so FSDP2 sums the micro-batches' gradients in the compute dtype there, as the plain
trainer's autograd does in its bf16 parameters' gradients (``vlrl.train.fsdp``, "Precision"); summing them in fp32
instead cost FSDP2 a cast and an add per parameter per micro-batch (benchmarks/results/fsdp_cpu_tiny) and gave other
numbers. Gradient clipping is off here: the plain trainer scales bf16 gradients, FSDP2 its fp32 shards of the same
values, and the two roundings of the scaled values differ (tests/train/test_fsdp.py bounds that case).
"""

from __future__ import annotations

import pytest
import torch
from fsdp_helpers import checkpoint_weights, max_abs_diff, phase, run_plain, run_torchrun

from vlrl.train.config import LORA_TARGETS

pytestmark = pytest.mark.train

BF16_MICRO = (
    "model.dtype=bfloat16",
    "optim.micro_batch_size=1",  # SFT 4 micro-batches a step, RL 9
    "sft.steps=2",
    "optim.grad_clip=0",
    "run.steps=1",
    "run.samples=0",
)


@pytest.fixture
def one_thread():
    """The plain run in this process on one torch thread, as torchrun's rank (OMP_NUM_THREADS=1): CPU kernels
    split their sums by thread count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_one_rank_fsdp_takes_the_plain_steps_bit_for_bit(tmp_path, one_thread):
    plain = run_plain(tmp_path / "plain", *BF16_MICRO)
    fsdp = run_torchrun(1, tmp_path / "fsdp", *BF16_MICRO)
    keys = ("loss", "grad_norm", "grad_norm/language", "grad_norm/vision")
    for name in ("sft", "rl"):
        a, b = phase(plain, name), phase(fsdp, name)
        assert a and [[m[k] for k in keys] for m in a] == [[m[k] for k in keys] for m in b], name
    # the plain checkpoint holds the bf16 weights, FSDP2's its fp32 masters: the same once rounded to bf16
    a, b = (checkpoint_weights(run / "checkpoints" / "step_000001") for run in (plain, fsdp))
    diff, where = max_abs_diff({n: t.bfloat16() for n, t in a.items()}, {n: t.bfloat16() for n, t in b.items()})
    assert diff == 0.0, f"{where} differs by {diff:.2e} after SFT and an RL step"


def test_lora_adapters_keep_their_fp32_values_when_sft_ends(tmp_path):
    """The masters rounded when SFT ends are the ones a plain run drops. A plain bf16 LoRA run keeps its adapters as
    fp32 parameters (peft), so FSDP2 must not round them to bf16 then."""
    lora = ("model.dtype=bfloat16", "model.lora.rank=4", "model.lora.alpha=16", "run.steps=1", "run.samples=0")
    fsdp = run_torchrun(1, tmp_path / "fsdp", *lora)
    spec = {"rank": 4, "alpha": 16, "targets": LORA_TARGETS}
    after_sft = checkpoint_weights(fsdp / "checkpoints" / "step_000000", spec)
    adapters = {n: t for n, t in after_sft.items() if ".lora_" in n}
    assert adapters and any(bool((t != t.bfloat16().float()).any()) for t in adapters.values())
