"""Every chapter executed at the quick profile, with the claims it records asserted."""
from __future__ import annotations


def test_routing_law_chapter(quick_runs):
    v = quick_runs("routing_law")["values"]
    assert v["n_configs"] >= 20 and v["n_causal"] > 0 and v["n_padding"] > 0 and v["n_smooth_loss"] > 0
    assert v["max_rel_error"] <= 1e-12  # R1-R3 closed forms equal autograd in float64
    assert v["max_row_sum_rel"] <= 1e-12  # rows of dL/ds sum to zero
    assert v["example_sign_agreement"] == 1.0  # sign rule on every visible entry
    assert v["example_max_abs_error"] <= 1e-14


def test_value_law_chapter(quick_runs):
    v = quick_runs("value_law")["values"]
    assert v["r2_example_error"] <= 1e-14
    # R4: remainder of the first-order prediction is O(eta^2)
    assert abs(v["slope_sv_mean"] - 2) < 0.05 and abs(v["slope_params_mean"] - 2) < 0.05
    assert 1.8 < v["slope_min"] and v["slope_max"] < 2.2
    assert v["first_order_rel_error_smallest_eta"] < 1e-3
