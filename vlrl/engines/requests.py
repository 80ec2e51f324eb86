"""One request's state while the embedded engine decodes it, and when it stops (host side, a token at a time).

Stops, in this order after each sampled token: a stop token id or (unless ``ignore_eos``) an end-of-sequence id;
a stop string in the decoded text (the tokens after it cut, and it too unless ``include_stop_str_in_output``);
``max_new`` tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

from vlrl.engines.types import FinishReason, Generation, SamplingParams
from vlrl.errors import ContextOverflowError
from vlrl.render.types import RenderedPrompt


@dataclass
class DecodeRequest:
    """One request's state while it decodes."""

    prompt: RenderedPrompt
    params: SamplingParams
    max_new: int
    future: Future
    ids: list[int] = field(default_factory=list)
    sampled: list[int] = field(default_factory=list)  # every sampled token, even those a stop string cuts
    logprobs: list[float] = field(default_factory=list)
    top: list[tuple[tuple[int, float], ...]] = field(default_factory=list)
    finish: Generation | None = None

    @classmethod
    def checked(
        cls, prompt: RenderedPrompt, params: SamplingParams, max_context: int, banned: set[int]
    ) -> DecodeRequest:
        """A new request, or the error that names why ``prompt`` cannot be decoded: empty, no room left in
        ``max_context``, or a stop token id that is a vision placeholder (``banned``: those are never sampled)."""
        n = len(prompt.token_ids)
        if n == 0:
            raise ValueError("empty prompt")
        if n >= max_context:
            raise ContextOverflowError(n, max_context)
        bad = banned.intersection(params.stop_token_ids)
        if bad:
            raise ValueError(f"stop_token_ids {sorted(bad)} are vision placeholder ids, which are never sampled")
        return cls(prompt=prompt, params=params, max_new=min(params.max_tokens, max_context - n), future=Future())

    def record(
        self, token: int, logprob: float, top: tuple, *, tokenizer, eos_ids: Sequence[int], version: int
    ) -> bool:
        """Record one sampled token; returns True while the request goes on (else ``finish`` is set)."""
        self.ids.append(token)
        self.sampled.append(token)
        self.logprobs.append(logprob)
        self.top.append(top)
        p = self.params
        if token in p.stop_token_ids or (not p.ignore_eos and token in eos_ids):
            return self._finish("stop", token, tokenizer, version)
        if p.stop:
            text = tokenizer.decode(self.ids, skip_special_tokens=True)
            for s in p.stop:
                at = text.find(s)
                if at >= 0:
                    if not p.include_stop_str_in_output:
                        self._cut_before(at, tokenizer)
                    return self._finish("stop", s, tokenizer, version)
        if len(self.ids) >= self.max_new:
            return self._finish("length", None, tokenizer, version)
        return True

    def _cut_before(self, char_index: int, tokenizer) -> None:
        """Drop tokens from the end until the decoded text ends at or before ``char_index``."""
        while self.ids and len(tokenizer.decode(self.ids, skip_special_tokens=True)) > char_index:
            self.ids.pop()
            self.logprobs.pop()
            self.top.pop()

    def _finish(self, reason: FinishReason, stop_reason: str | int | None, tokenizer, version: int) -> bool:
        self.finish = Generation(
            token_ids=tuple(self.ids),
            logprobs=tuple(self.logprobs),
            finish_reason=reason,
            stop_reason=stop_reason,
            text=tokenizer.decode(self.ids, skip_special_tokens=True),
            weight_version=version,
            prompt_len=len(self.prompt.token_ids),
            top_logprobs=tuple(self.top) if self.params.logprobs_topk else (),
        )
        return False
