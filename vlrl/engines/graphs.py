"""The embedded engine's decode step as one CUDA graph replay (``EmbeddedEngine(graphs=True)``, CUDA's default).

Why: a decode step of the eager path (:class:`vlrl.engines.steps.DynamicSteps`) is a few thousand small kernels
launched one by one from Python — on the H200 a 2b model's step took ~21 ms at one row and ~40 ms at 256
(``benchmarks/results/bench_h200_2b_81f2c4f.json``), nearly all of it host time. Captured once, the same kernels
replay from one call.

What a graph needs is fixed shapes and fixed addresses, so a batch decodes in a *slot* of ``B`` rows (a power of
two, at least the batch) and ``C`` columns (a multiple of :data:`COLUMNS`, at least prompt + new tokens). Keys and
values live in one zeroed *arena* ``[B_max, H_kv, C_max, D]`` per layer that every slot views; the step writes the
fed token's keys / values at column ``col`` (a device scalar, so replays need no host values), marks that column
in the slot's mask ``[B, 1, 1, C]`` and attends over all ``C`` columns under the mask. The prompt's padding and
the columns not yet written are masked out, so a row attends to exactly the columns of the eager path: the same
mask, positions, layers and LM head. Spare rows (the slot's beyond the batch, or finished rows) decode garbage
that no one reads; when at most half a slot's rows remain, they move to the smaller slot.

Graphs stay valid while the parameters keep their storage (``update_weights`` copies in place); a replaced
parameter re-captures. At most :data:`MAX_SLOTS` shapes are kept; the arena is sized for the batches seen, within
``max_bytes`` (past it a batch steps eagerly). A model whose step a slot cannot reproduce (another attention, sliding
windows, a rescaled rotary: :func:`unsupported`) keeps the eager steps. Off CUDA a slot runs the same step eagerly
(how the CPU tests check it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import torch

from vlrl.engines.sampling import on_device

COLUMNS = 128
"""A slot's columns are a multiple of this: prompts of neighbouring lengths share a captured graph."""

WARMUP = 2
"""Eager runs of a step before it is captured (lazy initialisations must not happen inside the capture)."""

ATTENTIONS = ("vlrl_sdpa", "sdpa")
"""Attention implementations whose mask is the boolean ``[B, 1, Lq, Lk]`` a slot builds (eager adds floats)."""

MAX_SLOTS = 8
"""Slots (captured shapes) kept at once, least recently used dropped first."""


def unsupported(lm) -> str | None:
    """Why a slot's step would not be ``lm``'s own step (None when it would): one full-attention mask for every
    layer, positions through a rotary embedding without host-side rescaling."""
    attention = lm.config._attn_implementation
    if attention not in ATTENTIONS:
        return f"graphs need attention {' or '.join(ATTENTIONS)}, the model has {attention!r}"
    if getattr(lm, "has_sliding_layers", False) or getattr(lm.config, "use_sliding_window", False):
        return "graphs do not build sliding-window masks, and the model has sliding-window layers"
    rope = getattr(lm.rotary_emb, "rope_type", "default")
    if rope != "default":
        return f"graphs need the default rotary embedding, the model's is {rope!r}"
    return None


def bucket(n: int) -> int:
    """The slot rows for ``n`` rows: the next power of two."""
    return 1 << max(0, n - 1).bit_length()


class StaticKV:
    """The ``past_key_values`` the layers see in a slot's step: ``update`` writes the step's keys / values
    ``[B, H_kv, 1, D]`` at column ``col`` of the slot's views and returns the views ``[B, H_kv, C, D]`` whole."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], col: torch.Tensor):
        self.keys, self.values, self.col = keys, values, col

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        k, v = self.keys[layer_idx], self.values[layer_idx]
        k.index_copy_(2, self.col, key)
        v.index_copy_(2, self.col, value)
        return k, v


class Slot:
    """Buffers of one ``(B, C)`` shape: fed tokens ``[B]``, next positions ``[B]``, mask ``[B, 1, 1, C]`` and the
    arena's views; on CUDA, the captured step and its output logits ``[B, V]``."""

    def __init__(self, arena: SimpleNamespace, rows: int, columns: int):
        device = arena.col.device
        self.rows, self.columns = rows, columns
        self.tokens = torch.zeros(rows, dtype=torch.long, device=device)
        self.pos = torch.zeros(rows, dtype=torch.long, device=device)
        self.mask = torch.zeros(rows, 1, 1, columns, dtype=torch.bool, device=device)
        views = [[x[:rows, :, :columns] for x in xs] for xs in (arena.keys, arena.values)]
        self.kv = StaticKV(views[0], views[1], arena.col)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None

    def run(self, lm, head: Callable) -> torch.Tensor:
        """One step, eagerly: embed the fed tokens, unmask column ``col``, the layers, the norm, the head."""
        hidden = lm.embed_tokens(self.tokens[:, None])
        self.mask.index_fill_(3, self.kv.col, True)
        position_embeddings = lm.rotary_emb(hidden, self.pos.view(1, -1, 1).expand(3, -1, 1))
        for layer in lm.layers:
            out = layer(
                hidden,
                attention_mask=self.mask,
                position_embeddings=position_embeddings,
                past_key_values=self.kv,
                use_cache=True,
            )
            hidden = out[0] if isinstance(out, tuple) else out
        return head(lm.norm(hidden)[:, -1])

    def step(self, lm, head: Callable) -> torch.Tensor:
        """One step (the replay on CUDA) -> logits ``[B, V]`` fp32 (the graph's own buffer on CUDA)."""
        if self.graph is None:
            return self.run(lm, head)
        self.graph.replay()
        assert self.logits is not None
        return self.logits


