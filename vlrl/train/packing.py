"""Sample packing: a batch's rows as one sequence without padding, for the decoder forward.

A right-padded ``[B, L]`` batch spends ``B·L - sum(seq_lens)`` token slots on padding; with the length
spread of multi-turn rollouts that is often a third of the decoder's work. Packed, the real tokens of
all rows run as one ``[1, T]`` sequence (``T = sum(seq_lens)``), and the hidden states are scattered
back to ``[B, L, H]``, so the LM head, the logprob contract and everything downstream are unchanged.

What keeps it exact:

* **Positions.** Each token keeps the mRoPE ``(t, h, w)`` ids the padded forward gives it: they are
  computed on the padded batch by the same function (``vlrl.models.positions.mrope_positions``) and
  gathered, so every row's positions start from its own origin.
* **Attention cannot cross rows.** With vlrl's attention (``vlrl.models.attention.ATTENTION``) the
  rows' lengths travel to it as the ``vlrl_segments`` keyword and it runs causal SDPA per row (varlen:
  ``sum(n²)`` work, no ``T × T`` mask, flash kernels stay eligible). With any other implementation
  (``sdpa``, ``eager``) transformers' own packed path is used: Qwen-VL's text models in transformers
  5.x take ``[4, 1, T]`` position ids whose first row is plain text positions, and with no 2-D mask and
  no cache ``transformers.masking_utils.create_causal_mask`` reads every place where that row does not
  step by one as a sequence start, giving a ``[1, 1, T, T]`` block-diagonal causal mask. Row 0 here is
  each token's index within its own row, so it resets to 0 exactly at row starts.
* **Vision.** ``Batch.pixel_values`` is already every row's images in row order, which is the order
  of their placeholders in the packed sequence, and the vision towers attend within each image
  (``cu_seqlens`` per image), so the vision forward is the very same computation packed or not.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vlrl.models.attention import ATTENTION, SEGMENTS
from vlrl.models.positions import mrope_positions
from vlrl.train.batch import Batch


@dataclass(frozen=True)
class PackedRows:
    """The ``B`` rows of a :class:`Batch` as one unpadded sequence of ``T = sum(seq_lens)`` tokens.

    input_ids       ``[1, T]`` long, row 0's tokens, then row 1's, ...
    position_ids    ``[4, 1, T]`` long: ``[0]`` the token's index within its row (resets at row
                    starts: the sequence boundaries), ``[1:]`` its mRoPE (t, h, w) ids
    rows, cols      ``[T]`` long: where each packed token sits in the ``[B, L]`` batch
    lengths         the rows' token counts (sum ``T``): the varlen segments
    pixel_values    ``[n_patches, D]`` or None, image_grid_thw ``[n_images, 3]`` or None: the batch's own
    shape           ``(B, L)`` of the padded batch
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor
    lengths: tuple[int, ...]
    pixel_values: torch.Tensor | None
    image_grid_thw: torch.Tensor | None
    shape: tuple[int, int]

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])


def pack_rows(model, batch: Batch) -> PackedRows:
    """Pack ``batch`` (right-padded rows) for ``model``, a Qwen-VL ``*ForConditionalGeneration``.

    Raises ``ValueError`` when a row's real tokens are not a prefix of it (``attention_mask`` with holes
    or left padding): packing relies on row ``b`` being ``input_ids[b, :seq_lens[b]]``.
    """
    device = next(model.parameters()).device
    ids, attn = batch.input_ids.to(device), batch.attention_mask.to(device)
    lens = attn.sum(1)
    prefix = torch.arange(ids.shape[1], device=device)[None, :] < lens[:, None]
    if not torch.equal(attn.bool(), prefix):
        raise ValueError("packing needs right-padded rows (attention_mask 1 on a prefix of each row)")
    grid = None if batch.image_grid_thw is None else batch.image_grid_thw.to(device)
    pos = mrope_positions(model, ids, attn, grid)  # [3, B, L]: the padded forward's own positions
    rows, cols = prefix.nonzero(as_tuple=True)  # row-major: row 0's tokens first, each row in order
    position_ids = torch.cat([cols[None], pos[:, rows, cols]])[:, None, :]  # [4, 1, T]
    pixels = None if batch.pixel_values is None else batch.pixel_values.to(device, model.dtype)
    return PackedRows(
        input_ids=ids[rows, cols][None],
        position_ids=position_ids,
        rows=rows,
        cols=cols,
        lengths=tuple(int(n) for n in lens.tolist()),
        pixel_values=pixels,
        image_grid_thw=grid,
        shape=(int(ids.shape[0]), int(ids.shape[1])),
    )


def unpack(packed: PackedRows, values: torch.Tensor) -> torch.Tensor:
    """``[1, T, ...]`` per packed token -> ``[B, L, ...]`` per batch position (zeros on padding); differentiable."""
    B, L = packed.shape
    out = values.new_zeros((B, L, *values.shape[2:]))
    return out.index_put((packed.rows, packed.cols), values[0])


def packed_forward(model, packed: PackedRows, *, varlen: bool = True) -> torch.Tensor:
    """``[1, T, H]`` last hidden states of the decoder over the packed sequence (model dtype).

    ``varlen`` (and the model on vlrl's attention): per-row attention from ``packed.lengths``; else
    transformers' block-diagonal mask from the position-id resets.
    """
    if varlen and model.model.language_model.config._attn_implementation == ATTENTION:
        position_ids, extra = packed.position_ids[1:], {SEGMENTS: packed.lengths}
    else:
        position_ids, extra = packed.position_ids, {}
    out = model.model(
        input_ids=packed.input_ids,
        attention_mask=None,  # None on purpose: the row boundaries come from lengths / position_ids[0]
        position_ids=position_ids,
        pixel_values=packed.pixel_values,
        image_grid_thw=packed.image_grid_thw,
        use_cache=False,
        **extra,
    )
    return out.last_hidden_state


def packed_hidden_states(model, batch: Batch) -> torch.Tensor:
    """``[B, L, H]``: :func:`vlrl.train.forward.decoder_hidden_states` computed packed (zeros on padding)."""
    packed = pack_rows(model, batch)
    return unpack(packed, packed_forward(model, packed))
