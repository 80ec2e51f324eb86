"""Weight sync and logprob probes for :class:`vlrl.engines.vllm.VllmEngine` (design in ``vllm_weights``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from vlrl.engines.vllm_server import VllmServerError
from vlrl.engines.vllm_weights import CheckpointWriter, verify_checksums

if TYPE_CHECKING:
    from vlrl.engines.vllm import VllmEngine

PROBE_TOL = 1e-4


def sync_weights(engine: "VllmEngine", named_tensors, version: int | None, *, reference_model=None) -> int:
    """Write the new weights once, reload them on every server, verify; returns the new version."""
    if engine.model_dir is None:
        raise VllmServerError("update_weights needs the served checkpoint dir (VllmEngine(model_dir=...))")
    if engine._writer is None:
        from vlrl.models.build import default_cache_root
        import os

        root = default_cache_root() / "vllm" / "weights" / f"{os.getpid()}-{id(engine):x}"
        engine._writer = CheckpointWriter(engine.model_dir, root)
    version = engine.weight_version + 1 if version is None else int(version)
    n_changed = len(engine._writer.merge(named_tensors))
    path = engine._writer.write(version)
    for url in engine.client.live_urls():  # a server marked dead gets no more requests
        engine.client.run(_reload(engine, url, str(path), version, n_changed))
    engine._writer.prune(path)
    engine.weight_version = version
    if reference_model is not None:
        check_probe(engine, reference_model)
    return version


def reload_checkpoint(engine: "VllmEngine", path: str | None = None, version: int = 0) -> None:
    """Reload every server from a checkpoint dir (default: the one it was started on) and forget merged updates.

    Unlike :func:`sync_weights` this makes no assumption about what the servers held before (another
    client may have synced them); verify with ``engine.verify_weights(model)``."""
    path = str(path or engine.model_dir)
    for url in engine.client.live_urls():  # a server marked dead gets no more requests
        engine.client.run(_reload_from(engine, url, path, version))
    engine._writer = None
    engine.weight_version = version


async def _reload_from(engine: "VllmEngine", url: str, path: str, version: int) -> None:
    post = engine.client.post
    await post(url, "/pause?mode=wait", {}, what="reload checkpoint (pause)")
    try:
        check_packed(url, await post(url, "/collective_rpc", {"method": "vlrl_reload_weights",
                                                              "kwargs": {"weights_path": path}}, what="reload checkpoint"))
        await _reset_caches(engine, url, "reload checkpoint")
        await post(url, "/update_weight_version", {"new_version": str(version)}, what="reload checkpoint (version)")
    finally:
        await post(url, "/resume", {}, what="reload checkpoint (resume)")


async def _reset_caches(engine: "VllmEngine", url: str, what: str) -> None:
    """After a reload: KV blocks and vision-encoder outputs computed with the old weights must not be reused.

    ``/reset_encoder_cache`` clears the scheduler's encoder-cache bookkeeping *and* the worker's
    cache; the worker's ``reload_weights`` clears only the latter, after which the scheduler
    skips the encoder for an image it believes cached and the engine dies ("Encoder cache miss")."""
    await engine.client.post(url, "/reset_prefix_cache", {}, what=f"{what} (reset_prefix_cache)")
    await engine.client.post(url, "/reset_encoder_cache", {}, what=f"{what} (reset_encoder_cache)")


async def _reload(engine: "VllmEngine", url: str, path: str, version: int, n_changed: int) -> None:
    post = engine.client.post
    before = await checksums(engine, url)
    await post(url, "/pause?mode=wait", {}, what="weight sync (pause)")
    try:
        data = await post(url, "/collective_rpc", {"method": "vlrl_reload_weights", "kwargs": {"weights_path": path}},
                          what="weight sync (vlrl_reload_weights)")
        check_packed(url, data)
        await _reset_caches(engine, url, "weight sync")
        await post(url, "/update_weight_version", {"new_version": str(version)}, what="weight sync (version)")
    finally:
        await post(url, "/resume", {}, what="weight sync (resume)")
    verify_checksums(url, before, await checksums(engine, url), n_changed)


def check_packed(url: str, data: dict) -> None:
    """The worker's report after a reload: every packed embedding / LM-head matmul agrees with its weight."""
    from vlrl.engines.vllm_worker import HEAD_CHECK_TOL

    results = data.get("results")
    if not isinstance(results, list) or not results or not all(isinstance(r, dict) for r in results):
        raise VllmServerError(f"weight sync at {url}: vlrl_reload_weights answered {str(data)[:300]!r} "
                              "(is the server started with --worker-extension-cls "
                              "vlrl.engines.vllm_worker.VlrlWorkerExtension?)")
    for r in results:
        bad = {k: v for k, v in (r.get("packed_error") or {}).items() if not v <= HEAD_CHECK_TOL}
        if bad:
            raise VllmServerError(f"weight sync at {url}: packed matmuls differ from their reloaded weights: {bad}")


