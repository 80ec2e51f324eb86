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
    _check_images(traj, image_pad_id, merge_size, fail)


def _check_images(traj, image_pad_id: int, merge_size: int, fail) -> None:
    ids = traj.token_ids
    runs, start = [], None
    for i, tok in enumerate(tuple(ids) + (-1,)):
        if tok == image_pad_id and start is None:
            start = i
        elif tok != image_pad_id and start is not None:
            runs.append((start, i - start))
            start = None
    have = [(p.offset, p.length) for p in traj.placeholders]
    if runs != have:
        fail(f"image pad runs {runs} are not the placeholders {have}")
    n = len(have)
    grid = traj.image_grid_thw
    if n == 0:
        if traj.pixel_values is not None or grid is not None:
            fail("vision tensors without image placeholders")
        return
    if grid is None or traj.pixel_values is None or tuple(grid.shape) != (n, 3):
        fail(f"{n} images but image_grid_thw is {None if grid is None else tuple(grid.shape)}")
    per_image = grid.prod(-1).tolist()
    for k, ((_, length), patches) in enumerate(zip(have, per_image)):
        if length * merge_size**2 != patches:
            fail(f"image {k}: {length} pad tokens but its grid {grid[k].tolist()} has {patches} patches")
    if traj.pixel_values.shape[0] != sum(per_image):
        fail(f"pixel_values has {traj.pixel_values.shape[0]} rows, the grids need {sum(per_image)}")
    if len(traj.image_hashes) != n:
        fail(f"{len(traj.image_hashes)} image hashes for {n} images")
