"""R1-R3 closed forms against autograd in float64, over configurations drawn by hypothesis."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attention_dynamics.gradcheck import GradConfig, compare_with_autograd, random_config
from attention_dynamics.head import attend, init_head
from attention_dynamics.laws import (advantage, attention_entropy, compatibility, expected_compatibility,
                                     loss_and_gradients, routing_gradient, value_gradient)

TOL = 1e-12


@st.composite
def configs(draw):
    causal = draw(st.booleans())
    T = draw(st.integers(1, 10))
    S = T if causal else draw(st.integers(1, 10))
    return GradConfig(
        batch=draw(st.integers(1, 3)), heads=draw(st.integers(1, 3)), T=T, S=S,
        d_x=draw(st.integers(1, 7)), d_k=draw(st.integers(1, 7)), d_v=draw(st.integers(1, 7)),
        n_classes=draw(st.integers(2, 6)), causal=causal, padding=draw(st.booleans()),
        loss=draw(st.sampled_from(["cross_entropy", "smooth"])),
    )


@settings(max_examples=150, deadline=None, derandomize=True)
@given(cfg=configs(), seed=st.integers(0, 2**31 - 1))
def test_closed_forms_match_autograd(cfg, seed):
    errors = compare_with_autograd(cfg, seed)
    expected = {"scores", "q", "k", "v", "row_sum", "W_Q", "W_K", "W_V"} | ({"W_O"} if cfg.loss == "cross_entropy" else set())
    assert set(errors) == expected
    # A quantity that is exactly zero (one key: no routing gradient) keeps only the rounding
    # of its terms, and a relative error against zero cannot hold: it is judged, as
    # torch.testing's atol does, against the size of the head's largest gradient, whose
    # terms it shares (TOL is ~10^4 float64 roundings of it).
    largest = max((a / r for a, r in errors.values() if r > 0), default=0.0)
    for name, (abs_err, rel_err) in errors.items():
        assert abs_err <= TOL * largest, f"{name}: error {abs_err:.2e}, relative {rel_err:.2e} for {cfg}"


def test_comparison_detects_a_wrong_law(monkeypatch):
    """The comparison can fail: a routing law without the baseline E[b] is caught."""
    import attention_dynamics.laws as laws

    monkeypatch.setattr(laws, "routing_gradient", lambda w, b: w * b)
    cfg = GradConfig(batch=2, heads=2, T=5, S=5, d_x=4, d_k=3, d_v=3, n_classes=4, causal=True, padding=False,
                     loss="cross_entropy")
    errors = compare_with_autograd(cfg, 0)
    assert errors["scores"][1] > 1e-3 and errors["W_Q"][1] > 1e-3


@settings(max_examples=40, deadline=None, derandomize=True)
@given(T=st.integers(1, 9), S=st.integers(1, 9), d=st.integers(1, 6), causal=st.booleans(), seed=st.integers(0, 10**6))
def test_forward_matches_torch_sdpa(T, S, d, causal, seed):
    if causal:
        S = T
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 3, n, d, generator=g, dtype=torch.float64) for n in (T, S, S))
    att = attend(q, k, v, causal=causal)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.testing.assert_close(att.output, ref, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(att.weights.sum(-1), torch.ones(2, 3, T, dtype=torch.float64), rtol=1e-5, atol=1e-14)


def test_hidden_keys_get_zero_weight_and_zero_gradient():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 1, 4, 3, generator=g, dtype=torch.float64) for _ in range(3))
    km = torch.tensor([[True, True, False, False], [True, True, True, True]])[:, None, :]
    att = attend(q, k, v, causal=True, key_mask=km)
    assert torch.all(att.weights[0, 0, :, 2:] == 0)
    assert torch.all(torch.triu(att.weights[1, 0], 1) == 0)
    u = torch.randn(2, 1, 4, 3, generator=g, dtype=torch.float64)
    ds = routing_gradient(att.weights, compatibility(u, v))
    assert torch.all(ds[0, 0, :, 2:] == 0)


def test_advantage_sign_rule_on_a_hand_case():
    w = torch.tensor([[0.5, 0.25, 0.25]], dtype=torch.float64)
    b = torch.tensor([[1.0, -1.0, 3.0]], dtype=torch.float64)
    assert expected_compatibility(w, b).item() == pytest.approx(1.0)
    assert advantage(w, b).tolist() == [[0.0, -2.0, 2.0]]
    assert routing_gradient(w, b).tolist() == [[0.0, -0.5, 0.5]]


def test_value_gradient_is_responsibility_weighted_sum():
    w = torch.tensor([[1.0, 0.0], [0.25, 0.75]], dtype=torch.float64)
    u = torch.tensor([[1.0, 2.0], [4.0, -4.0]], dtype=torch.float64)
    assert value_gradient(w, u).tolist() == [[2.0, 1.0], [3.0, -3.0]]


def test_attention_entropy_known_values():
    w = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]], dtype=torch.float64)
    assert attention_entropy(w).tolist() == pytest.approx([0.0, math.log(2), math.log(3)], abs=1e-15)


def test_random_configs_cover_all_cases():
    rng = np.random.default_rng(0)
    cfgs = [random_config(rng) for _ in range(200)]
    assert {c.causal for c in cfgs} == {True, False}
    assert {c.padding for c in cfgs} == {True, False}
    assert {c.loss for c in cfgs} == {"cross_entropy", "smooth"}
    assert any(c.S != c.T for c in cfgs) and any(c.heads > 1 for c in cfgs) and any(c.batch > 1 for c in cfgs)


def test_loss_and_gradients_float32_close_to_float64():
    g = torch.Generator().manual_seed(3)
    p64 = init_head(6, 4, 5, 3, heads=2, generator=g)
    x = torch.randn(2, 7, 6, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (2, 7), generator=g)
    l64, g64, *_ = loss_and_gradients(p64, x, y, causal=True)
    p32 = type(p64)(**{n: t.float() for n, t in p64.as_dict().items()})
    l32, g32, *_ = loss_and_gradients(p32, x.float(), y, causal=True)
    assert abs(l64.item() - l32.item()) < 1e-5
    for n in g64:
        torch.testing.assert_close(g32[n].double(), g64[n], rtol=1e-5, atol=1e-6)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(T=st.integers(1, 8), S=st.integers(1, 8), d_m=st.integers(1, 6), heads=st.integers(1, 3), seed=st.integers(0, 10**6))
def test_cross_attention_head_with_memory_matches_autograd(T, S, d_m, heads, seed):
    from attention_dynamics.head import HeadParams

    g = torch.Generator().manual_seed(seed)
    p = init_head(5, 3, 4, 3, heads=heads, d_m=d_m, std=0.7, generator=g)
    x = torch.randn(2, T, 5, generator=g, dtype=torch.float64)
    mem = torch.randn(2, S, d_m, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (2, T), generator=g)
    _, closed, *_ = loss_and_gradients(p, x, y, memory=mem)
    leaves = {n: t.clone().requires_grad_(True) for n, t in p.as_dict().items()}
    loss, *_ = loss_and_gradients(HeadParams(**leaves), x, y, memory=mem)
    loss.backward()
    largest = max(float(t.grad.abs().max()) for t in leaves.values())  # as above: no relative error against 0
    for n, t in leaves.items():
        err = float((closed[n] - t.grad).abs().max())
        assert err <= TOL * largest, (n, err)