async def checksums(engine: "VllmEngine", url: str) -> dict[str, str]:
    data = await engine.client.post(url, "/weight_checker", {"action": "checksum"}, what="weight checksums")
    sums = data.get("checksums")
    if not isinstance(sums, dict) or not sums:
        raise VllmServerError(f"{url}/weight_checker answered garbage: no checksums")
    return sums


async def probe_logprobs(engine: "VllmEngine", prompt, url: str) -> list[float]:
    """Prompt logprobs (raw, T = 1) of ``prompt``'s tokens 1.. from one server; ``prompt`` is ids or a RenderedPrompt."""
    ids = list(prompt) if not hasattr(prompt, "token_ids") else list(prompt.token_ids)
    body = {"model": engine.model, "token_ids": ids, "output_mode": "tokens",
            "sampling_params": {"max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0, "detokenize": False}}
    if hasattr(prompt, "token_ids") and prompt.n_images:
        body["features"] = engine._features(prompt)
    data = await engine.client.post(url, "/inference/v1/generate", body, what="logprob probe")
    entries = data.get("prompt_logprobs")
    if not isinstance(entries, list) or len(entries) != len(ids):
        raise VllmServerError(f"{url}: logprob probe answered garbage (prompt_logprobs {type(entries).__name__})")
    out = []
    for tok, entry in zip(ids[1:], entries[1:]):
        if not isinstance(entry, dict) or str(tok) not in entry:
            raise VllmServerError(f"{url}: logprob probe has no logprob for token {tok}")
        out.append(float(entry[str(tok)]["logprob"]))
    return out


def probe_ids(engine: "VllmEngine", n: int = 24) -> list[int]:
    """A fixed text-only probe sequence (ids spread over the vocabulary, no special tokens)."""
    vocab = len(engine.tokenizer)
    specials = set(engine.tokenizer.all_special_ids) | set(engine.banned_ids)
    ids = [(1009 * (i + 1)) % min(vocab, 150_000) for i in range(4 * n)]
    return [t for t in ids if t not in specials][:n]


def probe_prompt(engine: "VllmEngine"):
    """The probe: one rendered image prompt (vision tower, merger, mRoPE) + the text probe ids (LM, head).

    Rendered once per engine by its own server(s); every server gets the same payload.
    """
    import dataclasses

    if getattr(engine, "_probe_prompt", None) is None:
        import numpy as np
        from PIL import Image

        from vlrl.messages import image_part, text_part
        from vlrl.render.vllm import VllmRenderer

        img = Image.fromarray(np.random.default_rng(12345).integers(0, 255, (56, 84, 3), dtype=np.uint8))
        renderer = VllmRenderer(engine.client, engine.tokenizer, model=engine.model)
        rendered = renderer.render([{"role": "user", "content": [image_part(img), text_part("weights probe")]}])
        engine._probe_prompt = dataclasses.replace(rendered, token_ids=rendered.token_ids + tuple(probe_ids(engine)))
    return engine._probe_prompt


def reference_logprobs(model, prompt) -> list[float]:
    """``model``'s raw (T = 1, full vocabulary) logprobs of ``prompt``'s tokens 1.. (ids or a RenderedPrompt)."""
    import torch

    from vlrl.models.positions import mm_token_type_ids

    token_ids = list(prompt.token_ids) if hasattr(prompt, "token_ids") else list(prompt)
    with torch.no_grad():
        ids = torch.tensor([token_ids])
        kw = {}
        if hasattr(prompt, "token_ids") and prompt.n_images:
            kw = {"pixel_values": prompt.pixel_values, "image_grid_thw": prompt.image_grid_thw,
                  "mm_token_type_ids": mm_token_type_ids(ids, model.config.image_token_id, model.config.video_token_id)}
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), **kw).logits[0].float()
        lp = torch.log_softmax(logits[:-1], -1).gather(1, ids[0, 1:, None])[:, 0]
    return lp.tolist()


def check_probe(engine: "VllmEngine", model, tol: float = PROBE_TOL) -> float:
    """Max |Δ| between every server's probe logprobs and ``model``'s; raises above ``tol``.

    The probe (:func:`probe_prompt`) runs the image through the vision tower and the text through
    the LM and its head, so stale weights anywhere show up as a logprob difference.
    """
    prompt = probe_prompt(engine)
    want = reference_logprobs(model, prompt)
    worst = 0.0
    for url in engine.client.live_urls():  # a server marked dead gets no more requests
        got = engine.client.run(probe_logprobs(engine, prompt, url))
        delta = max(abs(a - b) for a, b in zip(got, want))
        if not delta <= tol:
            raise VllmServerError(f"weight sync at {url}: probe logprobs differ from the trainer's by {delta:.3g} "
                                  f"(> {tol:g}): the server does not hold the trainer's weights")
        worst = max(worst, delta)
    engine.last_probe_delta = worst
    return worst
