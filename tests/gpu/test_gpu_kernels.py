"""The CUDA attention-kernel bug behind the maze2d GPU disagreement, and the checks that catch it.

On an H100 (torch 2.11, fp32) SDPA's memory-efficient kernel, given k/v that are a stride-0 view on the
head axis (what transformers' ``repeat_kv`` returns for one kv head) and an explicit mask, returned a
wrong last query row at key lengths ≡ 1 mod 64 (see ``vlrl.models.attention``). These tests show the
bug where the kernel still has it, that the batch-invariance check fails on the engine that reached it
(transformers' ``sdpa`` attention, the engine as of 5bd18d2) and passes with ``vlrl_sdpa``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "checks"))
from invariance_cases import prompt_of_length, stack

from vlrl.checks.batch_invariance import check_batch_invariance

pytestmark = pytest.mark.gpu


def kernel_error(length: int, contiguous: bool) -> float:
    """Largest |Δ| of SDPA's output vs the math backend, fp32, B=8, 2 heads over one kv head, a padding mask."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(8, 2, length, 32, device="cuda", generator=g)
    kv = torch.randn(2, 8, 1, length, 32, device="cuda", generator=g)
    k, v = (t.expand(8, 2, length, 32) for t in kv)  # stride 0 on the head axis, as repeat_kv returns
    if contiguous:
        k, v = k.contiguous(), v.contiguous()
    mask = torch.ones(8, 1, length, length, dtype=torch.bool, device="cuda").tril()
    mask[:, :, :, :7] = False  # left padding of 7 on every row
    mask[:, :, :7, 0] = True  # (padding rows attend somewhere, as transformers' masks make them)
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        fast = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    with sdpa_kernel(SDPBackend.MATH):
        ref = torch.nn.functional.scaled_dot_product_attention(q, k.contiguous(), v.contiguous(), attn_mask=mask)
    return float((fast - ref)[:, :, 7:].abs().max())


def test_contiguous_kv_is_right_at_every_length():
    for n in (33, 1025, 1408, 1409, 1410, 1857, 2049):
        assert kernel_error(n, contiguous=True) < 1e-4, n


def test_batch_invariance_check_catches_the_kernel_bug_and_vlrl_sdpa_fixes_it():
    stride0 = {n: kernel_error(n, contiguous=False) for n in (1025, 1409, 1857)}
    renderer, plain = stack("tiny", "float32", "cuda", attention="sdpa")
    prompts = [prompt_of_length(renderer, n, k, seed=i) for i, (n, k) in enumerate([(1409, 2), (900, 1), (300, 0)])]
    before = check_batch_invariance(plain, prompts, dtype="float32")
    after = check_batch_invariance(stack("tiny", "float32", "cuda")[1], prompts, dtype="float32")
    print(f"stride-0 kernel error by length: {stride0}\nsdpa: {before.summary()}\nvlrl_sdpa: {after.summary()}")
    after.raise_if_failed()
    if max(stride0.values()) < 1e-4:
        pytest.skip(f"this GPU's SDPA kernel no longer has the stride-0 bug ({stride0}); vlrl_sdpa passed")
    assert not before.passed, f"the check missed the kernel bug: {before.summary()}"


def test_bf16_head_gives_the_upcast_logits_and_gradients_on_cuda():
    """The LM head of a bf16 model on CUDA (``vlrl.engines.sampling.fp32_head``: one tensor-core GEMM with fp32
    output) against the upcast fp32 product, at the 2b model's head shape: the same logits up to fp32 sums,
    gradients within one bf16 rounding of the upstream-rounded exact ones."""
    import torch

    from vlrl.engines.sampling import fp32_head

    torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator(device="cuda").manual_seed(0)
    head = torch.nn.Linear(1536, 151_936, bias=False, device="cuda", dtype=torch.bfloat16)
    torch.nn.init.normal_(head.weight, std=0.02, generator=g)
    x = (torch.randn(300, 1536, device="cuda", generator=g) * 2).bfloat16().requires_grad_()
    logits = fp32_head(head)(x)
    assert logits.dtype == torch.float32 and "Fp32OutLinear" in logits.grad_fn.name()
    ref = x.detach().double() @ head.weight.detach().double().T
    err = (logits.double() - ref).abs().max().item()
    upcast = (torch.nn.functional.linear(x.detach().float(), head.weight.detach().float()).double() - ref).abs().max()
    top = ref.abs().max().item()
    print(f"max |logit - fp64|: tensor cores {err:.2e}, fp32 CUDA cores {upcast.item():.2e} (|logit| <= {top:.2f})")
    assert err <= 1e-5 * top
    upstream = torch.randn(logits.shape, device="cuda", generator=g) * 1e-3
    (logits * upstream).sum().backward()
    g64 = upstream.bfloat16().double()
    w64, x64 = head.weight.detach().double(), x.detach().double()
    exact = {"x": (g64 @ w64, g64.abs() @ w64.abs()), "w": (g64.T @ x64, g64.T.abs() @ x64.abs())}
    for name, got in (("x", x.grad), ("w", head.weight.grad)):
        assert got is not None and got.dtype == torch.bfloat16
        want, size = exact[name]  # one bf16 rounding of each result, plus fp32's error on the sum of |terms|
        assert ((got.double() - want).abs() <= 2**-8 * want.abs() + 2**-20 * size).all(), name


