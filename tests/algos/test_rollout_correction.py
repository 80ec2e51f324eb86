"""Rollout-mismatch importance weights against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from vlrl.algos import AlgoConfig, rollout_correction

# trainer / engine probability ratios per token; the last token of row 1 is masked
RATIOS = torch.tensor([[3.0, 0.5, 1.5], [1.0, 2.5, 99.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
ROLLOUT = torch.full((2, 3), -2.0)
OLD = ROLLOUT + RATIOS.log()


def run(**knobs):
    return rollout_correction(OLD, ROLLOUT, MASK, AlgoConfig(**knobs))


def test_token_truncate_hand_computed():
    w, m = run(correction_level="token", correction_mode="truncate", correction_cap=2.0)
    # min(r, 2): [2, 0.5, 1.5 | 1, 2, masked]
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.5, 1.5], [1.0, 2.0, 0.0]]))
    assert m["frac_clipped"].item() == pytest.approx(2 / 5)  # 3.0 and 2.5
    assert m["ratio_mean"].item() == pytest.approx((3 + 0.5 + 1.5 + 1 + 2.5) / 5)  # 1.7
    assert m["ratio_max"].item() == pytest.approx(3.0)
    assert m["ratio_min"].item() == pytest.approx(0.5)
    # ESS of the final weights: (2 + .5 + 1.5 + 1 + 2)^2 / (5 * (4 + .25 + 2.25 + 1 + 4)) = 49 / 57.5
    assert m["ess"].item() == pytest.approx(49 / 57.5)
    abs_diff = sum(abs(math.log(r)) for r in (3.0, 0.5, 1.5, 1.0, 2.5)) / 5
    assert m["logprob_abs_diff_mean"].item() == pytest.approx(abs_diff, rel=1e-5)


def test_token_mask_hand_computed():
    w, m = run(correction_level="token", correction_mode="mask", correction_low=0.6, correction_high=2.0)
    # keep r in [0.6, 2.0], keeping its value: only 1.5 and 1.0 survive
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.0, 1.5], [1.0, 0.0, 0.0]]))
    assert m["frac_masked"].item() == pytest.approx(3 / 5)
    # ESS: (1.5 + 1)^2 / (5 * (2.25 + 1)) = 6.25 / 16.25
    assert m["ess"].item() == pytest.approx(6.25 / 16.25)


def test_sequence_truncate_hand_computed():
    w, m = run(correction_level="sequence", correction_mode="truncate", correction_cap=2.4)
    # product over unmasked tokens: row 0 3 * 0.5 * 1.5 = 2.25; row 1 1 * 2.5 = 2.5 -> capped 2.4
    torch.testing.assert_close(w, torch.tensor([[2.25, 2.25, 2.25], [2.4, 2.4, 0.0]]))
    assert m["frac_clipped"].item() == pytest.approx(1 / 2)
    assert m["ratio_mean"].item() == pytest.approx((2.25 + 2.5) / 2)
    # ESS over 2 sequences: (2.25 + 2.4)^2 / (2 * (2.25^2 + 2.4^2)) = 21.6225 / 21.645
    assert m["ess"].item() == pytest.approx(21.6225 / 21.645)


def test_sequence_mask_hand_computed():
    w, m = run(correction_level="sequence", correction_mode="mask", correction_low=0.5, correction_high=2.3)
    # row 0 (2.25) kept whole, row 1 (2.5) dropped whole
    torch.testing.assert_close(w, torch.tensor([[2.25, 2.25, 2.25], [0.0, 0.0, 0.0]]))
    assert m["frac_masked"].item() == pytest.approx(1 / 2)
    assert m["ess"].item() == pytest.approx(0.5)  # 2.25^2 / (2 * 2.25^2)


def test_off_returns_the_mask_as_weights():
    w, m = run(correction_level=None)
    torch.testing.assert_close(w, MASK)
    assert set(m) == {"logprob_abs_diff_mean"}


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("mode", ["truncate", "mask"])
def test_identical_logprobs_give_unit_weights(level, mode):
    w, m = rollout_correction(ROLLOUT, ROLLOUT, MASK, AlgoConfig(correction_level=level, correction_mode=mode))
    torch.testing.assert_close(w, MASK)
    assert m["ess"].item() == pytest.approx(1.0)
    assert m["logprob_abs_diff_mean"].item() == 0.0


def test_all_masked_out_gives_zero_ess_not_nan():
    w, m = run(correction_level="token", correction_mode="mask", correction_low=10.0, correction_high=20.0)
    assert torch.all(w == 0) and m["ess"].item() == 0.0 and m["frac_masked"].item() == 1.0


def test_huge_sequence_ratio_is_clamped_finite():
    old = torch.zeros(1, 40)
    rollout = torch.full((1, 40), -5.0)  # sum of log-ratios 200 -> clamped to 20
    w, m = rollout_correction(
        old, rollout, torch.ones(1, 40), AlgoConfig(correction_level="sequence", correction_cap=1e12)
    )
    assert m["ratio_max"].item() == pytest.approx(math.exp(20), rel=1e-5)
    assert torch.all(torch.isfinite(w))


def test_weights_carry_no_gradient():
    old = OLD.clone().requires_grad_()
    w, _ = rollout_correction(old, ROLLOUT, MASK, AlgoConfig(correction_level="token"))
    assert not w.requires_grad
