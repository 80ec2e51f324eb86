"""Synthetic geometry problems: a triangle diagram drawn with Pillow and one unknown x.

Kinds (one chosen per seed):
- ``angle_sum``: two angles given in degrees, x is the third.
- ``isosceles``: apex angle given, equal sides ticked, x is a base angle.
- ``hypotenuse``: right triangle, legs given, x is the hypotenuse (e.g. ``2\\sqrt{13}``).
- ``leg``: right triangle, hypotenuse and one leg given, x is the other leg.

Angle diagrams are drawn to their true shape; side diagrams to the true leg ratio. The answer
is an exact LaTeX string graded by :mod:`vlrl.envs.geometry.grading`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw, ImageFont

KINDS = ("angle_sum", "isosceles", "hypotenuse", "leg")
CANVAS = (320, 240)  # width, height
_INK = (20, 20, 20)
_LABEL = (0, 70, 160)
_TRIPLES = (
    (3, 4, 5),
    (4, 3, 5),
    (5, 12, 13),
    (12, 5, 13),
    (6, 8, 10),
    (8, 6, 10),
    (8, 15, 17),
    (9, 12, 15),
    (7, 24, 25),
    (12, 16, 20),
)


@dataclass(frozen=True)
class GeometryProblem:
    """One problem. ``vertices`` are (x, y) pixel positions of A, B, C; labels are drawn text."""

    kind: str
    question: str
    answer: str
    vertices: tuple[tuple[float, float], ...]
    side_labels: tuple[str, str, str]  # for sides BC, CA, AB ("" = none)
    angle_labels: tuple[str, str, str]  # at A, B, C
    right_angle_at: int | None = None
    ticks: tuple[int, ...] = ()  # sides with an equal-length tick


def _fit(points: list[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    """Scale and centre points (math coordinates, y up) into the canvas with a margin (y down)."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    w, h = CANVAS
    scale = min((w - 90) / (max(xs) - min(xs)), (h - 80) / (max(ys) - min(ys)))
    ox = (w - scale * (max(xs) - min(xs))) / 2 - scale * min(xs)
    oy = (h - scale * (max(ys) - min(ys))) / 2 + scale * max(ys)
    return tuple((round(ox + scale * x, 2), round(oy - scale * y, 2)) for x, y in points)


def _from_angles(a_deg: float, b_deg: float) -> list[tuple[float, float]]:
    """A on the left, B on the right of a unit base, C above: angles a at A and b at B."""
    a, b = math.radians(a_deg), math.radians(b_deg)
    t = math.sin(b) / math.sin(a + b)  # |AC| with |AB| = 1 (law of sines)
    return [(0.0, 0.0), (1.0, 0.0), (t * math.cos(a), t * math.sin(a))]


def _sqrt_latex(n: int) -> str:
    """Exact LaTeX for sqrt(n): ``5``, ``2\\sqrt{13}``, ``\\sqrt{41}``."""
    k = max(d for d in range(1, math.isqrt(n) + 1) if n % (d * d) == 0)
    rest = n // (k * k)
    if rest == 1:
        return str(k)
    return f"{k}\\sqrt{{{rest}}}" if k > 1 else f"\\sqrt{{{rest}}}"


