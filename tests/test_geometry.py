"""The geometry of a trained model (R8): calibration and geometry metrics on constructed cases
with known answers."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attention_dynamics.geometry import (attention_entropy_bits, calibration_errors, entropy_bits, key_orthogonality,
                                         pc_shares, random_frame_abs_cosine, spearman)


def test_calibration_metrics_on_known_cases():
    bayes = torch.tensor([2.0, 1.0, 0.0], dtype=torch.float64)
    uniform4 = torch.full((1, 1, 4), math.log(0.25))
    assert float(entropy_bits(uniform4)) == pytest.approx(2.0)
    logp = torch.log(torch.tensor([[[0.25] * 4, [0.5, 0.5, 0, 0], [1.0, 0, 0, 0]]], dtype=torch.float64))
    post = logp.exp()
    out = calibration_errors(logp, bayes, post)
    assert float(out["mae"]) == pytest.approx(0.0, abs=1e-12) and np.allclose(out["kl_bits"].numpy(), 0, atol=1e-12)
    wrong = torch.log(torch.full((1, 3, 4), 0.25, dtype=torch.float64))
    out = calibration_errors(wrong, bayes, post)
    np.testing.assert_allclose(out["abs_error_bits"].numpy(), [0.0, 1.0, 2.0], rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(out["kl_bits"].numpy(), [0.0, 1.0, 2.0], rtol=1e-5, atol=1e-8)


def test_geometry_metrics_on_constructed_cases():
    g = torch.Generator().manual_seed(0)
    line = torch.randn(500, 1, generator=g, dtype=torch.float64) @ torch.randn(1, 6, generator=g, dtype=torch.float64)
    assert pc_shares(line, 2)[0] == pytest.approx(1.0, abs=1e-10)
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # an exact simplex frame (centred basis vectors) has |cos| = 1/(k-1), the minimum
    keys = torch.eye(5, dtype=torch.float64).repeat(3, 1) + 2.0  # a shared offset must not matter
    sym = torch.arange(5).repeat(3)
    cos, base = key_orthogonality(keys, sym, 5)
    assert cos == pytest.approx(0.25, abs=1e-12) and base > cos
    assert random_frame_abs_cosine(5, 64) > 0.25
    w = torch.tensor([[1.0, 0, 0, 0], [0.25, 0.25, 0.25, 0.25]])
    assert attention_entropy_bits(w).tolist() == pytest.approx([0.0, 2.0])
