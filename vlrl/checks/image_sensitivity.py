"""Image sensitivity: does each turn's policy actually look at that turn's image?

Rollout-vs-trainer agreement passes when both sides ignore the image (a dead projector, pixels
dropped in collation, the wrong image key): the logprobs agree and the policy is blind. This probe
re-scores every generated token of a turn after changing *only that turn's image* — blanked to the
normalised mean (all-zero pixel rows), or swapped for another trajectory's image with the same grid
— through the trainer's own forward, and reports how far the turn's logprobs moved.

A turn is *sensitive* when the larger of the two moves (mean |Δ logprob| over the turn's generated
tokens) reaches ``min_mean_abs``. The check passes when at least ``min_fraction`` of the probed
turns are sensitive; a dead vision pathway moves nothing (Δ = 0 exactly).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

DEFAULT_MIN_MEAN_ABS = 1e-3
"""A change of the image must move the turn's mean |Δ logprob| by at least this. fp32 noise of re-scoring
the same inputs is ≤ 1e-6 and bf16's ≤ 1e-3 (vlrl.checks.bounds), so a blind turn cannot reach it."""
DEFAULT_MIN_FRACTION = 0.9
"""Fraction of probed turns that must be sensitive (a confident turn may legitimately barely move)."""


class ImageInsensitiveError(AssertionError):
    """Too few turns' logprobs depend on their image; ``report`` holds the per-turn numbers."""

    def __init__(self, message: str, report: ImageSensitivityReport):
        super().__init__(message)
        self.report = report


@dataclass(frozen=True)
class TurnSensitivity:
    uid: str
    turn: int
    n_tokens: int
    """Generated tokens of the turn (the ones re-scored)."""
    blank_mean_abs: float
    """Mean |Δ logprob| over the turn's tokens with its image(s) blanked."""
    swap_mean_abs: float | None
    """The same with another trajectory's image of the same grid; None when none had that grid."""

    @property
    def moved(self) -> float:
        return max(self.blank_mean_abs, self.swap_mean_abs or 0.0)


