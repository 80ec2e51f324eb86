"""The embedded engine's decode steps after the prefill: one token per batch row per step.

Two implementations of one contract (:class:`Steps`), chosen per batch by ``EmbeddedEngine``:

- :class:`DynamicSteps` (any device): the model's forward on transformers' ``DynamicCache``, the mask and the
  cache grown by a column a step, finished rows cut out of both.
- ``vlrl.engines.graphs.GraphSteps`` (CUDA): the same layers over preallocated keys / values, one CUDA graph
  replay a step.

Both feed the layers the same mask (the prompt's columns, then one per fed token), the same mRoPE positions (text
after a prompt continues on all three axes) and the same LM head, so a row's logits are those of the other up to
kernel order (``tests/foundation/test_graph_steps.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from vlrl.engines.sampling import on_device


class Steps(Protocol):
    """Decode state of one batch after its prefill; rows are the requests still decoding, in batch order."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed each row its token ``[R]`` -> the next logits ``[R, V]`` fp32 (a tensor of its own)."""
        ...

    def keep(self, rows: Sequence[int]) -> None:
        """Only ``rows`` (positions in the current rows, ascending) go on decoding."""
        ...

    def kv_rows(self, rows: Sequence[int]) -> tuple[object, list[int]]:
        """For ``vlrl.engines.reuse.prefix_entries``: a cache whose ``layers[l].keys`` / ``.values``
        ``[N, H_kv, T, D]`` end with every fed column, and the index in it of each of ``rows``."""
        ...


class DynamicSteps:
    """Decode steps through the model's own forward on transformers' ``DynamicCache`` (the eager path)."""

    def __init__(self, model, head: Callable, cache, attn: torch.Tensor, next_pos: torch.Tensor):
        """``cache``: the prefill's; ``attn`` ``[B, W]`` its mask; ``next_pos`` ``[B]`` each row's next position."""
        self.model, self.head, self.cache, self.attn, self.next_pos = model, head, cache, attn, next_pos

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        self.attn = torch.cat([self.attn, torch.ones_like(self.attn[:, :1])], dim=1)
        pos = self.next_pos.view(1, -1, 1).expand(3, -1, 1)
        hidden = self.model.model(
            input_ids=tokens[:, None], attention_mask=self.attn, position_ids=pos, past_key_values=self.cache
        ).last_hidden_state
        self.next_pos = self.next_pos + 1
        return self.head(hidden[:, -1])

    def keep(self, rows: Sequence[int]) -> None:
        idx = on_device(rows, self.attn.device)
        self.cache.batch_select_indices(idx)
        self.attn, self.next_pos = self.attn[idx], self.next_pos[idx]

    def kv_rows(self, rows: Sequence[int]) -> tuple[object, list[int]]:
        return self.cache, list(rows)


def to_host(*tensors: torch.Tensor) -> Callable[[], list[list]]:
    """Queue device-to-host copies of a step's ``tensors`` (tokens, logprobs, ...) now; the function returned
    waits for those copies only, not for work queued after them (the engine's next forward), and gives each tensor
    as a list. On a CPU the lists are made when it is called."""
    if not tensors[0].is_cuda:
        return lambda: [t.tolist() for t in tensors]
    host = [t.to("cpu", non_blocking=True) for t in tensors]  # pinned outputs: the copies run in stream order
    copied = torch.cuda.Event()
    copied.record(torch.cuda.current_stream(tensors[0].device))  # their device's stream, not the thread's default

    def read() -> list[list]:
        copied.synchronize()
        return [h.tolist() for h in host]

    return read
