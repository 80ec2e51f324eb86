"""Weight sync for vLLM servers: :class:`WeightSync`, owned by :class:`vlrl.vllm.engine.VllmEngine`.

**CPU (implemented, tested)**: the trainer's tensors are merged into a full local copy of the
checkpoint (so partial updates work; ``vlrl.vllm.checkpoint``), written as one safetensors file
into a fresh directory next to the served checkpoint's config, and every server reloads it in place:

    POST /pause?mode=wait            let in-flight requests finish, hold new ones
    POST /collective_rpc             {"method": "vlrl_reload_weights", "kwargs": {"weights_path": DIR}}
                                     (vLLM's reload_weights, which also drops the encoder and multimodal
                                     caches, then re-packs tied LM heads: see ``vlrl.vllm.worker``)
    POST /reset_prefix_cache         KV blocks computed with the old weights must not be reused
    POST /reset_encoder_cache        (see :meth:`WeightSync._reset_caches`)
    POST /update_weight_version      generate answers then carry the new version per token span
                                     (vLLM 0.26 has no such route: the engine's counter is the version)
    POST /resume

then checked: checksums of every served parameter (``vlrl_weight_checksums`` of the worker extension,
through ``/collective_rpc``: the same on every vLLM, where ``/weight_checker`` exists only from 0.32)
are taken before and after, and a sync that changed nothing must leave them identical
(``vlrl.vllm.checkpoint.verify_checksums``). That the server now holds *the trainer's* values — and so
that the reload happened — is proved by a logprob probe (:meth:`WeightSync.verify`: one image prompt +
fixed text, against a forward of the trainer's model). Every route here needs the run's API key
(``vlrl.vllm.auth``); the client sends it.

**Without a checkpoint** (:meth:`WeightSync.push`): the trainer's tensors go in the ``/collective_rpc`` call
itself (``vlrl.vllm.tensor_transfer``), as CUDA IPC handles when trainer and server share a GPU — the worker
extension copies from the trainer's memory into vLLM's weights, nothing through disk or the host — or as values
(CPU, tests). Same pause / reset / resume and checksums around it, proved by the same probe.
:meth:`WeightSync.update` (every training sync) takes this CUDA IPC route by itself when every tensor is on the
GPU that every live server's worker runs on (asked once per server: ``vlrl_gpu_uuid``), and the checkpoint
route otherwise (CPU, servers on other GPUs or hosts). vLLM's own weight-transfer API
(``--weight-transfer-config``, NCCL across GPUs) is not used: its 0.26 IPC engine imports ray, which GPU hosts
lack (``../shared/reference/vllm-versions.md`` §5).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

from vlrl.checks.bounds import bounds_for
from vlrl.engines.types import NamedTensors
from vlrl.models.tokenizer import VISION_TOKENS
from vlrl.render.types import RenderedPrompt
from vlrl.vllm.capabilities import generated_logprobs
from vlrl.vllm.checkpoint import CheckpointWriter, verify_checksums
from vlrl.vllm.client import GENERATE, VllmClient
from vlrl.vllm.contract import ban_fields
from vlrl.vllm.image_cache import ServerImages
from vlrl.vllm.items import generate_features
from vlrl.vllm.renderer import VllmRenderer
from vlrl.vllm.server import VllmServerError
from vlrl.vllm.tensor_transfer import Transport
from vlrl.vllm.worker import HEAD_CHECK_TOL

PROBE_TOL = bounds_for("float32").agreement.max_abs
"""The probe's default bound: fp32 agreement (runs pass their own dtype's, ``vlrl.checks.bounds``)."""
DECODE_PROBE_TOKENS = 4


class WeightSync:
    """What the servers behind one client hold: the served checkpoint plus merged updates (written on
    each sync), the version, and the logprob probe that proves they hold a given model's weights."""

    def __init__(
        self,
        client: VllmClient,
        tokenizer,
        *,
        model: str,
        model_dir: str | None,
        images: ServerImages | None = None,
    ):
        self.client = client
        self.images = images or ServerImages()
        """What the engine believes each server's multimodal cache holds; forgotten where the caches are cleared."""
        self.tokenizer = tokenizer
        self.model = model
        self.model_dir = model_dir
        self.version = 0
        self.last_probe_delta: float | None = None
        self._writer: CheckpointWriter | None = None
        self._probe: RenderedPrompt | None = None
        self._image_token_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")
        self._banned_ids = tuple(tokenizer.convert_tokens_to_ids(t) for t in VISION_TOKENS)
        self.ban: dict[str, Any] = ban_fields(self._banned_ids)
        """The vision-token ban of the decode probe, as sampling-params fields: vlrl's logits processor's until the
        engine has found the form its servers apply (``VllmEngine._check_ban`` sets it)."""
        self._gpus: dict[str, list[str]] = {}
        self._pushed = False  # a push since the last checkpoint sync: the merged copy is not what is served
        self.last_route: str | None = None
        """How the last :meth:`update` reached the servers: ``"cuda_ipc"`` or ``"checkpoint"``."""
        self.last_sync_s: float | None = None
        """Seconds of the last :meth:`update` (reload and checksums; the probe not included)."""

    # ------------------------------------------------------------------ sync

    def update(self, named_tensors: NamedTensors, version: int | None = None, *, reference_model=None) -> int:
        """Reload every live server with the new weights, verify; returns the new version.

        The route (:attr:`last_route`): ``cuda_ipc`` when every tensor is on the GPU every live server runs
        on (trainer and vLLM share it: the servers copy straight from the trainer's memory, see :meth:`push`),
        otherwise ``checkpoint`` (written once into a merged local copy, reloaded by every server). Either way
        the servers' checksums are compared before and after the reload."""
        named = list(named_tensors.items()) if isinstance(named_tensors, Mapping) else list(named_tensors)
        start = time.perf_counter()
        if self._on_servers_gpu(named):
            version = self.push(named, version, transport="cuda_ipc", checked=True)
            self.last_route = "cuda_ipc"
        else:
            version = self._update_from_checkpoint(named, version)
            self.last_route = "checkpoint"
        self.last_sync_s = time.perf_counter() - start
        if reference_model is not None:
            self.verify(reference_model)
        return version

    def _on_servers_gpu(self, named: list) -> bool:
        """Every tensor on one CUDA device, and every live server's worker on that same GPU (by UUID)."""
        devices = {t.device for _, t in named}
        if len(devices) != 1 or next(iter(devices)).type != "cuda":
            return False
        from vlrl.vllm.tensor_transfer import gpu_uuid

        mine = gpu_uuid(next(iter(devices)))
        return all(self._server_gpus(url) == [mine] for url in self.client.live_urls())

    def _server_gpus(self, url: str) -> list[str]:
        """The GPU UUID of each of the server's workers ("" for a CPU worker); asked once per server."""
        if url not in self._gpus:
            body = {"method": "vlrl_gpu_uuid"}
            data = self.client.run(self.client.post(url, "/collective_rpc", body, what="server GPU"))
            results = data.get("results")
            if not isinstance(results, list) or not all(isinstance(r, str) for r in results):
                raise VllmServerError(f"{url}/collective_rpc vlrl_gpu_uuid answered garbage: {str(data)[:300]!r}")
            self._gpus[url] = sorted(set(results))
        return self._gpus[url]

    def _update_from_checkpoint(self, named: list, version: int | None) -> int:
        if self.model_dir is None:
            raise VllmServerError("update_weights needs the served checkpoint dir (VllmEngine(model_dir=...))")
        if self._writer is None:
            self._writer = CheckpointWriter(self.model_dir)
        version = self.version + 1 if version is None else int(version)
        n_changed = len(self._writer.merge(named))
        if self._pushed:  # the servers hold pushed tensors the merged copy never saw: anything sent may move
            n_changed, self._pushed = len(named), False
        path = self._writer.write(version)
        rpc = {"method": "vlrl_reload_weights", "kwargs": {"weights_path": str(path)}}
        for url in self.client.live_urls():  # a server marked dead gets no more requests
            self.client.run(self._reload(url, rpc, version, "weight sync", n_changed=n_changed))
        self._writer.prune(path)
        self.version = version
        return version

    def reload_checkpoint(self, path: str | None = None, version: int = 0) -> None:
        """Every live server back on a checkpoint dir (default: the served one); merged updates forgotten.

        Unlike :meth:`update` this assumes nothing about what the servers held before (another client
        may have synced them), so no checksum comparison; prove the result with :meth:`verify`."""
        rpc = {"method": "vlrl_reload_weights", "kwargs": {"weights_path": str(path or self.model_dir)}}
        for url in self.client.live_urls():
            self.client.run(self._reload(url, rpc, version, "reload checkpoint"))
        self._writer = None
        self.version = version

    def close(self) -> None:
        """Remove the merged checkpoint copy from disk (stopping the servers is not this object's job)."""
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()

    def push(
        self,
        named_tensors: NamedTensors,
        version: int | None = None,
        *,
        transport: Transport = "cuda_ipc",
        checked: bool = False,
    ) -> int:
        """Sync without a checkpoint: every live server reloads the given tensors straight from the call
        (``vlrl.vllm.tensor_transfer``: CUDA IPC handles when trainer and server share a GPU, or values).
        Partial updates reload only what is sent. The merged checkpoint of :meth:`update` is forgotten, so a later
        partial :meth:`update` starts again from the served checkpoint. ``checked``: compare the servers'
        checksums before and after, as :meth:`update` does. Prove the result with :meth:`verify`."""
        from vlrl.vllm.tensor_transfer import encode_tensors

        version = self.version + 1 if version is None else int(version)
        named = list(named_tensors.items()) if isinstance(named_tensors, Mapping) else list(named_tensors)
        payload, keep = encode_tensors(named, transport)
        rpc = {"method": "vlrl_reload_from_tensors", "kwargs": {"payload": payload}}
        n_changed = len(named) if checked else None
        for url in self.client.live_urls():
            self.client.run(self._reload(url, rpc, version, f"weight push ({transport})", n_changed=n_changed))
        del keep  # the servers have copied out of the trainer's tensors
        self._writer, self._pushed = None, True
        self.version = version
        return version

    async def _reload(self, url: str, rpc: dict, version: int, what: str, *, n_changed: int | None = None) -> None:
        post = self.client.post
        caps = await self.client.acapabilities()
        before = await self._checksums(url) if n_changed is not None else None
        await post(url, "/pause?mode=wait", {}, what=f"{what} (pause)")
        self.images.forget()  # /pause clears the server's multimodal cache (clear_cache defaults to true)
        try:
            data = await post(url, "/collective_rpc", rpc, what=f"{what} (reload)")
            check_packed(url, data)
            await self._reset_caches(url, what)
            if caps.has("/update_weight_version"):
                await post(url, "/update_weight_version", {"new_version": str(version)}, what=f"{what} (version)")
        finally:
            await post(url, "/resume", {}, what=f"{what} (resume)")
        if before is not None and n_changed is not None:
            verify_checksums(url, before, await self._checksums(url), n_changed)

    def reset_caches(self) -> None:
        """Every live server forgets its prefix (KV) and encoder caches (``VllmEngine.clear_caches``); the
        engine sends every image whole again (a cold start)."""
        self.images.forget()
        for url in self.client.live_urls():
            self.client.run(self._reset_caches(url, "clear caches"))

    async def _reset_caches(self, url: str, what: str) -> None:
        """After a reload: KV blocks and vision-encoder outputs computed with the old weights must not be reused.

        ``/reset_encoder_cache`` clears the scheduler's encoder-cache bookkeeping *and* the worker's
        cache; the worker's ``reload_weights`` clears only the latter, after which the scheduler
        skips the encoder for an image it believes cached and the engine dies ("Encoder cache miss")."""
        await self.client.post(url, "/reset_prefix_cache", {}, what=f"{what} (reset_prefix_cache)")
        await self.client.post(url, "/reset_encoder_cache", {}, what=f"{what} (reset_encoder_cache)")

    async def _checksums(self, url: str) -> dict[str, str]:
        """Every worker's digest of every parameter it serves (``rank:name`` -> digest)."""
        body = {"method": "vlrl_weight_checksums"}
        data = await self.client.post(url, "/collective_rpc", body, what="weight checksums")
        results = data.get("results")
        if not isinstance(results, list) or not results or not all(isinstance(r, dict) and r for r in results):
            raise VllmServerError(f"{url}/collective_rpc vlrl_weight_checksums answered garbage: {str(data)[:300]!r}")
        return {f"{rank}:{name}": digest for rank, r in enumerate(results) for name, digest in r.items()}

    # ------------------------------------------------------------------ probe

    def probe_logprobs(self, prompt: Sequence[int] | RenderedPrompt, url: str) -> list[float]:
        return self.client.run(self._aprobe(prompt, url))

    async def _aprobe(self, prompt: Sequence[int] | RenderedPrompt, url: str) -> list[float]:
        """Prompt logprobs (raw, T = 1) of ``prompt``'s tokens 1.. from one server."""
        ids = list(prompt.token_ids) if isinstance(prompt, RenderedPrompt) else list(prompt)
        body: dict[str, Any] = {
            "model": self.model,
            "token_ids": ids,
            "output_mode": "tokens",
            "sampling_params": {"max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0, "detokenize": False},
        }
        if isinstance(prompt, RenderedPrompt) and prompt.n_images:
            body["features"] = generate_features(prompt, self._image_token_id)
        data = await self.client.post(url, GENERATE, body, what="logprob probe")
        entries = data.get("prompt_logprobs")
        if not isinstance(entries, list) or len(entries) != len(ids):
            raise VllmServerError(f"{url}: logprob probe answered garbage (prompt_logprobs {type(entries).__name__})")
        out = []
        for tok, entry in zip(ids[1:], entries[1:]):
            if not isinstance(entry, dict) or str(tok) not in entry:
                raise VllmServerError(f"{url}: logprob probe has no logprob for token {tok}")
            out.append(float(entry[str(tok)]["logprob"]))
        return out

    def probe_prompt(self) -> RenderedPrompt:
        """The probe: one rendered image prompt (vision tower, merger, mRoPE) + fixed text ids (LM, head).

        Rendered once by the servers themselves; every server gets the same payload."""
        if self._probe is None:
            import numpy as np
            from PIL import Image

            from vlrl.messages import image_part, text_part

            img = Image.fromarray(np.random.default_rng(12345).integers(0, 255, (56, 84, 3), dtype=np.uint8))
            renderer = VllmRenderer(self.client, self.tokenizer, model=self.model)
            rendered = renderer.render([{"role": "user", "content": [image_part(img), text_part("weights probe")]}])
            self._probe = dataclasses.replace(rendered, token_ids=rendered.token_ids + tuple(probe_ids(self.tokenizer)))
        return self._probe

    async def _adecode(self, prompt: RenderedPrompt, url: str, n: int = DECODE_PROBE_TOKENS) -> tuple[list, list]:
        """``n`` tokens sampled after ``prompt`` (T = 1, seed 0, the vision ids banned as in a rollout) and their
        logprobs: the decode steps, which a server may run as CUDA graphs captured before the reload
        (``execution="graphs"``); the prompt probe above runs the prefill only."""
        sp = {"max_tokens": n, "temperature": 1.0, "seed": 0, "logprobs": 0, "ignore_eos": True}
        body: dict[str, Any] = {
            "model": self.model,
            "token_ids": list(prompt.token_ids),
            "output_mode": "tokens",
            "sampling_params": {**sp, **self.ban},
        }
        if prompt.n_images:
            body["features"] = generate_features(prompt, self._image_token_id)
        data = await self.client.post(url, GENERATE, body, what="decode probe")
        choice = (data.get("choices") or [{}])[0]
        ids = [int(t) for t in choice.get("token_ids") or []]
        lps = generated_logprobs((choice.get("logprobs") or {}).get("content"), ids, await self.client.acapabilities())
        if not ids or lps is None:
            raise VllmServerError(f"{url}: decode probe answered garbage: {str(data)[:300]!r}")
        return ids, lps

    def verify(self, model, tol: float = PROBE_TOL) -> float:
        """Max |Δ| between every live server's probe logprobs and ``model``'s; raises above ``tol``.

        The probe runs the image through the vision tower and the text through the LM and its head (prefill), then
        samples a few tokens (decode), so stale weights anywhere — a captured decode graph's included — show up as
        a logprob difference."""
        prompt = self.probe_prompt()
        want = reference_logprobs(model, prompt)
        worst = 0.0
        for url in self.client.live_urls():
            got = self.probe_logprobs(prompt, url)
            ids, decoded = self.client.run(self._adecode(prompt, url))
            extended = dataclasses.replace(prompt, token_ids=prompt.token_ids + tuple(ids))
            want_decoded = reference_logprobs(model, extended, banned=self._banned_ids)[-len(ids) :]
            delta = max(abs(a - b) for a, b in zip([*got, *decoded], [*want, *want_decoded]))
            if not delta <= tol:
                raise VllmServerError(
                    f"weight sync at {url}: probe logprobs (prefill and decode) differ from the trainer's by "
                    f"{delta:.3g} (> {tol:g}): the server does not hold the trainer's weights"
                )
            worst = max(worst, delta)
        self.last_probe_delta = worst
        return worst


def check_packed(url: str, data: dict) -> None:
    """The worker's report after a reload: every packed embedding / LM-head matmul agrees with its weight."""
    results = data.get("results")
    if not isinstance(results, list) or not results or not all(isinstance(r, dict) for r in results):
        raise VllmServerError(
            f"weight sync at {url}: vlrl_reload_weights answered {str(data)[:300]!r} "
            "(is the server started with --worker-extension-cls "
            "vlrl.vllm.worker.VlrlWorkerExtension?)"
        )
    for r in results:
        bad = {k: v for k, v in (r.get("packed_error") or {}).items() if not v <= HEAD_CHECK_TOL}
        if bad:
            raise VllmServerError(f"weight sync at {url}: packed matmuls differ from their reloaded weights: {bad}")


def probe_ids(tokenizer, n: int = 24) -> list[int]:
    """A fixed text-only probe sequence (ids spread over the vocabulary, no special or vision tokens)."""
    from vlrl.models.tokenizer import VISION_TOKENS

    vocab = len(tokenizer)
    specials = set(tokenizer.all_special_ids) | {tokenizer.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    ids = [(1009 * (i + 1)) % min(vocab, 150_000) for i in range(4 * n)]
    return [t for t in ids if t not in specials][:n]


def reference_logprobs(model, prompt: Sequence[int] | RenderedPrompt, banned: Sequence[int] = ()) -> list[float]:
    """``model``'s raw (T = 1) logprobs of ``prompt``'s tokens 1.. (ids or a RenderedPrompt), over the full
    vocabulary or without the ``banned`` ids (as a server's ban leaves it)."""
    import torch

    from vlrl.models.positions import mm_token_type_ids

    token_ids = list(prompt.token_ids) if isinstance(prompt, RenderedPrompt) else list(prompt)
    param = next(model.parameters())  # a trainer on the GPU: inputs go where its weights are
    # fp32 means fp32 (as in vlrl.train.run): with CUDA's default TF32 in convolutions (the vision patch
    # embedding) an fp32 trainer's probe missed an fp32 (ieee) server by 2.9e-4 on the H100, past the bound
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    with torch.no_grad():
        ids = torch.tensor([token_ids], device=param.device)
        kw = {}
        if isinstance(prompt, RenderedPrompt) and prompt.n_images:
            pixels, grid = prompt.vision()
            kw = {
                "pixel_values": pixels.to(param.device, param.dtype),
                "image_grid_thw": grid.to(param.device),
                "mm_token_type_ids": mm_token_type_ids(ids, model.config.image_token_id, model.config.video_token_id),
            }
        try:
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), **kw).logits[0].float()
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
        if banned:
            logits[:, list(banned)] = float("-inf")
        lp = torch.log_softmax(logits[:-1], -1).gather(1, ids[0, 1:, None])[:, 0]
    return lp.tolist()
