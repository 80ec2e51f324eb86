"""vlrl's vLLM worker extension (``--worker-extension-cls vlrl.vllm.worker.VlrlWorkerExtension``).

Loaded *inside the server process* by vLLM (``vlrl`` must be importable there: the same venv).
Its methods are called through ``POST /collective_rpc`` (``VLLM_SERVER_DEV_MODE=1``, behind the run's
API key: ``vlrl.vllm.auth``).

**Why it exists: the tied LM head.** On CPU, vLLM does not multiply by ``lm_head.weight`` at run
time: after loading, ``UnquantizedEmbeddingMethod.process_weights_after_loading`` calls
``dispatch_cpu_unquantized_gemm``, which packs the weight into a oneDNN matmul handle (a copy, in
oneDNN's blocked layout) stored in the layer's ``cpu_linear`` closure. With
``tie_word_embeddings`` the LM head shares the embedding's ``Parameter`` but is its own module,
and the checkpoint has no ``lm_head.weight`` (vLLM's loader skips it). The in-place reload
(``reload_weights``, layerwise) re-processes only layers that received weights: the embedding
gets new values *and* a new handle, the LM head gets its tensor back (shared storage, new values)
but keeps the handle packed from the *old* weights — logits stay on the old head (measured: probe
logprobs off by ~0.9 after an embedding update). :meth:`vlrl_reload_weights` reloads, then
re-runs the post-load processing of every embedding-method layer (which only re-packs from the
current weight), and checks every such layer's packed matmul against its weight.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

HEAD_CHECK_TOL = 1e-4


def refresh_packed_embeddings(model) -> list[str]:
    """Re-pack every layer whose matmul goes through an ``UnquantizedEmbeddingMethod`` (embeddings, LM heads)."""
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    done = []
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if isinstance(method, UnquantizedEmbeddingMethod) and getattr(module, "weight", None) is not None:
            method.process_weights_after_loading(module)
            done.append(name)
    return done


def packed_head_error(model) -> dict[str, float]:
    """Per embedding-method layer: max |packed matmul - x @ weight.T| on a fixed random batch."""
    import torch
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    out = {}
    gen = torch.Generator().manual_seed(0)
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        w = getattr(module, "weight", None)
        if not isinstance(method, UnquantizedEmbeddingMethod) or not hasattr(module, "cpu_linear"):
            continue  # not a packed matmul
        if w is None or w.ndim != 2:
            continue
        with torch.no_grad():
            x = torch.randn(4, w.shape[1], generator=gen).to(w.dtype)
            got = method.apply(module, x)
            want = torch.nn.functional.linear(x, w)
            out[name] = float((got.float() - want.float()).abs().max())
    return out


def tensor_digest(t) -> str:
    """An exact fingerprint of a tensor's bytes, computed where the tensor lives (no copy to the host):
    its element count, dtype, and two wrapping int64 sums of its bytes read as int32 words — plain and
    position-weighted, so a change of any value, or a swap of two, moves it. For "did this parameter change",
    not for security."""
    import torch

    flat = t.detach().contiguous().view(-1).view(torch.uint8)
    pad = (-flat.numel()) % 4
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    words = flat.view(torch.int32).to(torch.int64)
    weights = torch.arange(1, words.numel() + 1, device=words.device, dtype=torch.int64) * 2654435761
    return f"{t.numel()}:{t.dtype}:{int(words.sum())}:{int((words * weights).sum())}"


class VlrlWorkerExtension:
    """Mixed into vLLM's worker class; methods reachable as ``collective_rpc`` ``method`` names."""

    if TYPE_CHECKING:  # provided by the vLLM worker class this is mixed into
        model_runner: Any

        def reload_weights(
            self, *, weights_path: str | None = None, weights_iterator: Any = None, is_checkpoint_format: bool
        ) -> None: ...

    def vlrl_reload_weights(self, weights_path: str) -> dict:
        """``reload_weights`` from a checkpoint dir, then refresh and check the packed embedding/LM-head matmuls."""
        self.reload_weights(weights_path=weights_path, is_checkpoint_format=True)
        model = self.model_runner.get_model()
        refreshed = refresh_packed_embeddings(model)
        errors = packed_head_error(model)
        return {"refreshed": refreshed, "packed_error": errors}

    def vlrl_reload_from_tensors(self, payload: str) -> dict:
        """``reload_weights`` from tensors sent in the call (``vlrl.vllm.tensor_transfer``: CUDA IPC handles of the
        trainer's tensors on this GPU, or values), no disk; then the packed-head refresh and check as above."""
        import torch

        from vlrl.vllm.tensor_transfer import decode_tensors

        names: list[str] = []

        def tensors():
            for name, t in decode_tensors(payload):
                names.append(name)
                yield name, t

        self.reload_weights(weights_iterator=tensors(), is_checkpoint_format=True)
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # every copy out of the trainer's memory done before the call returns
        model = self.model_runner.get_model()
        return {
            "refreshed": refresh_packed_embeddings(model),
            "packed_error": packed_head_error(model),
            "n": len(names),
        }

    def vlrl_gpu_uuid(self) -> str:
        """This worker's GPU (its UUID), or "" without CUDA: may the trainer send it CUDA IPC handles?"""
        import torch

        if not torch.cuda.is_available():
            return ""
        return str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)

    def vlrl_weight_checksums(self) -> dict[str, str]:
        """``name -> tensor_digest`` of every parameter this worker serves (vLLM's own, fused names)."""
        import torch

        with torch.no_grad():
            return {n: tensor_digest(p) for n, p in self.model_runner.get_model().named_parameters()}

    def vlrl_packed_error(self) -> dict:
        """Without reloading: how far each packed embedding/LM-head matmul is from its current weight."""
        return {"packed_error": packed_head_error(self.model_runner.get_model())}

    def vlrl_keep_sampled_logprobs(self) -> bool:
        """From now on the sampler keeps each sampled token's logprob here (:mod:`vlrl.vllm.sampled_logprobs`)."""
        from vlrl.vllm.sampled_logprobs import SampledLogprobs

        if getattr(self, "_vlrl_sampled", None) is None:
            self._vlrl_sampled = SampledLogprobs(self.model_runner)
        return True

    def vlrl_take_sampled_logprobs(self, request_ids: list[str]) -> dict[str, list[float]]:
        """The kept logprobs of finished requests (``SampledLogprobs.take``)."""
        sampled = getattr(self, "_vlrl_sampled", None)
        if sampled is None:
            raise RuntimeError("vlrl_keep_sampled_logprobs was not called on this worker")
        return sampled.take(list(request_ids))
