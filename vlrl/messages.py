"""OpenAI-format conversations: building image parts and checking what comes in.

The conversation is vlrl's source of truth. Images travel inside it as ``image_url`` parts
holding data URIs (PNG or JPEG); envs build them with :func:`image_part`, the renderer reads
them back with :func:`load_image`. Validation errors name the message and part index.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
from PIL import Image, UnidentifiedImageError

from vlrl.errors import BadInputError

ROLES = frozenset({"system", "user", "assistant", "tool"})
TEXT_PART_TYPES = frozenset({"text"})
IMAGE_PART_TYPES = frozenset({"image_url", "image"})
SUPPORTED_IMAGE_FORMATS = frozenset({"PNG", "JPEG"})
_MIME = {"PNG": "image/png", "JPEG": "image/jpeg"}


@dataclass(frozen=True)
class ImageLimits:
    """Bounds an incoming image must respect. ``max_pixels`` is width × height before resizing."""

    max_pixels: int = 4096 * 4096
    max_data_uri_bytes: int = 64 * 1024 * 1024


# ---------------------------------------------------------------- building


def encode_image(image: Image.Image | np.ndarray, fmt: str = "PNG") -> str:
    """Return a ``data:image/...;base64,`` URI for an RGB image (PIL or ``[H, W, 3]`` uint8)."""
    fmt = fmt.upper()
    if fmt not in SUPPORTED_IMAGE_FORMATS:
        raise BadInputError(f"cannot encode image as {fmt!r}; supported: {sorted(SUPPORTED_IMAGE_FORMATS)}")
    pil = _as_pil(image, "image")
    buf = io.BytesIO()
    pil.save(buf, format=fmt)
    return f"data:{_MIME[fmt]};base64,{base64.b64encode(buf.getvalue()).decode('ascii')}"


def image_part(image: Image.Image | np.ndarray, fmt: str = "PNG") -> dict[str, Any]:
    """An OpenAI ``image_url`` content part carrying ``image`` as a data URI."""
    return {"type": "image_url", "image_url": {"url": encode_image(image, fmt)}}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def user_message(*parts: dict[str, Any] | str) -> dict[str, Any]:
    """A user message from parts; plain strings become text parts."""
    content = [text_part(p) if isinstance(p, str) else p for p in parts]
    return {"role": "user", "content": content}


# ---------------------------------------------------------------- reading


def load_image(part: dict[str, Any], *, message_index: int | None = None, part_index: int | None = None,
               limits: ImageLimits = ImageLimits()) -> Image.Image:
    """Decode an image content part into an RGB PIL image, or raise :class:`BadInputError`.

    Accepts ``{"type": "image_url", "image_url": {"url": "data:..."}}`` (or ``"image_url": "data:..."``),
    and ``{"type": "image", "image": <PIL image | RGB array | data URI>}``.
    """
    where = {"message_index": message_index, "part_index": part_index}
    if part.get("type") == "image_url":
        spec = part.get("image_url")
        url = spec.get("url") if isinstance(spec, dict) else spec
        if not isinstance(url, str):
            raise BadInputError("image_url part has no 'url' string", **where)
        return _decode_data_uri(url, limits, where)
    payload = part.get("image")
    if isinstance(payload, str):
        return _decode_data_uri(payload, limits, where)
    if payload is None:
        raise BadInputError("image part has no 'image' value", **where)
    pil = _as_pil(payload, "image part", where)
    _check_size(pil, limits, where)
    return pil


def image_hash(image: Image.Image) -> str:
    """sha256 over the decoded RGB pixels and the size: equal pixels, equal hash, whatever the encoding."""
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


def validate_messages(messages: Any) -> None:
    """Check roles, content shapes and part types; raise :class:`BadInputError` naming the culprit.

    Images are checked for shape here, decoded by :func:`load_image`.
    """
    if not isinstance(messages, list) or not messages:
        raise BadInputError(f"messages must be a non-empty list, got {type(messages).__name__}")
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
            continue
        if not isinstance(content, list):
            raise BadInputError(f"content must be a string or a list of parts, got {type(content).__name__}",
                                message_index=mi)
        for pi, part in enumerate(content):
            _validate_part(part, mi, pi)


def _validate_part(part: Any, mi: int, pi: int) -> None:
    if not isinstance(part, dict):
        raise BadInputError(f"content part is a {type(part).__name__}, not a dict", message_index=mi, part_index=pi)
    kind = part.get("type")
    if kind in TEXT_PART_TYPES:
        if not isinstance(part.get("text"), str):
            raise BadInputError("text part has no 'text' string", message_index=mi, part_index=pi)
    elif kind not in IMAGE_PART_TYPES:
        allowed = sorted(TEXT_PART_TYPES | IMAGE_PART_TYPES)
        raise BadInputError(f"unsupported content part type {kind!r}; expected one of {allowed}",
                            message_index=mi, part_index=pi)


def _decode_data_uri(url: str, limits: ImageLimits, where: dict[str, int | None]) -> Image.Image:
    if not url.startswith("data:"):
        raise BadInputError(f"image url must be a data URI (data:image/...;base64,...), got {url[:40]!r}", **where)
    if len(url) > limits.max_data_uri_bytes:
        raise BadInputError(f"image data URI is {len(url)} bytes, over the limit of {limits.max_data_uri_bytes}",
                            **where)
    header, sep, payload = url.partition(",")
    if not sep or not header.endswith(";base64"):
        raise BadInputError(f"malformed data URI header {header[:60]!r}: expected 'data:<mime>;base64,'", **where)
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BadInputError(f"data URI payload is not valid base64 ({exc})", **where) from None
    try:
        pil = Image.open(io.BytesIO(raw))
        fmt = pil.format
        if fmt not in SUPPORTED_IMAGE_FORMATS:
            raise BadInputError(f"unsupported image format {fmt!r}; supported: {sorted(SUPPORTED_IMAGE_FORMATS)}",
                                **where)
        _check_size(pil, limits, where)  # before decoding pixels: a decompression bomb stops here
        pil.load()
    except BadInputError:
        raise
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise BadInputError(f"image bytes could not be decoded (truncated or corrupt?): {exc}", **where) from None
    return pil.convert("RGB")


def _as_pil(image: Any, what: str, where: dict[str, int | None] | None = None) -> Image.Image:
    where = where or {}
    if isinstance(image, Image.Image):
        return image.convert("RGB")
    if isinstance(image, np.ndarray):
        if image.ndim != 3 or image.shape[2] != 3:
            raise BadInputError(f"{what} array must be [H, W, 3], got shape {tuple(image.shape)}", **where)
        if image.shape[0] == 0 or image.shape[1] == 0:
            raise BadInputError(f"{what} is empty: shape {tuple(image.shape)}", **where)
        if image.dtype != np.uint8:
            raise BadInputError(f"{what} array must be uint8, got {image.dtype}", **where)
        return Image.fromarray(image, mode="RGB")
    raise BadInputError(f"{what} must be a PIL image, an RGB uint8 array or a data URI, got {type(image).__name__}",
                        **where)


def _check_size(pil: Image.Image, limits: ImageLimits, where: dict[str, int | None]) -> None:
    w, h = pil.size
    if w == 0 or h == 0:
        raise BadInputError(f"image has zero size ({w}x{h})", **where)
    if w * h > limits.max_pixels:
        raise BadInputError(f"image is {w}x{h} = {w * h} pixels, over the budget of {limits.max_pixels}", **where)