class DecodeGraphs:
    """An engine's arena, slots and graphs. ``max_bytes``: the arena's limit; a batch that would need more
    decodes on the eager path."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.arena: SimpleNamespace | None = None
        self.slots: dict[tuple[int, int], Slot] = {}
        self._params: tuple[int, ...] = ()
        self._pool: Any = None  # torch.cuda.graph_pool_handle(): the memory the slots' graphs share

    def clear(self) -> None:
        self.arena, self.slots, self._pool = None, {}, None

    def steps(self, model, head: Callable, cache, attn: torch.Tensor, next_pos: torch.Tensor, columns: int):
        """:class:`GraphSteps` for a prefilled batch of ``model`` (a Qwen-VL ``...ForConditionalGeneration``) —
        ``head`` its LM head (``fp32_head``), ``cache`` its ``DynamicCache``, ``attn`` ``[n, W]`` its mask,
        ``next_pos`` ``[n]``, ``columns`` its prompt width plus its most new tokens — or None when it does not fit
        ``max_bytes``."""
        lm = model.model.language_model
        n, width = attn.shape
        rows, cols = bucket(n), -(-columns // COLUMNS) * COLUMNS
        if not self._arena_for(cache, rows, cols):
            return None
        assert self.arena is not None
        params = tuple(p.data_ptr() for p in model.parameters())  # the LM head's too
        if params != self._params:  # a parameter was replaced: the graphs point at the old storage
            self.slots, self._params = {}, params
        slot = self._slot(rows, cols)
        for layer, (k, v) in enumerate(zip(slot.kv.keys, slot.kv.values)):
            # zeroed first: masked columns weigh 0, but 0 x NaN is NaN — one diverged batch must not poison the next
            k.zero_()
            v.zero_()
            k[:n, :, :width].copy_(cache.layers[layer].keys)
            v[:n, :, :width].copy_(cache.layers[layer].values)
        slot.mask.zero_()
        slot.mask[:n, 0, 0, :width] = attn.bool()
        slot.pos.zero_()
        slot.pos[:n] = next_pos
        self.arena.col.fill_(width)
        return GraphSteps(self, slot, n, width, lm, head)

    def _arena_for(self, cache, rows: int, cols: int) -> bool:
        """Make the arena hold ``rows`` × ``cols`` (reallocated larger when not; False past ``max_bytes``)."""
        first = cache.layers[0].keys
        _, heads, _, dim = first.shape
        shape = (len(cache.layers), heads, dim, first.dtype, first.device)
        arena = self.arena
        if arena is not None and arena.shape == shape and arena.rows >= rows and arena.cols >= cols:
            return True
        per_cell = 2 * len(cache.layers) * heads * dim * first.element_size()
        if arena is not None and arena.shape == shape:  # grown to hold both, else to hold this batch alone
            union = max(rows, arena.rows), max(cols, arena.cols)
            if union[0] * union[1] * per_cell <= self.max_bytes:
                rows, cols = union
        if rows * cols * per_cell > self.max_bytes:
            return False
        self.clear()  # the old arena's memory goes before the new one's comes
        zeros = [torch.zeros(rows, heads, cols, dim, dtype=first.dtype, device=first.device) for _ in cache.layers]
        self.arena = SimpleNamespace(
            keys=zeros,
            values=[torch.zeros_like(z) for z in zeros],
            col=torch.zeros(1, dtype=torch.long, device=first.device),
            shape=shape,
            rows=rows,
            cols=cols,
        )
        return True

    def _slot(self, rows: int, cols: int) -> Slot:
        """The slot of that shape, made if new; the least recently used goes past :data:`MAX_SLOTS` (each holds its
        graph's logits ``[B, V]`` fp32 and buffers; multi-turn prompts keep bringing new column counts)."""
        slot = self.slots.pop((rows, cols), None)
        if slot is None:
            assert self.arena is not None
            slot = Slot(self.arena, rows, cols)
            while len(self.slots) >= MAX_SLOTS:
                del self.slots[next(iter(self.slots))]
        self.slots[(rows, cols)] = slot  # last: the most recently used
        return slot

    def capture(self, slot: Slot, lm, head: Callable) -> None:
        """Record ``slot``'s step as a CUDA graph (after :data:`WARMUP` eager runs on a side stream, as CUDA
        graphs ask). The runs write keys / values at column ``col`` and unmask it: the column the next real step
        writes and unmasks anyway. ``thread_local``: another thread's CUDA work (a trainer) does not break it."""
        if slot.graph is not None or not slot.tokens.is_cuda:
            return
        device = slot.tokens.device
        # on the model's device (a thread's current device is cuda:0 unless set): captured elsewhere, the graph
        # would record nothing and every replay would return the capture run's logits
        with torch.cuda.device(device):
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                for _ in range(WARMUP):
                    slot.run(lm, head)
            torch.cuda.current_stream(device).wait_stream(side)
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            capture = torch.cuda.Stream(device)
            with torch.cuda.graph(graph, pool=self._pool, stream=capture, capture_error_mode="thread_local"):
                slot.logits = slot.run(lm, head)
        slot.graph = graph


class GraphSteps:
    """:class:`vlrl.engines.steps.Steps` on a slot: row ``i`` of the batch is the slot's row ``self.rows[i]``."""

    def __init__(self, graphs: DecodeGraphs, slot: Slot, n: int, width: int, lm, head: Callable):
        self.graphs, self.slot, self.lm, self.head = graphs, slot, lm, head
        self.rows = list(range(n))
        self.index: torch.Tensor | None = None  # the rows on the device; None while they are 0..n-1
        self.filled = width  # columns written: the prompt's, then one per step
        graphs.capture(slot, lm, head)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        slot, n = self.slot, len(self.rows)
        if self.filled >= slot.columns:
            raise RuntimeError(f"decode slot full: {slot.columns} columns written")
        if self.index is None:
            slot.tokens[:n].copy_(tokens)
        else:
            slot.tokens.index_copy_(0, self.index, tokens)
        logits = slot.step(self.lm, self.head)
        self.graphs.arena.col.add_(1)  # type: ignore[union-attr]
        slot.pos.add_(1)
        self.filled += 1
        # own tensors: the graph's output buffer is written again by the next replay
        return logits[:n].clone() if self.index is None else logits.index_select(0, self.index)

    def keep(self, rows: Sequence[int]) -> None:
        self.rows = [self.rows[i] for i in rows]
        n, slot = len(self.rows), self.slot
        if bucket(n) < slot.rows:
            self._move(bucket(n))
        else:  # rows 0..n-1 again (the last rows left) need no index: a stale one would not match the tokens
            self.index = None if self.rows == list(range(n)) else on_device(self.rows, slot.tokens.device)

    def _move(self, rows: int) -> None:
        """The remaining rows to the first rows of the arena and a slot of ``rows`` rows."""
        old, n = self.slot, len(self.rows)
        src = on_device(self.rows, old.tokens.device)
        for k, v in zip(old.kv.keys, old.kv.values):
            k[:n].copy_(k.index_select(0, src))
            v[:n].copy_(v.index_select(0, src))
        new = self.graphs._slot(rows, old.columns)
        new.mask.zero_()
        new.mask[:n] = old.mask.index_select(0, src)
        new.pos[:n] = old.pos.index_select(0, src)
        self.slot, self.rows, self.index = new, list(range(n)), None
        self.graphs.capture(new, self.lm, self.head)

    def kv_rows(self, rows: Sequence[int]) -> tuple[object, list[int]]:
        slot, filled = self.slot, self.filled
        layers = [
            SimpleNamespace(keys=k[:, :, :filled], values=v[:, :, :filled])
            for k, v in zip(slot.kv.keys, slot.kv.values)
        ]
        return SimpleNamespace(layers=layers), [self.rows[i] for i in rows]