def _syncs(fn) -> int:
    """How many synchronizing CUDA operations ``fn()`` ran (torch's sync debug mode, one warning each)."""
    import warnings

    import torch

    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchronizing" in str(w.message) for w in caught)


def test_positions_make_no_host_sync_per_image(vlrl_model_dir):
    """mRoPE positions of a CUDA batch (``vlrl.models.positions.mrope_positions``) cost a fixed number of host
    syncs (its CPU copies), however many images the rows hold — the model's own ``get_rope_index`` on CUDA tensors
    reads each image's grid one value at a time. The ids equal the CPU computation's."""
    import numpy as np
    import torch
    from PIL import Image

    from vlrl.models.load import load_model, load_processor
    from vlrl.models.positions import mrope_positions

    model_dir = vlrl_model_dir("qwen2_5_vl")
    model, processor = load_model(model_dir, device="cuda"), load_processor(model_dir)
    rng = np.random.default_rng(0)
    counts = {}
    for n in (2, 8):
        images = [Image.fromarray(rng.integers(0, 256, (56, 56, 3), dtype=np.uint8)) for _ in range(n)]
        text = "".join("<|vision_start|><|image_pad|><|vision_end|> move" for _ in images)
        inputs = processor(text=[text, text], images=images + images, return_tensors="pt")
        ids, attn, grid = (inputs[k].cuda() for k in ("input_ids", "attention_mask", "image_grid_thw"))
        on_cuda = mrope_positions(model, ids, attn, grid)  # first call's one-off costs out of the count
        counts[n] = _syncs(lambda ids=ids, attn=attn, grid=grid: mrope_positions(model, ids, attn, grid))
        assert on_cuda.is_cuda and torch.equal(on_cuda.cpu(), mrope_positions(model, ids.cpu(), attn.cpu(), grid.cpu()))
    print(f"host syncs of mrope_positions by images per row: {counts}")
    assert counts[8] <= counts[2] <= 6, counts  # 8 images a row sync no more than 2 (before: about 5 per image)


def test_fused_kernels_compile_and_agree_with_transformers_in_bf16(vlrl_model_dir):
    """``vlrl.models.fused`` on CUDA: RMSNorm, SwiGLU and both rotaries compile (no graph break: fullgraph), and a
    bf16 model's logprobs and gradients with them agree with transformers' eager kernels within bf16 noise (the
    agreement bound's mean and max: the fused kernels round bf16 intermediates once, eager rounds each op)."""
    import numpy as np
    import torch
    from PIL import Image

    from vlrl.checks.bounds import bounds_for
    from vlrl.models import fused
    from vlrl.models.load import load_model, load_processor

    model_dir = vlrl_model_dir("qwen2_5_vl")
    model = load_model(model_dir, dtype=torch.bfloat16, device="cuda", kernels="fused")
    processor = load_processor(model_dir)
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (112, 140, 3), dtype=np.uint8)) for _ in range(2)]
    text = "".join(f"<|vision_start|><|image_pad|><|vision_end|> step {i}: move left" for i in range(2))
    inputs = processor(text=[text], images=images, return_tensors="pt").to("cuda")
    pixels = inputs["pixel_values"].to(torch.bfloat16)

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        model.zero_grad()
        logits = model(
            input_ids=inputs["input_ids"], pixel_values=pixels, image_grid_thw=inputs["image_grid_thw"]
        ).logits
        lp = torch.log_softmax(logits.float(), -1)[0, :-1].gather(1, inputs["input_ids"][0, 1:, None])[:, 0]
        lp.sum().backward()
        grads = torch.stack([p.grad.float().norm() for p in model.parameters() if p.grad is not None])
        return lp.detach(), grads

    fused_lp, fused_grads = run()
    assert fused.compiled.cache_info().currsize == 4  # rms_norm, silu_mul, rotary, rotary_vision
    fused.uninstall(model)
    try:
        eager_lp, eager_grads = run()
    finally:
        fused.install(model)
    bound = bounds_for(torch.bfloat16).agreement
    diff = (fused_lp - eager_lp).abs()
    rel = ((fused_grads - eager_grads).abs() / eager_grads.clamp_min(1e-12)).max().item()
    print(f"fused vs eager bf16: logprob max |Δ| {diff.max():.3g}, mean {diff.mean():.3g}; grad-norm max rel {rel:.3g}")
    assert diff.mean() <= bound.mean_abs and diff.max() <= bound.max_abs
    assert rel <= 0.05
