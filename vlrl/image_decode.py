"""Decoding an image into the pixels the model receives: the one decoder of vlrl (see ``vlrl.messages``).

It follows the inference stack, vLLM's ``ImageMediaIO.load_bytes`` (``vllm/multimodal/media/image.py``
and ``vllm/multimodal/image.py`` in vllm 0.32), step for step:

1. the EXIF orientation is applied (``ImageOps.exif_transpose``; a broken EXIF block is ignored, as
   vLLM's ``normalize_image`` suppresses its errors) — a 90° tag swaps width and height;
2. to RGB: RGB stays; RGBA is pasted onto white through its alpha; any other mode carrying
   transparency (LA, PA, or a ``transparency`` entry: palette or grey tRNS) goes to RGBA and onto
   white; the rest is ``convert("RGB")``.

One deliberate difference: 16-bit greyscale (``I;16*``, and PNG's 16-bit ``I``) is scaled to 8 bits
(the high byte) instead of PIL's ``convert`` clipping everything above 255 to white; 32-bit float
images are refused. Images whose bytes a plain decoder would read differently (any of the above
applied) get a canonical URI: a PNG of the decoded RGB pixels, so vLLM and the embedded renderer
decode the same pixels from it by construction.

Limits (:class:`ImageLimits`) are checked on the header, before any pixel is decoded, so a
decompression bomb is refused cheaply; PIL's own bomb error and warning become the same refusal.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import io
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from vlrl.errors import BadInputError

_FORMATS = ("PNG", "JPEG")
_MIME = {"PNG": "image/png", "JPEG": "image/jpeg"}
_ORIENTATION = 0x0112
_SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N", "I")


@dataclass(frozen=True)
class ImageLimits:
    """Bounds an incoming image must respect. ``max_pixels`` is width × height before resizing."""

    max_pixels: int = 4096 * 4096
    max_data_uri_bytes: int = 64 * 1024 * 1024
    max_aspect_ratio: float = 200.0
    """Longest over shortest side. Qwen's ``smart_resize`` (transformers and vLLM) raises a bare
    ValueError above 200, from inside the processor where no message or part is known."""


Where = dict[str, "int | None"]


def decode_data_uri(url: str, limits: ImageLimits, where: Where) -> tuple[Image.Image, bool]:
    """``(model RGB image, plain)``; ``plain``: the bytes decode to these pixels with no orientation,
    transparency or bit-depth handling, so the URI can travel as it is."""
    if not url.startswith("data:"):
        raise BadInputError(f"image url must be a data URI (data:image/...;base64,...), got {url[:40]!r}", **where)
    if len(url) > limits.max_data_uri_bytes:
        raise BadInputError(
            f"image data URI is {len(url)} bytes, over the limit of {limits.max_data_uri_bytes}", **where
        )
    header, sep, payload = url.partition(",")
    if not sep or not header.endswith(";base64"):
        raise BadInputError(f"malformed data URI header {header[:60]!r}: expected 'data:<mime>;base64,'", **where)
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BadInputError(f"data URI payload is not valid base64 ({exc})", **where) from None
    pil = _open(raw, limits, where)
    return _to_model(pil, where)


def _open(raw: bytes, limits: ImageLimits, where: Where) -> Image.Image:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # our own limit follows
            pil = Image.open(io.BytesIO(raw))
        if pil.format not in _FORMATS:
            raise BadInputError(f"unsupported image format {pil.format!r}; supported: {sorted(_FORMATS)}", **where)
        check_size(pil, limits, where)  # before decoding pixels: a decompression bomb stops here
        pil.load()
    except BadInputError:
        raise
    except Image.DecompressionBombError as exc:
        raise BadInputError(f"image refused as a decompression bomb: {exc}", **where) from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError) as exc:
        raise BadInputError(f"image bytes could not be decoded (truncated or corrupt?): {exc}", **where) from None
    return pil


def model_image(image: Any, what: str, where: Where, limits: ImageLimits) -> Image.Image:
    """The model RGB image of an in-memory image: a PIL image (decoded like bytes) or ``[H, W, 3]`` uint8."""
    if isinstance(image, Image.Image):
        check_size(image, limits, where)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                image.load()
        except (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError) as exc:
            raise BadInputError(f"{what} could not be decoded: {exc}", **where) from None
        return _to_model(image, where)[0]
    if isinstance(image, np.ndarray):
        if image.ndim != 3 or image.shape[2] != 3:
            raise BadInputError(f"{what} array must be [H, W, 3], got shape {tuple(image.shape)}", **where)
        if image.shape[0] == 0 or image.shape[1] == 0:
            raise BadInputError(f"{what} is empty: shape {tuple(image.shape)}", **where)
        if image.dtype != np.uint8:
            raise BadInputError(f"{what} array must be uint8, got {image.dtype}", **where)
        pil = Image.fromarray(np.ascontiguousarray(image), mode="RGB")
        check_size(pil, limits, where)
        return pil
    raise BadInputError(
        f"{what} must be a PIL image, an RGB uint8 array or a data URI, got {type(image).__name__}", **where
    )


def check_size(pil: Image.Image, limits: ImageLimits, where: Where) -> None:
    w, h = pil.size
    if w == 0 or h == 0:
        raise BadInputError(f"image has zero size ({w}x{h})", **where)
    if w * h > limits.max_pixels:
        raise BadInputError(f"image is {w}x{h} = {w * h} pixels, over the budget of {limits.max_pixels}", **where)
    ratio = max(w, h) / min(w, h)
    if ratio > limits.max_aspect_ratio:
        raise BadInputError(
            f"image is {w}x{h}: aspect ratio {ratio:.1f} is over the processor's limit of {limits.max_aspect_ratio:g}",
            **where,
        )


def _to_model(pil: Image.Image, where: Where) -> tuple[Image.Image, bool]:
    """vLLM's decode (module docstring) plus 16-bit scaling; returns ``(RGB image, plain)``."""
    orientation = _orientation(pil)
    plain = pil.mode == "RGB" and orientation in (1, None)
    if orientation not in (1, None):  # vLLM transposes always; without a tag that is a copy
        with contextlib.suppress(Exception):  # vLLM's normalize_image ignores a broken EXIF block too
            pil = ImageOps.exif_transpose(pil)
    if pil.mode in _SIXTEEN_BIT:
        pil = _scale_16bit(pil, where)
    elif pil.mode == "F":
        raise BadInputError("32-bit float images are not supported: convert to 8-bit RGB first", **where)
    return _to_rgb(pil), plain