def make_problem(rng: np.random.Generator) -> GeometryProblem:
    """Draw a problem kind and its numbers from ``rng``."""
    kind = KINDS[int(rng.integers(len(KINDS)))]
    if kind == "angle_sum":
        a, b = (int(v) for v in rng.integers(25, 81, size=2))
        return GeometryProblem(
            kind,
            f"In triangle ABC, angle A is {a}° and angle B is {b}°. Find x, the measure of angle C in degrees.",
            str(180 - a - b),
            _fit(_from_angles(a, b)),
            ("", "", ""),
            (f"{a}°", f"{b}°", "x°"),
        )
    if kind == "isosceles":
        apex = 2 * int(rng.integers(15, 60))
        base = (180 - apex) / 2
        return GeometryProblem(
            kind,
            f"Triangle ABC has AC = BC and angle C is {apex}°. Find x, the measure of angle A in degrees.",
            str(int(base)),
            _fit(_from_angles(base, base)),
            ("", "", ""),
            ("x°", "", f"{apex}°"),
            ticks=(0, 1),
        )
    if kind == "hypotenuse":
        legs = [int(v) for v in rng.integers(3, 13, size=2)]
        pts = _fit([(0.0, 0.0), (float(legs[0]), 0.0), (0.0, float(legs[1]))])  # right angle at A
        return GeometryProblem(
            kind,
            "Triangle ABC has a right angle at A. Find x, the length of BC.",
            _sqrt_latex(legs[0] ** 2 + legs[1] ** 2),
            pts,
            ("x", str(legs[1]), str(legs[0])),
            ("", "", ""),
            right_angle_at=0,
        )
    a, b, c = _TRIPLES[int(rng.integers(len(_TRIPLES)))]  # integer hypotenuse: every label is plain
    pts = _fit([(0.0, 0.0), (float(a), 0.0), (0.0, float(b))])
    return GeometryProblem(
        kind,
        "Triangle ABC has a right angle at A. Find x, the length of AC.",
        str(b),
        pts,
        (str(c), "x", str(a)),
        ("", "", ""),
        right_angle_at=0,
    )


def _label_at(draw: ImageDraw.ImageDraw, xy: tuple[float, float], text: str, font, fill) -> None:
    box = draw.textbbox((0, 0), text, font=font)
    draw.text((xy[0] - (box[2] - box[0]) / 2, xy[1] - (box[3] - box[1]) / 2 - box[1]), text, font=font, fill=fill)


def _away(p: tuple[float, float], centre: tuple[float, float], dist: float) -> tuple[float, float]:
    dx, dy = p[0] - centre[0], p[1] - centre[1]
    n = math.hypot(dx, dy) or 1.0
    return (p[0] + dist * dx / n, p[1] + dist * dy / n)


def draw_problem(problem: GeometryProblem) -> np.ndarray:
    """The diagram ``[240, 320, 3]`` uint8: triangle, vertex names, side and angle labels, marks."""
    img = Image.new("RGB", CANVAS, (255, 255, 255))
    draw = ImageDraw.Draw(img)
    font = ImageFont.load_default(14)
    v = problem.vertices
    centre = (sum(p[0] for p in v) / 3, sum(p[1] for p in v) / 3)
    draw.polygon(v, outline=_INK, width=2)
    for i, name in enumerate("ABC"):
        _label_at(draw, _away(v[i], centre, 16), name, font, _INK)
        if problem.angle_labels[i]:
            inward = (centre[0] - v[i][0], centre[1] - v[i][1])
            n = math.hypot(*inward)
            _label_at(
                draw,
                (v[i][0] + 30 * inward[0] / n, v[i][1] + 30 * inward[1] / n),
                problem.angle_labels[i],
                font,
                _LABEL,
            )
    for side, (i, j) in enumerate(((1, 2), (2, 0), (0, 1))):
        mid = ((v[i][0] + v[j][0]) / 2, (v[i][1] + v[j][1]) / 2)
        if problem.side_labels[side]:
            _label_at(draw, _away(mid, centre, 16), problem.side_labels[side], font, _LABEL)
        if side in problem.ticks:
            dx, dy = v[j][0] - v[i][0], v[j][1] - v[i][1]
            n = math.hypot(dx, dy)
            px, py = -dy / n * 6, dx / n * 6
            draw.line([(mid[0] - px, mid[1] - py), (mid[0] + px, mid[1] + py)], fill=_INK, width=2)
    if problem.right_angle_at is not None:
        k = problem.right_angle_at
        a, b, c = v[k], v[(k + 1) % 3], v[(k + 2) % 3]
        ub = ((b[0] - a[0]) / math.dist(a, b) * 12, (b[1] - a[1]) / math.dist(a, b) * 12)
        uc = ((c[0] - a[0]) / math.dist(a, c) * 12, (c[1] - a[1]) / math.dist(a, c) * 12)
        draw.line(
            [(a[0] + ub[0], a[1] + ub[1]), (a[0] + ub[0] + uc[0], a[1] + ub[1] + uc[1]), (a[0] + uc[0], a[1] + uc[1])],
            fill=_INK,
            width=1,
        )
    return np.asarray(img, dtype=np.uint8)
