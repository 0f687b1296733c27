"""The selective SSM of R9: the materialized routing weights against the recurrence, the
closed-form gradients against autograd in float64 over many shapes, a slightly wrong closed
form caught, the model trained with fit, and the compiled scan. (The block against mambapy:
test_ssm_reference.py; the primitives' Bayes predictors: test_tasks_primitives.py.)"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attention_dynamics.gradcheck import random_ssm_inputs, relative_error
from attention_dynamics.ssm import SSMConfig, SSMModel, ssm_backward, ssm_scan, ssm_weights
from attention_dynamics.tasks.primitives import Accumulation


def _inputs(Bt, T, Dc, N, seed):
    return random_ssm_inputs(Bt, T, Dc, N, seed)[:6]


@settings(max_examples=40, deadline=None, derandomize=True)
@given(Bt=st.integers(1, 3), T=st.integers(1, 9), Dc=st.integers(1, 5), N=st.integers(1, 4), seed=st.integers(0, 10**6))
def test_the_materialized_weights_are_the_recurrence(Bt, T, Dc, N, seed):
    """y_t = sum_j w_tj x_j + D x_t reproduces the scan, and w is zero above the diagonal."""
    x, delta, A, B, C, D = _inputs(Bt, T, Dc, N, seed)
    w = ssm_weights(delta, A, B, C)
    assert w.shape == (Bt, Dc, T, T) and torch.all(w.triu(1) == 0)
    routed = torch.einsum("bctj,bjc->btc", w, x) + D * x
    assert relative_error(routed, ssm_scan(x, delta, A, B, C, D)) <= 1e-12


@settings(max_examples=40, deadline=None, derandomize=True)
@given(Bt=st.integers(1, 3), T=st.integers(1, 9), Dc=st.integers(1, 5), N=st.integers(1, 4), seed=st.integers(0, 10**6))
def test_the_closed_form_gradients_are_autograds(Bt, T, Dc, N, seed):
    """Every closed form of ssm_backward against autograd through the recurrence, float64,
    at most 1e-12 relative; and b = dL/dw: autograd through the materialized weights."""
    x, delta, A, B, C, D = _inputs(Bt, T, Dc, N, seed)
    leaves = [t.clone().requires_grad_() for t in (x, delta, A, B, C, D)]
    y = ssm_scan(*leaves)
    u = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    auto = torch.autograd.grad(y, leaves, u)
    closed = ssm_backward(u, x, delta, A, B, C, D)
    # relative to the largest gradient: one that is exactly zero (A with T = 1) keeps only
    # the rounding of its terms, and no relative error against zero can hold
    largest = max(float(a.abs().max()) for a in auto)
    for name, a in zip(("x", "delta", "A", "B", "C", "D"), auto):
        assert relative_error(getattr(closed, name), a, scale=largest) <= 1e-12, name
    w = ssm_weights(delta, A, B, C).requires_grad_()
    (dw,) = torch.autograd.grad(torch.einsum("bctj,bjc->btc", w, x), w, u)
    assert relative_error(closed.b, dw * torch.ones(T, T, dtype=torch.float64).tril()) <= 1e-12


def test_a_slightly_wrong_closed_form_is_caught(monkeypatch):
    """The comparison above can fail: with the decays computed at A * (1 + 1e-6) inside the
    closed forms, every routing gradient is off by far more than 1e-12."""
    import attention_dynamics.ssm as ssm

    x, delta, A, B, C, D = _inputs(2, 6, 3, 2, 0)
    leaves = [t.clone().requires_grad_() for t in (x, delta, A, B, C, D)]
    u = torch.ones(2, 6, 3, dtype=torch.float64)
    auto = torch.autograd.grad(ssm_scan(*leaves), leaves, u)
    right = ssm._decay
    monkeypatch.setattr(ssm, "_decay", lambda d, a: right(d, a * (1 + 1e-6)))
    wrong = ssm_backward(u, x, delta, A, B, C, D)
    for name, a in zip(("delta", "A", "B", "C"), auto[1:5]):
        assert relative_error(getattr(wrong, name), a) > 1e-9, name


def test_the_model_trains_with_fit_and_validates_its_input():
    from attention_dynamics.transformer import fit

    task = Accumulation(K=3, T=8)
    torch.manual_seed(0)
    model = SSMModel(SSMConfig(n_out=3, d_model=8, n_layers=1, d_state=2, input="tokens", vocab=3))
    rng = np.random.default_rng(0)
    hist = fit(model, lambda: (lambda b: (b.inputs, b.targets))(task.sample(32, rng)), 60, lr=1e-2)
    assert hist.loss[-1] < hist.loss[0]
    roles = model.parameter_roles()
    assert any("x_proj" in n for n in roles["routing"]) and any("in_proj" in n for n in roles["values"])
    with pytest.raises(ValueError, match="token ids must lie in"):
        model(torch.full((1, 4), 3))
    with pytest.raises(ValueError, match="d_state"):
        SSMConfig(n_out=2, d_state=0, d_in=3)
    with pytest.raises(ValueError, match="A must have shape"):
        ssm_scan(torch.zeros(1, 2, 3), torch.zeros(1, 2, 3), torch.zeros(2, 1), torch.zeros(1, 2, 1),
                 torch.zeros(1, 2, 1))


def test_r9_functions_name_what_is_wrong():
    from attention_dynamics.primitive_models import PrimitivesConfig, build_model
    from attention_dynamics.routing_probe import routing_probe
    from attention_dynamics.ssm import ssm_scan
    from attention_dynamics.tasks.primitives import make_task

    x, d = torch.randn(2, 5, 3, dtype=torch.float64), torch.rand(2, 5, 3, dtype=torch.float64)
    A, B, C = -torch.rand(3, 4, dtype=torch.float64), torch.randn(2, 5, 4, dtype=torch.float64), torch.randn(2, 5, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"D must have shape \(3,\)"):
        ssm_scan(x, d, A, B, C, D=torch.ones(5, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"accumulation has no setting\(s\) \['bogus'\]"):
        make_task("accumulation", bogus=1)
    task = make_task("accumulation")
    model = build_model("ssm", task, PrimitivesConfig(), 0)
    batch = task.sample(2, np.random.default_rng(0))
    with pytest.raises(TypeError, match="lrs must be a list of at least 1 numbers"):
        routing_probe(model, batch, [])
    with pytest.raises(TypeError, match="model must be a CausalTransformer or an SSMModel, got Linear"):
        routing_probe(torch.nn.Linear(2, 2), batch, [1e-3])


def scan_error_bounds(x, delta, A, B, C, gy) -> list[torch.Tensor]:
    """Float32 error bounds of the scan's output and of the gradients of x, delta, A, B, C,
    entry by entry: gamma_n (support.gamma) times the size of each sum, the recurrence run
    in float64 on absolute values (a running-error bound, as head_error_bounds in
    test_sticky_chain). Each step of the recurrence rounds about nine times (delta A, exp at
    4 ulp, a h, delta x, times B, the sum), the backward pass as many again, and y and the
    gradients sum N or Dc terms: n = 18 T + 2 max(N, Dc) + 8."""
    from support import gamma

    a = torch.exp(delta[..., None] * A)  # (Bt, T, Dc, N), in (0, 1]
    drive = (delta * x.abs())[..., None] * B.abs()[:, :, None, :]
    Bt, T, Dc, N = a.shape
    h = torch.zeros(Bt, T + 1, Dc, N, dtype=a.dtype)  # h[:, t + 1] = h_t, h[:, 0] = 0
    for t in range(T):
        h[:, t + 1] = a[:, t] * h[:, t] + drive[:, t]
    lam = torch.zeros(Bt, T + 1, Dc, N, dtype=a.dtype)  # the adjoint of h_t, lam[:, T] = 0
    for t in reversed(range(T)):
        nxt = a[:, t + 1] * lam[:, t + 1] if t + 1 < T else 0
        lam[:, t] = C.abs()[:, t, None, :] * gy.abs()[:, t, :, None] + nxt
    hs, hp, lam = h[:, 1:], h[:, :-1], lam[:, :T]
    sizes = [
        (C.abs()[:, :, None, :] * hs).sum(-1),  # y
        delta * (B.abs()[:, :, None, :] * lam).sum(-1),  # x
        ((A.abs() * a * hp + x.abs()[..., None] * B.abs()[:, :, None, :]) * lam).sum(-1),  # delta
        (delta[..., None] * a * hp * lam).sum((0, 1)),  # A
        ((delta * x.abs())[..., None] * lam).sum(2),  # B
        (hs * gy.abs()[..., None]).sum(2),  # C
    ]
    n = 18 * T + 2 * max(N, Dc) + 8
    return [gamma(n) * s for s in sizes]


@pytest.mark.parametrize("Bt, T, Dc, N", [(1, 1, 1, 1), (2, 5, 3, 4), (3, 17, 6, 8), (4, 32, 64, 8), (2, 9, 5, 16)])
def test_the_compiled_scan_is_the_recurrence(Bt, T, Dc, N):
    """float32 kernel (forward and backward) against the float64 recurrence, each entry
    within its float32 error bound (:func:`scan_error_bounds`)."""
    from attention_dynamics.native import selective_scan_kernel

    from support import kernel_or_skip

    kernel_or_skip(lambda: selective_scan_kernel(N))
    g = torch.Generator().manual_seed(Bt * 1000 + T)
    F64 = torch.float64
    x, B, C = (torch.randn(*s, generator=g, dtype=F64) for s in ((Bt, T, Dc), (Bt, T, N), (Bt, T, N)))
    delta = torch.rand(Bt, T, Dc, generator=g, dtype=F64) + 0.05
    A = -torch.rand(Dc, N, generator=g, dtype=F64) - 0.1
    gy = torch.randn(Bt, T, Dc, generator=g, dtype=F64)
    ins32 = [t.float() for t in (x, delta, A, B, C)]
    ref_in = [t.double().requires_grad_() for t in ins32]  # the float32 inputs, exactly
    ref = ssm_scan(*ref_in, compiled=False)
    ref_grads = torch.autograd.grad(ref, ref_in, gy)
    ins = [t.clone().requires_grad_() for t in ins32]
    y = ssm_scan(*ins, compiled=True)
    grads = torch.autograd.grad(y, ins, gy.float())
    bounds = scan_error_bounds(*[t.detach() for t in ref_in], gy)
    for name, got, want, bound in zip(("y", "x", "delta", "A", "B", "C"), (y, *grads), (ref, *ref_grads), bounds):
        err = (got.double() - want).abs()
        assert bool((err <= bound).all()), f"{name}: error {float(err.max()):.3g}, share of its bound {float((err / bound).max()):.3g}"
