"""Loss aggregation: per-token losses ``[B, T]`` → one scalar, exact under gradient accumulation.

Every aggregation has the signature::

    fn(loss, mask, *, num_tokens=None, num_seqs=None, norm_len=None) -> scalar

Gradient accumulation, stated exactly. Split the batch of one optimizer step into micro-batches
``k`` (by rows). Let ``N_tok`` be the number of unmasked tokens and ``N_seq`` the number of rows
with at least one unmasked token, both counted over the *whole* step (all micro-batches, and
all data-parallel ranks). Call every micro-batch with ``num_tokens=N_tok, num_seqs=N_seq``
(``agg_counts`` computes them) and call ``.backward()`` on each result as it is, without
dividing by the number of micro-batches. Then the summed micro-batch losses, and so the
accumulated gradients, equal the full-batch loss and its gradient:

- ``token_mean``:              ``sum_k sum_{i,t in k} L_it / N_tok``
- ``seq_mean_token_mean``:     ``sum_k sum_{i in k} (sum_t L_it / n_i) / N_seq``
- ``seq_mean_token_sum_norm``: ``sum_k sum_{i in k} (sum_t L_it / norm_len) / N_seq``

(with data parallelism the per-rank gradients must then be *summed*; DDP averages, so scale by
the world size). Left at ``None``, the counts are those of this call: right for a single
micro-batch, biased towards small micro-batches otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple, Protocol

from torch import Tensor

from vlrl.algos.masked import check_same_shape, masked_sum
from vlrl.registry import Registry

Count = int | float | Tensor


class AggregationFn(Protocol):
    def __call__(
        self,
        loss: Tensor,
        mask: Tensor,
        *,
        num_tokens: Count | None = None,
        num_seqs: Count | None = None,
        norm_len: int | None = None,
    ) -> Tensor: ...


AGGREGATIONS: Registry[AggregationFn] = Registry("loss aggregation")
register_aggregation = AGGREGATIONS.register
get_aggregation_fn = AGGREGATIONS.get


class AggCounts(NamedTuple):
    """Denominators of one optimizer step: unmasked tokens, rows with at least one of them."""

    num_tokens: int
    num_seqs: int


def agg_counts(masks: Iterable[Tensor]) -> AggCounts:
    """Count tokens and non-empty rows over the ``[b_k, T_k]`` masks of all micro-batches of a step."""
    tokens = seqs = 0
    for mask in masks:
        m = mask.bool()
        tokens += int(m.sum())
        seqs += int(m.any(dim=-1).sum())
    return AggCounts(tokens, seqs)


def _local_seqs(mask: Tensor) -> Tensor:
    return mask.bool().any(dim=-1).sum()


def _denominator(count: Count | None, local: Tensor) -> Tensor | float:
    """The given global count, or the local one; never below 1 (an empty batch gives loss 0)."""
    if count is None:
        return local.clamp(min=1)
    return count.clamp(min=1) if isinstance(count, Tensor) else max(float(count), 1.0)


@register_aggregation("token_mean")
def token_mean(
    loss: Tensor,
    mask: Tensor,
    *,
    num_tokens: Count | None = None,
    num_seqs: Count | None = None,
    norm_len: int | None = None,
) -> Tensor:
    """Sum of unmasked token losses / ``num_tokens`` (default: this call's unmasked tokens).

    Every token weighs the same, so long responses weigh more (DAPO). ``[B, T]`` → ``[]``.
    """
    check_same_shape(loss=loss, mask=mask)
    return masked_sum(loss, mask) / _denominator(num_tokens, mask.bool().sum())


@register_aggregation("seq_mean_token_mean")
def seq_mean_token_mean(
    loss: Tensor,
    mask: Tensor,
    *,
    num_tokens: Count | None = None,
    num_seqs: Count | None = None,
    norm_len: int | None = None,
) -> Tensor:
    """Mean over each row's unmasked tokens, summed over rows / ``num_seqs``.

    ``num_seqs`` defaults to this call's rows with at least one unmasked token; empty rows add
    0. Every sequence weighs the same (original GRPO). ``[B, T]`` → ``[]``.
    """
    check_same_shape(loss=loss, mask=mask)
    per_seq = masked_sum(loss, mask, dim=-1) / mask.bool().sum(-1).clamp(min=1)
    return per_seq.sum() / _denominator(num_seqs, _local_seqs(mask))


@register_aggregation("seq_mean_token_sum_norm")
def seq_mean_token_sum_norm(
    loss: Tensor,
    mask: Tensor,
    *,
    num_tokens: Count | None = None,
    num_seqs: Count | None = None,
    norm_len: int | None = None,
) -> Tensor:
    """Each row's token-loss sum / ``norm_len``, summed over rows / ``num_seqs`` (Dr. GRPO).

    ``norm_len`` is a constant of the run, normally the max response length
    (``AlgoConfig.loss_norm_len``); it must not vary with the batch, or the per-token weight
    would again depend on the batch's lengths. Required. ``[B, T]`` → ``[]``.
    """
    check_same_shape(loss=loss, mask=mask)
    if norm_len is None or norm_len <= 0:
        raise ValueError("seq_mean_token_sum_norm needs norm_len > 0 (the run's max response length)")
    per_seq = masked_sum(loss, mask, dim=-1) / float(norm_len)
    return per_seq.sum() / _denominator(num_seqs, _local_seqs(mask))
