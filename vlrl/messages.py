"""OpenAI-format conversations: building image parts, checking what comes in, decoding images once.

The conversation is vlrl's source of truth. Images travel inside it as ``image_url`` parts holding
data URIs (PNG or JPEG); envs build them with :func:`image_part`. Every accepted image-part form
(below) is turned into that one canonical form by :func:`normalize_messages`, which both renderers
go through, and every image is decoded to the pixels the model receives by one function,
:func:`load_image` — the way the inference stack (vLLM) decodes, so both renderers see the same
pixels. Validation errors name the message and part index.

Accepted image parts: ``{"type": "image_url", "image_url": {"url": URI}}``, ``{"type": "image_url",
"image_url": URI}``, and ``{"type": "image", "image": PIL image | [H, W, 3] uint8 array | URI}`` (or
``"url": URI`` / ``"image_url": ...`` in place of ``"image"``). URIs must be ``data:`` URIs.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from vlrl.errors import BadInputError
from vlrl.image_decode import ImageLimits, canonical_uri, decode_data_uri, encode_png_or_jpeg, model_image
from vlrl.lru import LruBytes

__all__ = [
    "ROLES",
    "IMAGE_PART_TYPES",
    "TEXT_PART_TYPES",
    "SUPPORTED_IMAGE_FORMATS",
    "VISION_TOKENS",
    "TURN_TOKENS",
    "RESERVED_IN_TEXT",
    "ImageLimits",
    "PreparedMessages",
    "encode_image",
    "image_part",
    "text_part",
    "user_message",
    "load_image",
    "image_hash",
    "iter_parts",
    "as_list",
    "validate_messages",
    "prepare_messages",
    "normalize_messages",
]

ROLES = frozenset({"system", "user", "assistant", "tool"})
TEXT_PART_TYPES = frozenset({"text"})
IMAGE_PART_TYPES = frozenset({"image_url", "image"})
SUPPORTED_IMAGE_FORMATS = frozenset({"PNG", "JPEG"})

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")
"""Refused in any text: they would desynchronise images from their placeholders."""
TURN_TOKENS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
"""Refused outside assistant text: the tokenizer reads them as real turn boundaries, so env or user
text holding them could fake a turn. (An assistant turn is the model's own output, kept as generated.)"""
RESERVED_IN_TEXT = VISION_TOKENS  # the name the renderers imported before control tokens were checked too
_UNLIMITED = ImageLimits(max_pixels=1 << 62, max_aspect_ratio=float("inf"))  # encoding what an env drew


# ---------------------------------------------------------------- building


def encode_image(image: Image.Image | np.ndarray, fmt: str = "PNG") -> str:
    """A ``data:image/...;base64,`` URI of the pixels the model will see for ``image`` (PIL or
    ``[H, W, 3]`` uint8): PIL images are decoded like any other (EXIF orientation, transparency onto white)."""
    fmt = fmt.upper()
    if fmt not in SUPPORTED_IMAGE_FORMATS:
        raise BadInputError(f"cannot encode image as {fmt!r}; supported: {sorted(SUPPORTED_IMAGE_FORMATS)}")
    return encode_png_or_jpeg(model_image(image, "image", {}, _UNLIMITED), fmt)


def image_part(image: Image.Image | np.ndarray, fmt: str = "PNG") -> dict[str, Any]:
    """An OpenAI ``image_url`` content part carrying ``image`` as a data URI."""
    return {"type": "image_url", "image_url": {"url": encode_image(image, fmt)}}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def user_message(*parts: dict[str, Any] | str) -> dict[str, Any]:
    """A user message from parts; plain strings become text parts."""
    content = [text_part(p) if isinstance(p, str) else p for p in parts]
    return {"role": "user", "content": content}


# ---------------------------------------------------------------- reading images


def load_image(
    part: dict[str, Any],
    *,
    message_index: int | None = None,
    part_index: int | None = None,
    limits: ImageLimits = ImageLimits(),
) -> Image.Image:
    """Decode an image content part (any accepted form) into the RGB image the model receives, or
    raise :class:`BadInputError` naming the message and part."""
    return _decode_part(part, {"message_index": message_index, "part_index": part_index}, limits)[0]


def _decode_part(part: dict[str, Any], where: dict[str, int | None], limits: ImageLimits) -> tuple[Image.Image, str]:
    """``(model RGB image, canonical data URI)`` of an image part; the URI decodes to exactly that image."""
    image, uri, _ = _decode_hashed(part, where, limits)
    return image, uri


def _decode_hashed(
    part: dict[str, Any], where: dict[str, int | None], limits: ImageLimits, copy: bool = True
) -> tuple[Image.Image, str, str]:
    """:func:`_decode_part` and the image's :func:`image_hash`; a data URI decoded before comes from
    :data:`_DECODED`, as a copy (callers may change their image) unless ``copy`` is False (the caller only reads)."""
    payload = _payload(part, where)
    if not isinstance(payload, str):
        image = model_image(payload, "image part", where, limits)
        return image, encode_png_or_jpeg(image, "PNG"), image_hash(image)
    with _DECODED_LOCK:
        hit = _DECODED.get((payload, limits))
    if hit is None:
        image, source = decode_data_uri(payload, limits, where)
        hit = (image, canonical_uri(payload, source, image), image_hash(image))
        with _DECODED_LOCK:
            _DECODED.put((payload, limits), hit, image.width * image.height * len(image.getbands()))
    return (hit[0].copy() if copy else hit[0]), hit[1], hit[2]


_DECODED: LruBytes[tuple[Image.Image, str, str]] = LruBytes(256 * 2**20)
"""Data URIs decoded before: ``(URI, limits) -> (image, canonical URI, pixel hash)``, bounded by the images' pixel
bytes. An episode sends every earlier image again each turn, and decoding and hashing them again made a turn's
render grow with its history: 8 expert episodes of maze2d/easy (156 turns) decoded 1,618 PNGs and hashed 3,236
images (``benchmarks/expert_render.py``). Python keeps a string's hash, so each earlier image costs a dict lookup."""
_DECODED_LOCK = threading.Lock()  # renders run on several threads (EmbeddedRenderer workers)


def forget_decoded() -> None:
    """Empty the decoded-URI cache: for a process whose next conversations share no image with the last ones (a
    farm worker between batches of fresh mazes), up to 256 MiB of pixels it would keep for nothing."""
    with _DECODED_LOCK:
        _DECODED.clear()


def _payload(part: dict[str, Any], where: dict[str, int | None]) -> Any:
    if part.get("type") == "image_url":
        spec = part.get("image_url")
        url = spec.get("url") if isinstance(spec, dict) else spec
        if not isinstance(url, str):
            raise BadInputError("image_url part has no 'url' string", **where)
        return url
    for key in ("image", "url", "image_url"):
        value = part.get(key)
        if isinstance(value, dict):
            value = value.get("url")
        if value is not None:
            return value
    raise BadInputError("image part has no 'image' value", **where)


def image_hash(image: Image.Image) -> str:
    """sha256 over the decoded RGB pixels and the size: equal pixels, equal hash, whatever the encoding.
    Give it what :func:`load_image` returns (the pixels the model receives)."""
    h = hashlib.sha256(f"{image.width}x{image.height}:".encode())
    h.update(image.convert("RGB").tobytes())
    return h.hexdigest()


def iter_parts(messages: list[dict[str, Any]]) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """Yield ``(message_index, part_index, part)`` over list contents (string contents yield nothing)."""
    for mi, msg in enumerate(messages):
        content = msg.get("content")
        if isinstance(content, list):
            for pi, part in enumerate(content):
                yield mi, pi, part


# ---------------------------------------------------------------- validation


def as_list(messages: Any) -> Any:
    """``list(messages)`` for a renderer's sequence argument, except a dict or str, left for
    :func:`validate_messages` to refuse (``list`` of a dict is its keys: "message 0 is a str")."""
    return messages if isinstance(messages, (dict, str)) else list(messages)


def validate_messages(messages: Any) -> None:
    """Check roles, content shapes, part types and reserved tokens in text; raise :class:`BadInputError`
    naming the culprit. Images are checked for shape here, decoded by :func:`load_image`."""
    if isinstance(messages, (dict, str)):  # a lone message (or its text) where a conversation belongs
        hint = " (one message? pass [message])" if isinstance(messages, dict) else ""
        raise BadInputError(f"messages must be a list of message dicts, got a {type(messages).__name__}{hint}")
    if not isinstance(messages, list) or not messages:
        raise BadInputError(f"messages must be a non-empty list of message dicts, got {type(messages).__name__}")
    for mi, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise BadInputError(f"message is a {type(msg).__name__}, not a dict", message_index=mi)
        role = msg.get("role")
        if role not in ROLES:
            raise BadInputError(f"unknown role {role!r}; expected one of {sorted(ROLES)}", message_index=mi)
        content = msg.get("content")
        if content is None and role == "assistant" and msg.get("tool_calls"):
            continue
        if isinstance(content, str):
            _check_text(content, role, mi, None)
            continue
        if not isinstance(content, list):
            raise BadInputError(
                f"content must be a string or a list of parts, got {type(content).__name__}", message_index=mi
            )
        for pi, part in enumerate(content):
            _validate_part(part, role, mi, pi)


def _validate_part(part: Any, role: str, mi: int, pi: int) -> None:
    if not isinstance(part, dict):
        raise BadInputError(f"content part is a {type(part).__name__}, not a dict", message_index=mi, part_index=pi)
    kind = part.get("type")
    if kind in TEXT_PART_TYPES:
        if not isinstance(part.get("text"), str):
            raise BadInputError("text part has no 'text' string", message_index=mi, part_index=pi)
        _check_text(part["text"], role, mi, pi)
    elif kind not in IMAGE_PART_TYPES:
        allowed = sorted(TEXT_PART_TYPES | IMAGE_PART_TYPES)
        raise BadInputError(
            f"unsupported content part type {kind!r}; expected one of {allowed}", message_index=mi, part_index=pi
        )


def _check_text(text: str, role: str, mi: int, pi: int | None) -> None:
    for token in VISION_TOKENS:
        if token in text:
            raise BadInputError(
                f"text contains the reserved vision token {token!r}; images must be image parts, not placeholder text",
                message_index=mi,
                part_index=pi,
            )
    if role == "assistant":
        return
    for token in TURN_TOKENS:
        if token in text:
            raise BadInputError(
                f"{role} text contains the control token {token!r}, which the tokenizer reads "
                "as a real turn boundary; remove it from the text",
                message_index=mi,
                part_index=pi,
            )


# ---------------------------------------------------------------- normalising


@dataclass(frozen=True)
class PreparedMessages:
    """A validated conversation in canonical form, with its images decoded once.

    messages: every image part is ``{"type": "image_url", "image_url": {"url": <data URI>}}`` whose
        bytes decode (by any decoder: plain RGB PNG or JPEG, no orientation tag, no alpha) to exactly
        the matching entry of ``images``; everything else is as given.
    images: the RGB images the model receives, in conversation order.
    """

    messages: list[dict[str, Any]]
    images: tuple[Image.Image, ...]
    hashes: tuple[str, ...]
    """:func:`image_hash` of each of ``images``."""


def prepare_messages(
    messages: Any, *, limits: ImageLimits = ImageLimits(), copy_images: bool = True
) -> PreparedMessages:
    """Validate ``messages`` and decode every image once; see :class:`PreparedMessages`. ``copy_images=False``: the
    images may be the decoded-URI cache's own (a renderer that only reads them: each turn of an episode sends every
    earlier frame again, and the renderer processes only the ones it has not seen)."""
    validate_messages(messages)
    out, images, hashes = [], [], []
    for mi, msg in enumerate(messages):
        content = msg.get("content")
        if not isinstance(content, list):
            out.append(dict(msg))
            continue
        parts = []
        for pi, part in enumerate(content):
            if part["type"] in IMAGE_PART_TYPES:
                image, uri, key = _decode_hashed(part, {"message_index": mi, "part_index": pi}, limits, copy_images)
                images.append(image)
                hashes.append(key)
                parts.append({"type": "image_url", "image_url": {"url": uri}})
            else:
                parts.append(part)
        out.append({**msg, "content": parts})
    return PreparedMessages(out, tuple(images), tuple(hashes))


def normalize_messages(messages: Any, *, limits: ImageLimits = ImageLimits()) -> list[dict[str, Any]]:
    """``messages`` with every accepted image-part form turned into the canonical ``image_url`` data-URI
    part (see :class:`PreparedMessages`), validated (roles, parts, reserved and control tokens, image
    bytes and limits); raises :class:`BadInputError` naming message and part. The input is not modified."""
    return prepare_messages(messages, limits=limits).messages
