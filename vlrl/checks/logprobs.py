"""Reference logprobs from one full forward pass, to check an engine's reported logprobs against."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vlrl.models.positions import mm_token_type_ids
from vlrl.models.tokenizer import vision_token_ids
from vlrl.render.types import RenderedPrompt


@torch.no_grad()
def full_forward_logprobs(model, prompt: RenderedPrompt, token_ids: Sequence[int], temperature: float) -> torch.Tensor:
    """``[n]`` fp32 logprobs of ``token_ids`` after ``prompt`` under the engine logprob contract.

    One forward over prompt + tokens with the prompt's vision tensors; mRoPE positions are left to
    the model itself (from ``mm_token_type_ids`` and the grids), independent of vlrl's position code.
    """
    ids = torch.tensor([list(prompt.token_ids) + list(token_ids)])
    types = mm_token_type_ids(ids, model.config.image_token_id, model.config.video_token_id)
    pixels = None if prompt.pixel_values is None else prompt.pixel_values.to(model.dtype)
    hidden = model.model(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        pixel_values=pixels,
        image_grid_thw=prompt.image_grid_thw,
        mm_token_type_ids=types,
    ).last_hidden_state[0]
    # Written out here rather than calling vlrl.engines.sampling (fp32_logits, contract_logprobs), on
    # purpose: this is the independent reference the engine and trainer (which share those) are checked
    # against. The contract's head runs in fp32 from the model-dtype hidden states.
    logits = hidden.float() @ model.get_output_embeddings().weight.float().T
    n, t = len(prompt.token_ids), (temperature if temperature > 0 else 1.0)
    banned = torch.tensor(vision_token_ids(model.config))
    scaled = logits[n - 1 : -1].float().index_fill(1, banned, float("-inf")) / t
    return torch.log_softmax(scaled, -1).gather(1, torch.tensor(list(token_ids))[:, None])[:, 0]
