"""The logprob and stop contract on vLLM, shared by both vLLM engines (over HTTP: ``vlrl.vllm.engine``; in this
process: ``vlrl.vllm.inprocess``): one place that turns vlrl's ``SamplingParams`` into vLLM's, and vLLM's answer
back into a :class:`vlrl.engines.types.Generation` (why each field is set so: ``vlrl.vllm.engine``'s docstring)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vlrl.engines.types import Generation, SamplingParams
from vlrl.errors import ContextOverflowError
from vlrl.render.types import RenderedPrompt
from vlrl.vllm.config import BAN_KEY


def truncates(params: SamplingParams) -> bool:
    """top-k / top-p / min-p at T > 0: vLLM's processed logprobs are then renormalised over the kept set."""
    return params.temperature > 0 and (params.top_k > 0 or params.top_p < 1.0 or params.min_p > 0.0)


def sampling_fields(
    params: SamplingParams,
    *,
    prompt_len: int,
    max_context: int,
    banned_ids: Sequence[int],
    allow_truncation: bool,
    ban_words: Sequence[str] | None = None,
    reports_logprobs: bool = True,
) -> dict[str, Any]:
    """vLLM's ``SamplingParams`` fields for one request (a generate body's ``sampling_params``, or
    ``vllm.SamplingParams(**fields)``); raises on an empty or too long prompt, a vision id as a stop token, or
    truncation not allowed. The ban goes as ``extra_args`` for vlrl's logits processor (``vlrl.vllm.ban``), or
    with ``ban_words`` (:func:`bad_words_for`; in process ``vlrl.vllm.ban.ban_as_bad_words``) as vLLM's
    ``bad_words``. ``reports_logprobs=False``:
    vLLM reports no logprobs for the sampled tokens alone (``vlrl.vllm.sampled_logprobs`` keeps them); a top k
    is still asked of it."""
    if prompt_len == 0:
        raise ValueError("empty prompt")
    if prompt_len >= max_context:
        raise ContextOverflowError(prompt_len, max_context)
    bad = set(banned_ids).intersection(params.stop_token_ids)
    if bad:
        raise ValueError(f"stop_token_ids {sorted(bad)} are vision placeholder ids, which are never sampled")
    if truncates(params) and not allow_truncation:
        raise ValueError(
            "top_k/top_p/min_p: vLLM reports logprobs renormalised after truncation, which breaks "
            "the logprob contract; build the engine with allow_truncation=True to accept that"
        )
    return {
        "temperature": float(params.temperature),
        "top_p": float(params.top_p),
        "top_k": int(params.top_k),
        "min_p": float(params.min_p),
        "max_tokens": min(params.max_tokens, max_context - prompt_len),
        "seed": params.seed,
        "stop": list(params.stop),
        "stop_token_ids": list(params.stop_token_ids),
        "ignore_eos": params.ignore_eos,
        "include_stop_str_in_output": True,
        # 0: the sampled token's alone; else the sampled token and the top k (see vlrl.vllm.engine)
        "logprobs": params.logprobs_topk + 1 if params.logprobs_topk else (0 if reports_logprobs else None),
        "detokenize": bool(params.stop),
        "skip_special_tokens": True,
        **ban_fields(banned_ids, ban_words),
    }


def ban_fields(banned_ids: Sequence[int], ban_words: Sequence[str] | None = None) -> dict[str, Any]:
    """The vision-token ban as vLLM sampling-params fields: ``extra_args`` for vlrl's logits processor, or
    ``ban_words`` (the ids' text) as vLLM's ``bad_words``."""
    return {"bad_words": list(ban_words)} if ban_words is not None else {"extra_args": {BAN_KEY: list(banned_ids)}}


def bad_words_for(tokenizer, ids: Sequence[int]) -> list[str]:
    """``ids`` as vLLM's ``bad_words``, checked with ``tokenizer`` (the served checkpoint's, which a server
    tokenizes them back with): each id's text, left-stripped as vLLM does, must come back as that id alone, or it
    would not be banned by itself (stricter than vLLM, which may also ban a space-prefixed form). The in-process
    engine checks with vLLM's own tokenization instead (``vlrl.vllm.ban.ban_as_bad_words``)."""
    words = [tokenizer.decode([i]) for i in ids]
    apart = [i for i, w in zip(ids, words) if tokenizer.encode(w.lstrip(), add_special_tokens=False) != [i]]
    if apart:
        raise ValueError(f"bad_words would not ban token ids {apart} alone (their text re-tokenizes apart)")
    return words


def bans_alone(tokenizer, token: int) -> bool:
    """Whether ``token``'s text, as ``bad_words``, bans it by itself (:func:`bad_words_for`): the ban probes pick such
    a token."""
    try:
        bad_words_for(tokenizer, [token])
    except ValueError:
        return False
    return True


def cut_before_stop(tokenizer, ids: list[int], lps: list[float], stop: str) -> tuple[list[int], list[float]]:
    """``include_stop_str_in_output=False``: the whole tokens that end before ``stop`` (the embedded engine's rule)."""
    at = tokenizer.decode(ids, skip_special_tokens=True).find(stop)
    while ids and at >= 0 and len(tokenizer.decode(ids, skip_special_tokens=True)) > at:
        ids, lps = ids[:-1], lps[:-1]
    return ids, lps


def finished(
    tokenizer,
    prompt: RenderedPrompt,
    params: SamplingParams,
    *,
    ids: list[int],
    lps: list[float],
    top: tuple,
    reason: object,
    stop_reason: object,
    weight_version: int,
    meta: dict[str, Any],
    where: str,
) -> Generation:
    """The :class:`Generation` of one finished vLLM request: ``reason`` must be ``stop`` or ``length``; eos is
    reported as the stop token (as the embedded engine does); a stop string is cut unless asked to keep it."""
    from vlrl.vllm.config import VllmServerError

    if reason not in ("stop", "length"):
        raise VllmServerError(f"{where}: generation ended with finish_reason {reason!r} (aborted by vLLM?)")
    if reason == "stop" and stop_reason is None and ids:
        stop_reason = ids[-1]  # eos, reported like the embedded engine
    if isinstance(stop_reason, str) and not params.include_stop_str_in_output:
        ids, lps = cut_before_stop(tokenizer, ids, lps, stop_reason)
        top = top[: len(ids)]
    if truncates(params):
        meta["logprobs"] = "truncated"
    return Generation(
        token_ids=tuple(ids),
        logprobs=tuple(lps),
        finish_reason=reason,
        stop_reason=stop_reason,  # type: ignore[arg-type]  # str | int | None, checked by vLLM's answer
        text=tokenizer.decode(ids, skip_special_tokens=True),
        weight_version=weight_version,
        prompt_len=len(prompt.token_ids),
        meta=meta,
        top_logprobs=top,
    )