@dataclass(frozen=True)
class ImageSensitivityReport:
    turns: tuple[TurnSensitivity, ...]
    min_mean_abs: float
    min_fraction: float

    @property
    def sensitive_fraction(self) -> float:
        return sum(t.moved >= self.min_mean_abs for t in self.turns) / max(1, len(self.turns))

    @property
    def passed(self) -> bool:
        return bool(self.turns) and self.sensitive_fraction >= self.min_fraction

    def row(self) -> dict[str, Any]:
        """JSON-ready summary plus the per-turn numbers."""
        blank = [t.blank_mean_abs for t in self.turns]
        return {
            "turns": len(self.turns),
            "sensitive_fraction": self.sensitive_fraction,
            "passed": self.passed,
            "min_mean_abs": self.min_mean_abs,
            "blank_mean_abs_min": min(blank, default=0.0),
            "blank_mean_abs_median": sorted(blank)[len(blank) // 2] if blank else 0.0,
            "per_turn": [vars(t) for t in self.turns],
        }

    def summary(self) -> str:
        least = min(self.turns, key=lambda t: t.moved, default=None)
        where = f"; least moved: trajectory {least.uid} turn {least.turn} ({least.moved:.3g})" if least else ""
        return (
            f"{self.sensitive_fraction:.0%} of {len(self.turns)} turns moved by >= {self.min_mean_abs:g} "
            f"mean |Δ logprob| when their image was blanked or swapped (need {self.min_fraction:.0%}){where}"
        )

    def raise_if_failed(self) -> None:
        if not self.passed:
            raise ImageInsensitiveError(f"the policy does not look at its images: {self.summary()}", self)


def image_sensitivity(
    model,
    batch,
    *,
    max_rows: int = 4,
    min_mean_abs: float = DEFAULT_MIN_MEAN_ABS,
    min_fraction: float = DEFAULT_MIN_FRACTION,
) -> ImageSensitivityReport:
    """Probe the first ``max_rows`` rows of ``batch`` (a ``vlrl.train.batch.Batch``) under ``model``.

    One forward per row for the baseline, then one per (turn with an image, perturbation); each row
    runs alone, so nothing but the perturbed image differs between the two scorings.
    """
    import torch

    from vlrl.train.forward import policy_forward

    results = []
    with torch.no_grad():
        for r in range(min(max_rows, batch.size)):
            row = batch.select([r])
            if row.pixel_values is None:
                continue
            base = policy_forward(model, row, with_entropy=False).logprobs.cpu()
            for turn, images, gen in _turns_with_images(row, int(model.config.image_token_id)):
                blank = _moved(model, row, base, gen, _blanked(row, images))
                swapped = _swapped(row, images, batch, r)
                results.append(
                    TurnSensitivity(
                        uid=row.uids[0],
                        turn=turn,
                        n_tokens=int(gen.sum()),
                        blank_mean_abs=blank,
                        swap_mean_abs=None if swapped is None else _moved(model, row, base, gen, swapped),
                    )
                )
    return ImageSensitivityReport(turns=tuple(results), min_mean_abs=min_mean_abs, min_fraction=min_fraction)


def _moved(model, row, base: torch.Tensor, gen: torch.Tensor, pixels: torch.Tensor) -> float:
    """Mean |Δ logprob| over the generated tokens ``gen`` (mask ``[L]``) when ``row`` sees ``pixels``
    instead of its own images; ``base`` ``[1, L]`` is the row's unperturbed logprobs."""
    from vlrl.train.forward import policy_forward

    lp = policy_forward(model, row.replace(pixel_values=pixels), with_entropy=False).logprobs.cpu()
    return float((lp - base)[0][gen].abs().mean())


def _image_runs(ids: torch.Tensor, image_token_id: int) -> list[int]:
    """Start position of each maximal run of image-pad tokens in ``ids`` ``[L]`` (one run per image)."""
    is_pad = (ids == image_token_id).tolist()
    return [i for i, p in enumerate(is_pad) if p and (i == 0 or not is_pad[i - 1])]


def _turns_with_images(row, image_token_id: int) -> list[tuple[int, list[int], torch.Tensor]]:
    """``(turn, image indices in the row, generated-token mask [L])`` for each turn whose observation
    holds an image and that generated tokens."""
    turns, gen_mask = row.turn_index[0].cpu(), row.loss_mask[0].cpu().bool()
    starts = _image_runs(row.input_ids[0].cpu(), image_token_id)
    out = []
    for turn in sorted(set(turns[gen_mask].tolist()) - {-1}):
        images = [i for i, s in enumerate(starts) if int(turns[s]) == turn]
        gen = gen_mask & (turns == turn)
        if images and gen.any():
            out.append((turn, images, gen))
    return out


def _patch_ranges(grid: torch.Tensor) -> list[tuple[int, int]]:
    ends = grid.prod(-1).cumsum(0).tolist()
    return [(ends[i - 1] if i else 0, e) for i, e in enumerate(ends)]


def _blanked(row, images: list[int]) -> torch.Tensor:
    pixels = row.pixel_values.clone()
    ranges = _patch_ranges(row.image_grid_thw)
    for i in images:
        lo, hi = ranges[i]
        pixels[lo:hi] = 0  # the normalised mean colour: no content
    return pixels


def _swapped(row, images: list[int], batch, r: int) -> torch.Tensor | None:
    """The row's pixels with each of ``images`` replaced by another row's image of the same grid
    (None if any has no donor)."""
    pixels = row.pixel_values.clone()
    ranges = _patch_ranges(row.image_grid_thw)
    donors = [(o, batch.select([o])) for o in range(batch.size) if o != r and batch.uids[o] != batch.uids[r]]
    for i in images:
        grid = row.image_grid_thw[i].tolist()
        found = None
        for _, other in donors:
            if other.image_grid_thw is None:
                continue
            for j, g in enumerate(other.image_grid_thw.tolist()):
                lo, hi = _patch_ranges(other.image_grid_thw)[j]
                if g == grid and not bool((other.pixel_values[lo:hi] == pixels[ranges[i][0] : ranges[i][1]]).all()):
                    found = other.pixel_values[lo:hi]
                    break
            if found is not None:
                break
        if found is None:
            return None
        lo, hi = ranges[i]
        pixels[lo:hi] = found.to(pixels.device, pixels.dtype)
    return pixels
