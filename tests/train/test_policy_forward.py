"""The policy forward: engine logprobs reproduced (≤1e-4, fp32), positions, chunking, gradients."""

from __future__ import annotations

import pytest
import torch
import traj_helpers as H

from vlrl.checks.logprobs import full_forward_logprobs
from vlrl.models.positions import mm_token_type_ids, mrope_positions
from vlrl.models.tokenizer import vision_token_ids
from vlrl.render.types import RenderedPrompt
from vlrl.train.batch import CollateSpec, collate
from vlrl.train.forward import chunked_token_stats, policy_forward


def _batch(b, trajs, gens=None):
    tops = None if gens is None else [g.top_logprobs for g in gens]
    return collate(trajs, CollateSpec.from_model(b.model), top_logprobs=tops)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_forward_reproduces_engine_logprobs(single_turn, arch, temperature):
    """Text, single-image, three-image and same-size-image rows in one batch (one engine batch too)."""
    b, trajs, gens = single_turn(arch, temperature)
    batch = _batch(b, trajs)
    with torch.no_grad():
        out = policy_forward(b.model, batch)
    for row, (t, g) in enumerate(zip(trajs, gens)):
        p, n = len(t.prompt_ids), len(t.token_ids)
        diff = (out.logprobs[row, p:n] - torch.tensor(g.logprobs)).abs().max().item()
        assert diff <= 1e-4, f"{arch} T={temperature} row {row} ({t.n_images} images): max |Δ| {diff}"
    assert torch.equal(out.computed, batch.loss_mask.bool())
    assert (out.logprobs[~out.computed] == 0).all()


def test_forward_reproduces_engine_logprobs_over_multi_turn_rollouts(multi_turn, arch):
    b, trajs = multi_turn(arch)
    batch = _batch(b, trajs)
    with torch.no_grad():
        out = policy_forward(b.model, batch)
    m = batch.loss_mask.bool()
    assert m.sum() > 0 and batch.image_counts.min() >= 3
    assert (out.logprobs[m] - batch.rollout_logprobs[m]).abs().max() <= 1e-4


def test_positions_match_the_models_own_computation(single_turn, arch):
    """vlrl's mRoPE positions on the right-padded batch == the model's own, row by row unpadded."""
    b, trajs, _ = single_turn(arch, 1.0)
    batch = _batch(b, trajs)
    pos = mrope_positions(b.model, batch.input_ids, batch.attention_mask, batch.image_grid_thw)
    inner = b.model.model
    for row, t in enumerate(trajs):
        ids = torch.tensor([t.token_ids])
        types = mm_token_type_ids(ids, b.model.config.image_token_id, b.model.config.video_token_id)
        own = inner.compute_3d_position_ids(
            input_ids=ids,
            inputs_embeds=inner.get_input_embeddings()(ids),
            image_grid_thw=t.image_grid_thw,
            video_grid_thw=None,
            attention_mask=None,
            past_key_values=None,
            mm_token_type_ids=types,
        )
        n = len(t.token_ids)
        if own is None:  # text only: the model infers 1-D positions
            own = torch.arange(n).view(1, 1, -1).expand(3, 1, -1)
        assert torch.equal(pos[:, row, :n], own[:3, 0]), f"row {row}"
        if t.n_images:  # the grid matters: image rows are not 1-D positions
            assert not torch.equal(pos[0, row, :n], torch.arange(n))


def test_forward_matches_an_independent_full_forward(single_turn, arch):
    """Against ``full_forward_logprobs`` (positions left to the model, one unpadded sequence each)."""
    b, trajs, _ = single_turn(arch, 0.7)
    batch = _batch(b, trajs)
    with torch.no_grad():
        out = policy_forward(b.model, batch)
    for row, t in enumerate(trajs):
        rp = RenderedPrompt(
            token_ids=t.prompt_ids,
            pixel_values=t.pixel_values,
            image_grid_thw=t.image_grid_thw,
            placeholders=t.placeholders,
            image_hashes=t.image_hashes,
        )
        ref = full_forward_logprobs(b.model, rp, t.response_ids, 0.7)
        p, n = len(t.prompt_ids), len(t.token_ids)
        assert (out.logprobs[row, p:n] - ref).abs().max() <= 1e-4


NO_BAN = torch.tensor([], dtype=torch.long)  # toy heads below have no vision ids


def _naive(model, batch):
    """Unchunked reference: the model's full ``[B, L, V]`` logits, log_softmax, shifted gather."""
    pos = mrope_positions(model, batch.input_ids, batch.attention_mask, batch.image_grid_thw)
    logits = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=pos,
        pixel_values=batch.pixel_values,
        image_grid_thw=batch.image_grid_thw,
    ).logits
    banned = torch.tensor(vision_token_ids(model.config))  # outside the contract's softmax
    logp = torch.log_softmax(logits.float().index_fill(-1, banned, float("-inf")) / batch.temperature, -1)[:, :-1]
    lp = logp.gather(-1, batch.input_ids[:, 1:, None])[..., 0]
    ent = -(logp.exp() * torch.nan_to_num(logp, neginf=0.0)).sum(-1)
    return torch.nn.functional.pad(lp, (1, 0)), torch.nn.functional.pad(ent, (1, 0))


