"""vlrl.checks.agreement on hand-built tensors: statistics, per-turn table, KL over top-k + tail, errors."""

from __future__ import annotations

import math

import pytest
import torch

from pytest_vlrl import assert_logprobs_agree
from vlrl.checks.agreement import AgreementBounds, LogprobDisagreementError, compare_logprobs
from vlrl.checks.distribution import distribution_stats

MASK = torch.tensor([[0, 1, 1, 1, 0], [0, 0, 1, 1, 1]], dtype=torch.float32)
TURNS = torch.tensor([[0, 0, 0, 1, -1], [0, 0, 0, 1, 1]])
ROLLOUT = torch.tensor([[0.0, -1.0, -2.0, -3.0, 0.0], [0.0, 0.0, -0.5, -0.25, -4.0]])


def test_statistics_per_turn_and_overall_by_hand():
    trainer = ROLLOUT.clone()
    trainer[0, 3] += 0.1  # turn 1
    trainer[1, 2] -= 0.2  # turn 0
    r = compare_logprobs(ROLLOUT, trainer, MASK, turn_index=TURNS, uids=["a", "b"], dtype="float32")
    d = torch.tensor([0.0, 0.0, 0.1, -0.2, 0.0, 0.0], dtype=torch.float64)
    assert r.overall.n_tokens == 6
    assert r.overall.max_abs == pytest.approx(0.2, abs=1e-6)
    assert r.overall.mean_abs == pytest.approx(0.3 / 6, abs=1e-6)
    assert r.overall.k3 == pytest.approx(float((d.exp() - 1 - d).mean()), rel=1e-4)
    assert r.overall.ratio_min == pytest.approx(math.exp(-0.2), rel=1e-5)
    assert r.overall.ratio_max == pytest.approx(math.exp(0.1), rel=1e-5)
    turns = {t.turn: t.stats for t in r.turns}
    assert set(turns) == {0, 1} and turns[0].n_tokens == 3 and turns[1].n_tokens == 3
    assert turns[0].max_abs == pytest.approx(0.2, abs=1e-6) and turns[1].max_abs == pytest.approx(0.1, abs=1e-6)
    w = r.worst[0]
    assert (w.uid, w.row, w.turn, w.position) == ("b", 1, 0, 2) and w.delta == pytest.approx(-0.2, abs=1e-6)
    assert r.breached and any("max |Δ|" in b for b in r.breaches)
    assert r.metrics()["agreement/turn1/max_abs"] == pytest.approx(0.1, abs=1e-6)
    assert r.metrics()["agreement/breached"] == 1.0


def test_identical_logprobs_pass_and_masked_positions_are_ignored():
    trainer = ROLLOUT.clone()
    trainer[0, 0] = -99.0  # not generated
    trainer[0, 4] = float("-inf")  # padding
    r = compare_logprobs(ROLLOUT, trainer, MASK, dtype="float32")
    assert not r.breached and r.overall.max_abs == 0.0 and r.overall.ratio_min == 1.0
    r.raise_if_breached()


def test_non_finite_trainer_logprob_is_a_breach():
    trainer = ROLLOUT.clone()
    trainer[1, 4] = float("-inf")
    r = compare_logprobs(ROLLOUT, trainer, MASK, dtype="float32")
    assert r.breached and math.isinf(r.overall.max_abs)


def test_error_names_trajectory_turn_position_and_both_values():
    trainer = ROLLOUT.clone()
    trainer[1, 3] = -0.75
    r = compare_logprobs(
        ROLLOUT, trainer, MASK, turn_index=TURNS, uids=["a", "ep-7"], token_ids=torch.arange(10).view(2, 5)
    )
    with pytest.raises(LogprobDisagreementError) as info:
        r.raise_if_breached()
    msg = str(info.value)
    assert "trajectory ep-7" in msg and "turn 1" in msg and "token position 3" in msg and "id 8" in msg
    assert "rollout -0.25" in msg and "trainer -0.75" in msg
    assert info.value.report is r


def test_bounds_by_dtype():
    assert AgreementBounds.for_dtype(torch.float32).max_abs == 1e-4
    assert AgreementBounds.for_dtype("bfloat16").mean_abs > AgreementBounds.for_dtype("float32").mean_abs
    with pytest.raises(ValueError, match="int8"):
        AgreementBounds.for_dtype("int8")


def test_vocabulary_kl_counts_the_tail_bucket():
    """Engine top-2 probabilities [0.5, 0.3] + tail 0.2 vs trainer [0.4, 0.3] + tail 0.3: KL by hand."""
    e = torch.log(torch.tensor([[0.5, 0.3]], dtype=torch.float64))
    q = torch.log(torch.tensor([[0.4, 0.3]], dtype=torch.float64))
    ids = torch.tensor([[5, 9]])
    d = distribution_stats(ids, e, torch.tensor([[5, 9]]), q, q, tie_tolerance=1e-4)
    want = 0.5 * math.log(0.5 / 0.4) + 0.0 + 0.2 * math.log(0.2 / 0.3)
    assert d.vocab_kl_max == pytest.approx(want, rel=1e-9)
    # mass moved only into the tail, head ratios unchanged: still a positive KL
    q2 = torch.log(torch.tensor([[0.25, 0.15]], dtype=torch.float64))
    d2 = distribution_stats(ids, e, ids, q2, q2, tie_tolerance=1e-4)
    assert d2.vocab_kl_max == pytest.approx(0.5 * math.log(2) + 0.3 * math.log(2) + 0.2 * math.log(0.2 / 0.6), rel=1e-9)
    assert d2.vocab_kl_max > 0.1


def test_topk_overlap_exact_and_tie_aware():
    e_ids = torch.tensor([[1, 2, 3], [1, 2, 3]])
    e_lp = torch.log(torch.tensor([[0.3, 0.2, 0.1], [0.3, 0.2, 0.1]]))
    t_ids = torch.tensor([[1, 2, 3], [1, 2, 7]])
    t_lp = torch.log(torch.tensor([[0.3, 0.2, 0.1], [0.3, 0.2, 0.1]]))
    at = torch.log(torch.tensor([[0.3, 0.2, 0.1], [0.3, 0.2, 0.1 - 1e-9]]))  # id 3 a near-tie with id 7
    d = distribution_stats(e_ids, e_lp, t_ids, t_lp, at, tie_tolerance=1e-4)
    assert d.topk_overlap_min == pytest.approx(2 / 3) and d.tie_aware_overlap_min == 1.0


def test_plugin_assertion_message_has_the_turn_table_and_decoded_tokens():
    class Tok:
        def decode(self, ids):
            return f"<tok{ids[0]}>"

    trainer = ROLLOUT.clone()
    trainer[1, 4] += 0.5
    with pytest.raises(AssertionError) as info:
        assert_logprobs_agree(
            ROLLOUT,
            trainer,
            mask=MASK,
            turn_index=TURNS,
            uids=["a", "b"],
            token_ids=torch.arange(10).view(2, 5),
            tokenizer=Tok(),
        )
    msg = str(info.value)
    assert "turn" in msg and "mean |Δ|" in msg and "\n    1 " in msg and "  all " in msg
    assert "trajectory b (row 1), turn 1, token position 4 (id 9)" in msg and "'<tok9>'" in msg
    with pytest.raises(TypeError, match="mask="):
        assert_logprobs_agree(ROLLOUT, trainer)
    report = assert_logprobs_agree(ROLLOUT, ROLLOUT, mask=MASK)
    assert report.overall.n_tokens == 6
