"""The vision-placeholder ban inside vLLM: a logits processor the server loads (``--logits-processors``).

A request lists the token ids it may never sample in ``sampling_params.extra_args["vlrl_ban"]``; each decoding
step sets those logits to -inf, for every such request at once (one ``index_put_``), before temperature and before
vLLM computes its processed logprobs — where vLLM's ``bad_words`` acts, so the reported logprobs are normalised over
the vocabulary without those ids, as the logprob contract's (``vlrl.engines.types``).

Why not ``bad_words`` by default: vLLM's model runner V1 applies bad words in Python, one banned token of one
request at a time, each a slice assignment (a kernel launch on a GPU): the engine's every step pays requests ×
banned ids of them, 256 at 64 requests and 1,024 at 256, serialised with the model's step. Measured on an H100 (2b
bf16, 64 fresh image requests, one timing each): the generate of vlrl's bodies 4.56 s, 3.59 s with ``bad_words``
left out (benchmarks/results/vllm_gpu_h100/NOTE.md, run 22). Its runner V2 applies them on the GPU in one kernel, and
runs only without custom logits processors (vLLM 0.26): the in-process engine's ``ban="bad_words"`` sends the ban
so (:func:`ban_as_bad_words`); :func:`check_ban_applied` checks either form at its start.

Loaded by the server's engine core (and by its API process, which validates ``extra_args``), which the engine names
by ``vlrl.vllm.server.BAN_PROCESSOR``; this module imports vLLM and torch, so only code that has vLLM up imports it
(the in-process engine, after its start).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from vlrl.vllm.contract import bans_alone
from vlrl.vllm.server import BAN_KEY

if TYPE_CHECKING:
    from vllm import SamplingParams
    from vllm.config import VllmConfig


class VisionBan(LogitsProcessor):
    """Bans each request's ``extra_args["vlrl_ban"]`` ids (ids past the vocabulary cannot be sampled: dropped)."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool):
        self.vocab = vllm_config.model_config.get_vocab_size()
        self.device, self.pin = device, is_pin_memory
        self.bans: dict[int, tuple[int, ...]] = {}
        """Row of the persistent batch -> the ids that row bans (rows without a ban are absent)."""
        self.where = (self._index([]), self._index([]))
        self.neg_inf = torch.tensor(float("-inf"), dtype=torch.float32, device=device)

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        ids = (sampling_params.extra_args or {}).get(BAN_KEY)
        if ids is None:
            return
        if not isinstance(ids, list) or not all(type(i) is int and i >= 0 for i in ids):
            raise ValueError(f"extra_args[{BAN_KEY!r}] must be a list of token ids (ints >= 0), got {str(ids)[:120]}")

    def is_argmax_invariant(self) -> bool:
        return False  # a banned token may be the argmax: greedy sampling changes too

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if process_dict_updates(self.bans, batch_update, self._ban_of):
            rows = [r for r, ids in self.bans.items() for _ in ids]
            cols = [i for ids in self.bans.values() for i in ids]
            self.where = (self._index(rows), self._index(cols))

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits``: [rows of the batch, vocab], modified in place."""
        if self.bans:
            logits.index_put_(self.where, self.neg_inf)
        return logits

    def _ban_of(self, params: SamplingParams, _prompt, _output) -> tuple[int, ...] | None:
        ids = (params.extra_args or {}).get(BAN_KEY)
        kept = tuple(sorted({i for i in ids if i < self.vocab})) if ids else ()
        return kept or None

    def _index(self, values: list[int]) -> torch.Tensor:
        # pinned + non_blocking: no host sync in the engine's step
        t = torch.tensor(values, dtype=torch.long, pin_memory=self.pin and self.device.type != "cpu")
        return t.to(self.device, non_blocking=True)


def ban_as_bad_words(tokenizer, ids: tuple[int, ...]) -> list[str]:
    """The ban as vLLM's ``bad_words`` (each id's text, which vLLM tokenizes back with ``tokenizer``, vLLM's own:
    ``LLM.get_tokenizer()``): the public route, which vLLM's
    model runner V2 applies on the GPU in one kernel, where a custom logits processor keeps vLLM 0.26 on runner V1.
    Raises unless vLLM's own tokenization of them bans each id by itself (a text that comes back as several tokens
    would ban that sequence only)."""
    from vllm import SamplingParams

    words = [tokenizer.decode([i]) for i in ids]
    probe = SamplingParams(bad_words=words)
    probe.update_from_tokenizer(tokenizer)
    single = {tuple(t) for t in probe.bad_words_token_ids or []}
    missing = [i for i in ids if (i,) not in single]
    if missing:
        raise ValueError(f"vLLM's bad_words would not ban token ids {missing} alone (their text re-tokenizes apart)")
    return words


def check_ban_applied(engine) -> None:
    """``engine`` (:class:`vlrl.vllm.inprocess.InprocessVllmEngine`) has vLLM apply its ban, however it is sent:
    a token the model's greedy step ranks first (with the logits processor) or in its top 19 (with ``bad_words``,
    the first whose text comes back as itself alone), banned, must leave the top of that step."""
    from vlrl.engines.types import SamplingParams as Sampling
    from vlrl.render.types import RenderedPrompt
    from vlrl.vllm.config import VllmServerError

    prompt = RenderedPrompt(tuple(engine.tokenizer.encode("Hi", add_special_tokens=False)), None, None, (), ())
    greedy = Sampling(temperature=0.0, max_tokens=1, ignore_eos=True, logprobs_topk=19)  # vLLM: at most 20

    def top() -> list[int]:
        return [t for t, _ in engine.generate([prompt], greedy)[0].top_logprobs[0]]

    first = top()
    can_ban = [t for t in first if engine.ban != "bad_words" or bans_alone(engine.llm.get_tokenizer(), t)]
    if not can_ban:
        raise VllmServerError(f"no token of the probe's top {len(first)} can be banned by bad_words alone")
    pick = can_ban[0]
    banned, engine.banned_ids = engine.banned_ids, (pick,)
    try:
        again = top()
    finally:
        engine.banned_ids = banned
    if pick in again:
        raise VllmServerError(f"the in-process vLLM ignores vlrl's vision-token ban ({engine.ban})")
