"""CUDA vLLM and the trainer on one GPU: weight sync through CUDA IPC handles, no checkpoint on disk.

The trainer's tensors stay in GPU memory; ``WeightSync.push(transport="cuda_ipc")`` sends their IPC handles
through ``/collective_rpc`` and vlrl's worker extension copies from them into vLLM's weights
(``reload_weights(weights_iterator=...)``). Proven as on CPU: the logprob probe matches the trainer's model and
misses the old weights. Needs CUDA vLLM (``benchmarks/device/vllm_gpu.sh`` unpacks it):
``pytest -m gpu tests/gpu/test_vllm_gpu.py`` (passed on the GPU host at b171d07, 5178659 and f51ccdf,
``benchmarks/results/gpu_correctness_h100/``). Training syncs (``update_weights``) take the
IPC route by themselves when the server runs on the trainer's GPU (``WeightSync.last_route``).
"""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.gpu
ARCH = "qwen2_5_vl"


def test_cuda_ipc_push_serves_the_trainers_weights(vlrl_model_dir, record_property):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from vlrl.vllm.capabilities import VllmUnsupportedError, installed_capabilities, vllm_python

    try:  # from package metadata: under pytest `import vllm` finds tests/vllm/ as a namespace package
        installed_capabilities(vllm_python())
    except VllmUnsupportedError as e:
        pytest.skip(str(e))
    from vlrl.models.load import load_model
    from vlrl.vllm.server import VllmServerError
    from vlrl.vllm.stack import vllm_stack

    path = vlrl_model_dir(ARCH)
    with vllm_stack(path) as stack:  # fp32 server: the probe's 1e-4 holds against an fp32 trainer
        old = load_model(path)
        model = load_model(path).to("cuda")
        with torch.no_grad():
            for p in model.parameters():  # every tensor moves: vision tower, LM, tied embedding / head
                p.add_(0.02 * torch.randn(p.shape, device=p.device, generator=torch.Generator("cuda").manual_seed(3)))
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        stack.engine.weights.push(model.named_parameters(), transport="cuda_ipc")
        push_s = time.perf_counter() - t0
        assert stack.engine.verify_weights(model) <= 1e-4
        with pytest.raises(VllmServerError, match="does not hold"):
            stack.engine.verify_weights(old)
        record_property("push_s", push_s)

        # A training sync (update_weights) finds the server on the trainer's GPU and takes the same route by
        # itself, checksums compared around it; CPU tensors still go through a checkpoint.
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(0.9)
        stack.engine.update_weights(list(model.named_parameters()))
        assert stack.engine.weights.last_route == "cuda_ipc"
        assert stack.engine.verify_weights(model) <= 1e-4
        stack.engine.update_weights([(n, p.detach().cpu()) for n, p in old.named_parameters()])
        assert stack.engine.weights.last_route == "checkpoint"
        assert stack.engine.verify_weights(old) <= 1e-4
