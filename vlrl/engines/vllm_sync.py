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
    for url in engine.client.urls:
        engine.client.run(_reload(engine, url, str(path), version, n_changed))
    engine._writer.prune(path)
    engine.weight_version = version
    if reference_model is not None:
        check_probe(engine, reference_model)
    return version


async def _reload(engine: "VllmEngine", url: str, path: str, version: int, n_changed: int) -> None:
    post = engine.client.post
    before = await checksums(engine, url)
    await post(url, "/pause?mode=wait", {}, what="weight sync (pause)")
    try:
        await post(url, "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": path}},
                   what="weight sync (reload_weights)")
        await post(url, "/reset_prefix_cache", {}, what="weight sync (reset_prefix_cache)")
        await post(url, "/update_weight_version", {"new_version": str(version)}, what="weight sync (version)")
    finally:
        await post(url, "/resume", {}, what="weight sync (resume)")
    verify_checksums(url, before, await checksums(engine, url), n_changed)


async def checksums(engine: "VllmEngine", url: str) -> dict[str, str]:
    data = await engine.client.post(url, "/weight_checker", {"action": "checksum"}, what="weight checksums")
    sums = data.get("checksums")
    if not isinstance(sums, dict) or not sums:
        raise VllmServerError(f"{url}/weight_checker answered garbage: no checksums")
    return sums


async def probe_logprobs(engine: "VllmEngine", token_ids: list[int], url: str) -> list[float]:
    """``[len(token_ids) - 1]`` prompt logprobs (raw, T = 1) from one server."""
    body = {"model": engine.model, "token_ids": token_ids, "output_mode": "tokens",
            "sampling_params": {"max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0, "detokenize": False}}
    data = await engine.client.post(url, "/inference/v1/generate", body, what="logprob probe")
    entries = data.get("prompt_logprobs")
    if not isinstance(entries, list) or len(entries) != len(token_ids):
        raise VllmServerError(f"{url}: logprob probe answered garbage (prompt_logprobs {type(entries).__name__})")
    out = []
    for tok, entry in zip(token_ids[1:], entries[1:]):
        if not isinstance(entry, dict) or str(tok) not in entry:
            raise VllmServerError(f"{url}: logprob probe has no logprob for token {tok}")
        out.append(float(entry[str(tok)]["logprob"]))
    return out


def probe_ids(engine: "VllmEngine", n: int = 24) -> list[int]:
    """A fixed text-only probe sequence (ids spread over the vocabulary, no special tokens)."""
    vocab = len(engine.tokenizer)
    return [(1009 * (i + 1)) % min(vocab, 150_000) for i in range(n)]


def reference_logprobs(model, token_ids: Sequence[int]) -> list[float]:
    import torch

    with torch.no_grad():
        ids = torch.tensor([list(token_ids)])
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0].float()
        lp = torch.log_softmax(logits[:-1], -1).gather(1, ids[0, 1:, None])[:, 0]
    return lp.tolist()


def check_probe(engine: "VllmEngine", model, tol: float = PROBE_TOL) -> float:
    """Max |Δ| between every server's probe logprobs and ``model``'s; raises above ``tol``."""
    ids = probe_ids(engine)
    want = reference_logprobs(model, ids)
    worst = 0.0
    for url in engine.client.urls:
        got = engine.probe_logprobs(ids, url=url)
        delta = max(abs(a - b) for a, b in zip(got, want))
        if delta > tol:
            raise VllmServerError(f"weight sync at {url}: probe logprobs differ from the trainer's by {delta:.3g} "
                                  f"(> {tol:g}): the server does not hold the trainer's weights")
        worst = max(worst, delta)
    return worst
