"""Loss aggregations against hand-computed values, and exactness under micro-batching."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vlrl.algos import agg_counts, get_aggregation_fn

# masked positions hold 100 (and one inf) to show they contribute nothing
LOSS = torch.tensor(
    [
        [1.0, 2.0, 3.0, 100.0],
        [4.0, 100.0, float("inf"), 100.0],
        [5.0, 6.0, 100.0, 100.0],
    ]
)
MASK = torch.tensor([[1.0, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0]])
NAMES = ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]


def agg(name, loss, mask, **kw):
    return get_aggregation_fn(name)(loss, mask, norm_len=4, **kw)


def test_token_mean_hand_computed():
    # (1 + 2 + 3 + 4 + 5 + 6) / 6 tokens = 21 / 6
    assert agg("token_mean", LOSS, MASK).item() == pytest.approx(3.5)


def test_seq_mean_token_mean_hand_computed():
    # per-row means 6/3 = 2, 4/1 = 4, 11/2 = 5.5 -> (2 + 4 + 5.5) / 3
    assert agg("seq_mean_token_mean", LOSS, MASK).item() == pytest.approx(11.5 / 3)


def test_seq_mean_token_sum_norm_hand_computed():
    # per-row sums 6, 4, 11, each / norm_len 4 -> 1.5, 1, 2.75 -> 5.25 / 3
    assert agg("seq_mean_token_sum_norm", LOSS, MASK).item() == pytest.approx(1.75)


def test_seq_mean_token_sum_norm_needs_norm_len():
    with pytest.raises(ValueError, match="norm_len"):
        get_aggregation_fn("seq_mean_token_sum_norm")(LOSS, MASK)


def test_empty_rows_do_not_count_as_sequences():
    loss = torch.cat([LOSS, torch.full((1, 4), 9.0)])
    mask = torch.cat([MASK, torch.zeros(1, 4)])
    assert agg("seq_mean_token_mean", loss, mask).item() == pytest.approx(11.5 / 3)
    assert agg("seq_mean_token_sum_norm", loss, mask).item() == pytest.approx(1.75)


def test_all_masked_gives_zero_not_nan():
    for name in NAMES:
        assert agg(name, LOSS, torch.zeros_like(MASK)).item() == 0.0


def test_agg_counts_over_micro_batches():
    assert agg_counts([MASK[:2], MASK[2:], torch.zeros(1, 7)]) == (6, 3)


@pytest.mark.parametrize(
    ("name", "full"),
    [
        ("token_mean", 3.5),
        ("seq_mean_token_mean", 11.5 / 3),
        ("seq_mean_token_sum_norm", 1.75),
    ],
)
def test_micro_batches_with_global_counts_sum_to_full_batch(name, full):
    parts = [(LOSS[:2], MASK[:2]), (LOSS[2:], MASK[2:])]
    n_tok, n_seq = agg_counts(m for _, m in parts)
    summed = sum(agg(name, lo, m, num_tokens=n_tok, num_seqs=n_seq) for lo, m in parts)
    assert summed.item() == pytest.approx(full)


def test_micro_batches_with_local_counts_do_not_match():
    # the documented pitfall: local denominators weight the small micro-batch up.
    # rows 0-1: 10 / 4 tokens = 2.5; row 2: 11 / 2 = 5.5 -> mean over micro-batches 4.0 != 3.5
    parts = [(LOSS[:2], MASK[:2]), (LOSS[2:], MASK[2:])]
    local = sum(agg("token_mean", lo, m) for lo, m in parts) / len(parts)
    assert local.item() == pytest.approx(4.0)


def test_counts_may_be_tensors():
    out = agg("token_mean", LOSS, MASK, num_tokens=torch.tensor(12.0))
    assert out.item() == pytest.approx(21 / 12)


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    rows=st.integers(2, 7),
    cols=st.integers(1, 6),
    name=st.sampled_from(NAMES),
    data=st.data(),
)
def test_micro_batching_property(seed, rows, cols, name, data):
    """Any row split, with global counts: summed losses and accumulated gradients are exact."""
    g = torch.Generator().manual_seed(seed)
    loss_values = torch.randn(rows, cols, generator=g, dtype=torch.float64)
    mask = (torch.rand(rows, cols, generator=g) > 0.4).double()
    cuts = sorted(data.draw(st.sets(st.integers(1, rows - 1), max_size=rows - 1)))
    bounds = [0, *cuts, rows]

    full_param = loss_values.clone().requires_grad_()
    full = get_aggregation_fn(name)(full_param, mask, norm_len=cols)
    full.backward()

    micro_param = loss_values.clone().requires_grad_()
    n_tok, n_seq = agg_counts(mask[a:b] for a, b in zip(bounds, bounds[1:]))
    total = torch.zeros((), dtype=torch.float64)
    for a, b in zip(bounds, bounds[1:]):
        part = get_aggregation_fn(name)(micro_param[a:b], mask[a:b], num_tokens=n_tok, num_seqs=n_seq, norm_len=cols)
        part.backward()
        total += part.detach()
    torch.testing.assert_close(total, full.detach())
    torch.testing.assert_close(micro_param.grad, full_param.grad)
