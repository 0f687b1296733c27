"""The one sign-agreement measure (agreement.sign_agreement) on cases whose answer is known:
a change that is the prediction agrees everywhere, its negative nowhere, a coin-flip change
half the time; the weighting moves the weighted share and only it; entries too small to
have a sign are left out; and the specialization chapter's two readings are its readings
(the law probe and the routing probe call it the same way; their chapters' quick records
were compared before and after the change, value by value)."""
from __future__ import annotations

import math

import pytest
import torch

from attention_dynamics.agreement import measurable, sign_agreement
from attention_dynamics.laws import advantage
from attention_dynamics.specialization import advantage_sign_agreement, movement_agreement

F64 = torch.float64


def test_the_prediction_itself_agrees_everywhere_and_its_negative_nowhere():
    pred = torch.randn(40, 7, generator=torch.Generator().manual_seed(0), dtype=F64)
    a = sign_agreement(0.3 * pred, pred)
    assert (a.rate, a.weighted, a.n) == (1.0, 1.0, pred.numel())
    b = sign_agreement(-pred, pred, weights=pred.abs())
    assert (b.rate, b.weighted, b.agreeing_weight) == (0.0, 0.0, 0.0)


def test_an_unrelated_change_agrees_about_half_the_time():
    g = torch.Generator().manual_seed(1)
    pred, change = torch.randn(100_000, generator=g, dtype=F64), torch.randn(100_000, generator=g, dtype=F64)
    rate = sign_agreement(change, pred).rate
    # binomial: sd of the share is 0.5 / sqrt(n) = 0.0016; five sd
    assert abs(rate - 0.5) < 5 * 0.5 / math.sqrt(100_000)


def test_the_weighting_moves_only_the_weighted_share():
    pred = torch.tensor([1.0, 1.0, 1.0, 1.0], dtype=F64)
    change = torch.tensor([1.0, 1.0, 1.0, -1.0], dtype=F64)
    plain = sign_agreement(change, pred)
    heavy_miss = sign_agreement(change, pred, weights=torch.tensor([1.0, 1.0, 1.0, 9.0], dtype=F64))
    assert plain.rate == heavy_miss.rate == 0.75 and plain.weighted == 0.75
    assert heavy_miss.weighted == pytest.approx(3 / 12) and heavy_miss.total_weight == 12.0


def test_entries_without_a_sign_and_entries_outside_where_are_left_out():
    pred = torch.tensor([1.0, 1e-12, 1.0, 1.0], dtype=F64)
    change = torch.tensor([1.0, -1.0, 0.0, -1.0], dtype=F64)
    assert measurable(pred, 1e-9).tolist() == [True, False, True, True]
    a = sign_agreement(change, pred, rel_tol=1e-9)  # entry 1: no predicted sign; entry 2: no change
    assert (a.n, a.rate) == (2, 0.5)
    b = sign_agreement(change, pred, where=torch.tensor([True, True, True, False]))
    assert (b.n, b.rate) == (1, 1.0)
    none = sign_agreement(torch.zeros(3, dtype=F64), torch.ones(3, dtype=F64))
    assert none.n == 0 and math.isnan(none.rate) and math.isnan(none.weighted)


def test_shapes_must_match():
    with pytest.raises(ValueError, match=r"predicted must have the shape of change \(3,\)"):
        sign_agreement(torch.ones(3, dtype=F64), torch.ones(4, dtype=F64))


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_the_specialization_readings_are_the_shared_measure(dtype):
    """The specialization chapter's two readings, with causally masked attention (alpha = 0
    above the diagonal, where the advantage is not a law: those entries must be left out)."""
    g = torch.Generator().manual_seed(2)
    scores = torch.randn(6, 6, generator=g, dtype=F64).masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), -math.inf)
    alpha = torch.softmax(scores, -1).to(dtype)
    b, change = (torch.randn(6, 6, generator=g, dtype=F64).to(dtype) for _ in range(2))
    adv = advantage(alpha, b)
    shared = sign_agreement(change, -adv, where=alpha > 0, weights=alpha * adv.abs())
    assert advantage_sign_agreement(alpha, b, change) == (shared.rate, shared.weighted, shared.n)
    # 21 visible entries of 6 causal rows; the 15 hidden ones are left out, and so is the
    # one-key first row, whose advantage is exactly 0 (no sign to speak of)
    assert shared.n == 20
    moved = sign_agreement(change, -adv, where=alpha > 0, weights=change.abs())
    assert movement_agreement(alpha, b, change) == (moved.agreeing_weight, moved.total_weight)


def test_the_compared_mask_is_exactly_the_entries_counted():
    change = torch.tensor([1.0, -2.0, 0.0, 3.0, -1.0])
    predicted = torch.tensor([2.0, 1.0, 1.0, 0.0, -1.0])
    where = torch.tensor([True, True, True, True, False])
    a = sign_agreement(change, predicted, where=where)
    # entry 2 has no change and entry 3 no prediction to speak of; entry 4 is outside where
    assert a.compared.tolist() == [True, True, False, False, False]
    assert a.n == int(a.compared.sum()) == 2 and a.rate == 0.5
