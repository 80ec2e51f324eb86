"""One batched decode: left-padded prefill with all images, then token-by-token with a KV cache."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from vlrl.engines.sampling import contract_logprobs, effective_temperature, sample_tokens, top_logprobs
from vlrl.engines.types import Generation, SamplingParams
from vlrl.models.positions import mrope_positions
from vlrl.render.types import RenderedPrompt

if TYPE_CHECKING:
    from vlrl.engines.embedded import EmbeddedEngine


@dataclass
class Request:
    prompt: RenderedPrompt
    params: SamplingParams
    max_new: int
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[tuple[tuple[int, float], ...]] = field(default_factory=list)
    finish: Generation | None = None


def _prefill_inputs(requests: list[Request], pad_id: int, device) -> dict:
    """Left-padded ``input_ids`` / ``attention_mask`` ``[B, L]`` and the batch's vision tensors."""
    width = max(len(r.prompt.token_ids) for r in requests)
    ids = torch.full((len(requests), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(requests), width), dtype=torch.long)
    for b, r in enumerate(requests):
        n = len(r.prompt.token_ids)
        ids[b, width - n:] = torch.tensor(r.prompt.token_ids, dtype=torch.long)
        mask[b, width - n:] = 1
    with_images = [r.prompt for r in requests if r.prompt.n_images]
    pixels = torch.cat([p.pixel_values for p in with_images]) if with_images else None
    grid = torch.cat([p.image_grid_thw for p in with_images]) if with_images else None
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device),
            "pixel_values": None if pixels is None else pixels.to(device),
            "image_grid_thw": None if grid is None else grid.to(device)}


@torch.no_grad()
def decode_batch(engine: "EmbeddedEngine", requests: list[Request]) -> list[Generation]:
    """Run ``requests`` to completion as one batch; returns their generations in order."""
    from transformers import DynamicCache

    model, device = engine.model, engine.device
    inputs = _prefill_inputs(requests, engine.pad_id, device)
    positions = mrope_positions(model, inputs["input_ids"], inputs["attention_mask"], inputs["image_grid_thw"])
    next_pos = positions.amax(dim=(0, 2)) + 1  # [B]: text after the prompt continues on all three axes
    pixels = inputs["pixel_values"]
    if pixels is not None:
        pixels = pixels.to(model.dtype)
    cache = DynamicCache(config=model.config)
    out = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], position_ids=positions,
                pixel_values=pixels, image_grid_thw=inputs["image_grid_thw"],
                past_key_values=cache, use_cache=True, logits_to_keep=1)
    logits = out.logits[:, -1, :]
    attn = inputs["attention_mask"]
    active = list(range(len(requests)))  # request index of each batch row
    gens = [_generator(r.params, device) for r in requests]
    temps = torch.tensor([effective_temperature(r.params.temperature) for r in requests])
    while True:
        rows = [requests[i] for i in active]
        tokens = sample_tokens(logits, [r.params for r in rows], engine.banned_ids, [gens[i] for i in active])
        contract = contract_logprobs(logits, temps[active], engine.banned_ids)
        lps = contract.gather(1, tokens[:, None])[:, 0]
        tops = top_logprobs(contract, [r.params.logprobs_topk for r in rows])
        keep = []
        for row, (i, tok, lp) in enumerate(zip(active, tokens.tolist(), lps.tolist())):
            requests[i].top.append(tops[row])
            if _step(engine, requests[i], tok, lp):
                keep.append(row)
        if not keep:
            break
        if len(keep) < len(active):  # drop finished rows from the batch and the cache
            idx = torch.tensor(keep, device=device)
            cache.batch_select_indices(idx)
            tokens, attn, next_pos = tokens[idx], attn[idx], next_pos[idx]
            active = [active[k] for k in keep]
        attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=1)
        pos = next_pos.view(1, -1, 1).expand(3, -1, 1)
        out = model(input_ids=tokens[:, None], attention_mask=attn, position_ids=pos, past_key_values=cache,
                    use_cache=True)
        logits = out.logits[:, -1, :]
        next_pos = next_pos + 1
    return [r.finish for r in requests]


def _generator(params: SamplingParams, device) -> torch.Generator | None:
    if params.temperature == 0:
        return None
    gen = torch.Generator(device=device)
    if params.seed is not None:
        gen.manual_seed(params.seed)
    else:
        gen.seed()
    return gen


def _step(engine: "EmbeddedEngine", r: Request, token: int, logprob: float) -> bool:
    """Record one sampled token; returns True while the request goes on."""
    r.ids.append(token)
    r.logprobs.append(logprob)
    p = r.params
    if token in p.stop_token_ids or (not p.ignore_eos and token in engine.eos_ids):
        return _finish(engine, r, "stop", token)
    if p.stop:
        text = engine.tokenizer.decode(r.ids, skip_special_tokens=True)
        for s in p.stop:
            at = text.find(s)
            if at >= 0:
                if not p.include_stop_str_in_output:
                    _cut_before(engine, r, at)
                return _finish(engine, r, "stop", s)
    if len(r.ids) >= r.max_new:
        return _finish(engine, r, "length", None)
    return True


def _cut_before(engine: "EmbeddedEngine", r: Request, char_index: int) -> None:
    """Drop tokens from the end until the decoded text ends at or before ``char_index``."""
    while r.ids and len(engine.tokenizer.decode(r.ids, skip_special_tokens=True)) > char_index:
        r.ids.pop()
        r.logprobs.pop()
        r.top.pop()


def _finish(engine: "EmbeddedEngine", r: Request, reason: str, stop_reason) -> bool:
    text = engine.tokenizer.decode(r.ids, skip_special_tokens=True)
    r.finish = Generation(token_ids=tuple(r.ids), logprobs=tuple(r.logprobs), finish_reason=reason,
                          stop_reason=stop_reason, text=text, weight_version=engine.weight_version,
                          prompt_len=len(r.prompt.token_ids),
                          top_logprobs=tuple(r.top) if r.params.logprobs_topk else ())
    return False