def _orientation(pil: Image.Image) -> int | None:
    try:
        return int(pil.getexif().get(_ORIENTATION, 1))
    except Exception:  # noqa: BLE001 — an unreadable EXIF block means no orientation (as in vLLM)
        return None


def _to_rgb(pil: Image.Image) -> Image.Image:
    """vLLM's ``ImageMediaIO._convert_image_mode`` with ``image_mode="RGB"``, white background."""
    if pil.mode == "RGB":
        return pil
    if pil.mode == "RGBA":
        return _onto_white(pil)
    if pil.mode in ("LA", "PA") or "transparency" in pil.info:
        return _onto_white(pil.convert("RGBA"))
    return pil.convert("RGB")


def _onto_white(rgba: Image.Image) -> Image.Image:
    out = Image.new("RGB", rgba.size, (255, 255, 255))
    out.paste(rgba, mask=rgba.split()[3])
    return out


def _scale_16bit(pil: Image.Image, where: Where) -> Image.Image:
    """16-bit grey to 8-bit grey by the high byte; a tRNS grey level becomes white (transparent)."""
    values = np.asarray(pil).astype(np.int64)
    if values.size and (values.min() < 0 or values.max() > 0xFFFF):
        raise BadInputError(f"{pil.mode} image holds values outside 16 bits: convert to 8-bit RGB first", **where)
    grey = (values >> 8).astype(np.uint8)
    key = pil.info.get("transparency")
    if isinstance(key, int):
        grey[values == key] = 255
    return Image.fromarray(grey, mode="L")


def encode_png_or_jpeg(image: Image.Image, fmt: str) -> str:
    """A data URI of an RGB image (no EXIF, no alpha: any decoder reads back these pixels for PNG)."""
    buf = io.BytesIO()
    image.save(buf, format=fmt)
    return f"data:{_MIME[fmt]};base64,{base64.b64encode(buf.getvalue()).decode('ascii')}"


def canonical_uri(url: str, plain: bool, image: Image.Image) -> str:
    """``url`` itself when its bytes decode plainly to ``image``, else a PNG of ``image``."""
    return url if plain else encode_png_or_jpeg(image, "PNG")
