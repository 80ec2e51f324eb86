"""Integrity of a trajectory: masks, logprobs, turn spans and images agree with each other.

Runs on every trajectory before it leaves the rollout generator, and in tests. Library code:
raises :class:`TrajectoryIntegrityError` naming the trajectory and what is inconsistent.
"""

from __future__ import annotations

import math

from vlrl.errors import VlrlError


class TrajectoryIntegrityError(VlrlError):
    """A trajectory whose tokens, masks, turns or vision tensors disagree."""


def check_trajectory(traj, *, image_pad_id: int, merge_size: int = 2) -> None:
    """Raise :class:`TrajectoryIntegrityError` unless ``traj`` is self-consistent.

    - ``loss_mask`` is 1 exactly on generated tokens (turn spans minus appended ends of turn);
    - logprobs are 0 off the mask and finite (or NaN for a scripted policy) on it;
    - each turn's reward sits on its last generated token (its appended end of turn if it generated
      nothing) and nowhere else is rewarded;
    - pad-token runs are the placeholders, one per image, each ``prod(grid) / merge_size²`` long,
      and ``pixel_values`` has ``sum(prod(grid))`` rows.
    """

    def fail(what: str) -> None:
        raise TrajectoryIntegrityError(f"trajectory {traj.uid}: {what}")

    n_prompt = len(traj.prompt_ids)
    want_mask = [0] * len(traj.response_ids)
    want_rewards = [0.0] * len(traj.response_ids)
    for span in traj.turns:
        if not n_prompt <= span.gen_start < span.gen_end <= len(traj.token_ids):
            fail(f"turn {span.index} span [{span.gen_start}, {span.gen_end}) is outside the response")
        n_gen = span.gen_end - span.gen_start - span.eos_appended
        for i in range(span.gen_start, span.gen_start + n_gen):
            want_mask[i - n_prompt] = 1
        want_rewards[span.gen_start + max(n_gen, 1) - 1 - n_prompt] += span.reward
    if list(traj.loss_mask) != want_mask:
        at = next(i for i, (a, b) in enumerate(zip(traj.loss_mask, want_mask)) if a != b)
        fail(f"loss mask is {traj.loss_mask[at]} at response token {at}, expected {want_mask[at]}")
    for i, (m, lp) in enumerate(zip(traj.loss_mask, traj.logprobs)):
        if (m == 0 and lp != 0.0) or (m == 1 and (math.isinf(lp) or lp > 1e-6)):
            fail(f"logprob {lp} at response token {i} (loss mask {m})")
    if any(abs(a - b) > 1e-12 for a, b in zip(traj.rewards, want_rewards)):
        fail("rewards are not exactly the turn rewards on each turn's last generated token")
    check_images(traj, image_pad_id=image_pad_id, merge_size=merge_size)


def check_images(traj, *, image_pad_id: int, merge_size: int = 2, error: type = TrajectoryIntegrityError) -> None:
    """Placeholders vs pad tokens vs image grids vs pixel rows vs hashes of one trajectory (raises ``error``)."""
    import torch

    def fail(what: str) -> None:
        raise error(f"trajectory {traj.uid}: {what}")

    ids = torch.tensor(traj.token_ids, dtype=torch.long)
    grid = traj.image_grid_thw
    n_grid = 0 if grid is None else int(grid.shape[0])
    if n_grid != len(traj.placeholders):
        fail(f"{len(traj.placeholders)} placeholder runs but {n_grid} image grids")
    expected = 0
    for i, ph in enumerate(traj.placeholders):
        want = int(grid[i].prod()) // merge_size**2
        run = ids[ph.offset : ph.offset + ph.length]
        if ph.length != want or run.numel() != want or not bool((run == image_pad_id).all()):
            fail(
                f"image {i} grid {grid[i].tolist()} needs {want} pad tokens at offset {ph.offset}, the sequence "
                f"has a run of {int((run == image_pad_id).sum())} (placeholder length {ph.length})"
            )
        expected += want
    n_pads = int((ids == image_pad_id).sum())
    if n_pads != expected:
        fail(f"{n_pads} image pad tokens in the sequence, the {n_grid} image grids account for {expected}")
    rows = 0 if traj.pixel_values is None else int(traj.pixel_values.shape[0])
    want_rows = 0 if grid is None else int(grid.prod(-1).sum())
    if rows != want_rows:
        fail(
            f"pixel_values has {rows} patch rows, the image grids {[] if grid is None else grid.tolist()} "
            f"need {want_rows}"
        )
    if len(traj.image_hashes) != n_grid:
        fail(f"{len(traj.image_hashes)} image hashes for {n_grid} images")