def test_chunked_equals_unchunked_and_the_full_logits_reference(single_turn, arch):
    b, trajs, _ = single_turn(arch, 0.7)
    batch = _batch(b, trajs)
    with torch.no_grad():
        small = policy_forward(b.model, batch, chunk_size=7, positions="all")
        whole = policy_forward(b.model, batch, chunk_size=None, positions="all")
        lp, ent = _naive(b.model, batch)
    m = small.computed
    assert m.sum() == batch.attention_mask.sum() - batch.size  # every real token after the first
    # Vision placeholder tokens are outside the contract's softmax: -inf on both sides, nowhere else.
    vision = torch.isin(batch.input_ids, torch.tensor(vision_token_ids(b.model.config)))
    assert torch.equal(torch.isinf(small.logprobs) & m, vision & m) and torch.equal(torch.isinf(lp) & m, vision & m)
    m = m & ~vision
    assert (small.logprobs[m] - whole.logprobs[m]).abs().max() <= 1e-5
    assert (small.logprobs[m] - lp[m]).abs().max() <= 1e-4
    assert (small.entropy[m] - ent[m]).abs().max() <= 1e-4
    assert (small.entropy[m] > 0).all()


def test_micro_batches_give_the_same_logprobs(single_turn):
    b, trajs, _ = single_turn("qwen2_5_vl", 1.0)
    batch = _batch(b, trajs)
    with torch.no_grad():
        whole = policy_forward(b.model, batch)
        for rows in ([1], [3, 0], [4, 2]):
            part = policy_forward(b.model, batch.select(rows))
            width = part.logprobs.shape[1]
            assert (part.logprobs - whole.logprobs[rows, :width]).abs().max() <= 1e-5


def test_gradient_flows_to_text_and_vision_weights_and_chunking_keeps_it_exact(tiny):
    """Own tiny model copy (the session engine's weights are not touched): grads chunked == unchunked."""
    b = tiny("qwen2_vl")
    from vlrl.models.load import load_model

    model = load_model(b.path).train()
    trajs, _ = H.rollout(b, [H.conversations()["multi"], H.conversations()["single"]], 0.7, max_tokens=12)
    batch = _batch(b, trajs)
    grads = []
    for chunk in (5, None):
        model.zero_grad()
        out = policy_forward(model, batch, chunk_size=chunk, entropy_grad=True)
        loss = -(out.logprobs * batch.loss_mask).sum() / batch.loss_mask.sum() - 0.1 * out.entropy.sum()
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    chunked, whole = grads
    # lm_head is tied to the embedding here: its gradient lands on embed_tokens
    for prefix in (
        "model.language_model.embed_tokens",
        "model.language_model.layers.0.",
        "model.language_model.layers.1.",
        "model.visual.",
    ):
        names = [n for n in chunked if n.startswith(prefix)]
        assert names and any(chunked[n].abs().sum() > 0 for n in names), f"no gradient reaches {prefix}"
    for n in whole:
        err = (chunked[n] - whole[n]).abs().max().item()
        assert err <= 1e-5 * whole[n].abs().max().item() + 1e-9, f"{n}: chunked vs unchunked grad max |Δ| {err}"


def test_no_more_than_chunk_size_rows_are_projected_at_once_even_in_backward(monkeypatch):
    import vlrl.train.forward as forward

    torch.manual_seed(0)
    head = torch.nn.Linear(16, 1000, bias=False)
    hidden = torch.randn(50, 16, requires_grad=True)
    targets = torch.randint(0, 1000, (50,))
    rows: list[int] = []
    project = forward.fp32_logits
    monkeypatch.setattr(forward, "fp32_logits", lambda m, h: (rows.append(h.shape[0]), project(m, h))[1])
    lp, ent = chunked_token_stats(head, hidden, targets, 0.7, banned=NO_BAN, chunk_size=8, entropy_grad=True)
    (lp.sum() + ent.sum()).backward()
    assert max(rows) == 8 and len(rows) == 2 * 7  # 7 chunks, each recomputed once in the backward
    ref = torch.log_softmax(head(hidden).float() / 0.7, -1).gather(1, targets[:, None])[:, 0]
    assert (lp - ref).abs().max() <= 1e-5


def test_entropy_is_a_detached_metric_unless_asked_for():
    head = torch.nn.Linear(8, 50, bias=False)
    hidden = torch.randn(10, 8, requires_grad=True)
    targets = torch.randint(0, 50, (10,))
    lp, ent = chunked_token_stats(head, hidden, targets, 1.0, banned=NO_BAN, chunk_size=4)
    assert lp.requires_grad and not ent.requires_grad
    _, ent = chunked_token_stats(head, hidden, targets, 1.0, banned=NO_BAN, chunk_size=4, entropy_grad=True)
    assert ent.requires_grad
