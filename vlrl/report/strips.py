"""Rollout image strips: one row per trajectory, each turn's observation frame(s) with the action
taken and its reward beneath.

Input is a trajectory record as written by :func:`vlrl.rollout.io.trajectory_record`. Frames come
from the images of the conversation (``messages``); the k-th assistant message is the k-th turn's
action and the images shown since the previous assistant message are what it saw. Images are
re-encoded as thumbnails (≤ ``THUMB`` px) so a report with many samples stays small.
"""

from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass, field
from typing import Any, Literal

THUMB = 128
MAX_TEXT = 120


@dataclass
class Cell:
    """One column of a strip: the frames seen, then what the policy did."""

    frames: list[str] = field(default_factory=list)
    """Thumbnail PNG data URIs."""
    action: str | None = None
    reward: float | None = None
    finish: str | None = None
    feedback: str | None = None
    """The text shown with the frames (env feedback), for context."""
    label: str = ""


def strip_cells(record: dict[str, Any], thumb: int = THUMB) -> list[Cell]:
    """The cells of one trajectory record: one per turn, plus a last one for a final observation."""
    turns = [t for t in record.get("turns") or [] if isinstance(t, dict)]
    cells: list[Cell] = []
    current = Cell(label="turn 0")
    for message in record.get("messages") or []:
        if not isinstance(message, dict):
            continue
        if message.get("role") == "assistant":
            k = len(cells)
            turn = turns[k] if k < len(turns) else {}
            current.action = _text(message.get("content"))
            current.reward = _float(turn.get("reward"))
            current.finish = turn.get("finish_reason")
            current.label = f"turn {turn.get('index', k)}"
            cells.append(current)
            current = Cell(label=f"turn {k + 1}")
        else:
            current.frames += [thumbnail_uri(u, thumb) for u in _image_urls(message)]
            feedback = _text(message.get("content"))
            if feedback and message.get("role") != "system":
                current.feedback = feedback
    # Turns the messages do not cover (a record without messages): show their text alone.
    for turn in turns[len(cells) :]:
        cells.append(
            Cell(
                action=turn.get("text"),
                reward=_float(turn.get("reward")),
                finish=turn.get("finish_reason"),
                label=f"turn {turn.get('index', len(cells))}",
            )
        )
    if current.frames:
        current.label = "final"
        cells.append(current)
    return cells


FrameTag = Literal["img", "background"]
"""How a frame is drawn: an ``<img>``, or a ``<div>`` with the frame as its background. pytest-html 4's media
viewer shows its figures in ``resultBody.querySelector('img')`` — the row's first ``<img>`` — so an ``<img>``
in a row's HTML extras gets the chart drawn into it and the viewer stays empty: rows use backgrounds."""


def strip_html(record: dict[str, Any], thumb: int = THUMB, frame: FrameTag = "img") -> str:
    """An HTML fragment (inline styles only, so it also renders inside a pytest-html row)."""
    cells = strip_cells(record, thumb)
    metrics = record.get("metrics") or {}
    ret = _float(metrics.get("return"))
    head = (
        f"<b>{html.escape(str(record.get('uid', '?')))}</b> · return "
        f"<b>{'?' if ret is None else f'{ret:.3g}'}</b> · stop "
        f"<code>{html.escape(str(record.get('stop_reason')))}</code>"
        f" · {len([c for c in cells if c.action is not None])} turn(s)"
    )
    if record.get("error"):
        head += f" · error: <code>{html.escape(_clip(str(record['error'])))}</code>"
    body = "".join(_cell_html(c, thumb, frame) for c in cells) or "<i>no turns</i>"
    return (
        f"<div class='vlrl-strip' style='margin:6px 0 14px 0'><div style='font-size:13px'>{head}</div>"
        f"<div style='display:flex;gap:6px;overflow-x:auto;align-items:flex-start'>{body}</div></div>"
    )


def _cell_html(cell: Cell, thumb: int, frame: FrameTag = "img") -> str:
    if frame == "img":
        imgs = "".join(
            f"<img src='{uri}' alt='frame' style='max-width:{thumb}px;max-height:{thumb}px;"
            f"image-rendering:pixelated;display:block'>"
            for uri in cell.frames
        )
    else:
        imgs = "".join(
            f"<div class='vlrl-frame' role='img' aria-label='frame' style='width:{thumb}px;height:{thumb}px;"
            f"background:url({uri}) left top/contain no-repeat;image-rendering:pixelated'></div>"
            for uri in cell.frames
        )
    lines = [f"<div style='color:#666'>{html.escape(cell.label)}</div>"]
    if cell.action is not None:
        action = f"<code>{html.escape(_clip(cell.action))}</code>" if cell.action.strip() else "<i>(empty reply)</i>"
        lines.append(f"<div class='vlrl-action'>{action}</div>")
        reward = "?" if cell.reward is None else f"{cell.reward:.3g}"
        lines.append(
            f"<div>reward <b>{reward}</b>" + (f" · {html.escape(str(cell.finish))}" if cell.finish else "") + "</div>"
        )
    if cell.feedback:
        lines.append(
            f"<div style='color:#888' title='{html.escape(cell.feedback)}'>"
            f"{html.escape(_clip(cell.feedback, 60))}</div>"
        )
    return (
        f"<div style='flex:0 0 auto;width:{thumb + 8}px;font-size:11px;border:1px solid #ddd;padding:3px;"
        f"word-wrap:break-word'>{imgs}{''.join(lines)}</div>"
    )


def thumbnail_uri(url: str, size: int = THUMB) -> str:
    """A PNG data URI of the image in ``url`` shrunk to fit ``size`` px, or of a grey placeholder
    when it cannot be decoded (the report shows that something was there)."""
    from PIL import Image

    try:
        raw = base64.b64decode(url.split(",", 1)[1], validate=False)
        image: Image.Image = Image.open(io.BytesIO(raw))
        image.load()
        image = image.convert("RGB")
        # NEAREST keeps maze cells crisp; these frames are drawn, not photographed.
        image.thumbnail((size, size), Image.Resampling.NEAREST)
    except Exception:  # noqa: BLE001 - any undecodable payload becomes a placeholder
        image = Image.new("RGB", (size // 2, size // 2), (200, 200, 200))
    buf = io.BytesIO()
    image.save(buf, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _image_urls(message: dict[str, Any]) -> list[str]:
    content = message.get("content")
    urls = []
    for part in content if isinstance(content, list) else []:
        if not isinstance(part, dict):
            continue
        spec = part.get("image_url") if part.get("type") == "image_url" else part.get("image")
        url = spec.get("url") if isinstance(spec, dict) else spec
        if isinstance(url, str) and url.startswith("data:"):
            urls.append(url)
    return urls


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text").strip()
    return ""


def _clip(text: str, n: int = MAX_TEXT) -> str:
    """Head and tail of a long text: the action usually closes a reply (``<action>up</action>``)."""
    if len(text) <= n:
        return text
    head = n // 3
    return text[:head] + " … " + text[-(n - head - 3) :]


def _float(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None
