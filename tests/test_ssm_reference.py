"""Our selective SSM block against the reference implementation it follows (mambapy)."""
from __future__ import annotations


import pytest



def test_the_block_is_mambapys_block():
    """Our block with the reference implementation's state dict gives its output: in
    float32, to rounding; in float64, to 1e-14 against both of its scans once A and D are
    rounded to float32 as mambapy does internally (it casts A_log and D to float32)."""
    pytest.importorskip("mambapy.mamba")
    from attention_dynamics.ssm_reference import mambapy_agreement

    rows = mambapy_agreement([(16, 4, 2, 11), (8, 16, 1, 5), (32, 8, 2, 1), (24, 3, 3, 17)])
    for r in rows:
        assert r["float32"] <= 1e-5 and r["float64"] <= 1e-14 and r["float64, parallel scan"] <= 1e-12, r
