"""The laws through the parameterization (law_probe.kernel_law_probe): after a plain step on
parameters theta, Delta s = -eta J J^T g + O(eta^2), g = dL/ds, J = ds/dtheta. Positive
controls where J is known (free scores, J = I; bilinear scores, J in closed form), the probe
on a small wind-tunnel transformer at initialization, negative controls (wrong laws fed to
the same instrument), and the first layer's ceiling. Everything in float64; each tolerance
says where it comes from (eps = 2.2e-16, the float64 unit roundoff)."""
from __future__ import annotations

import copy
import math

import pytest
import torch

from attention_dynamics.law_probe import (centre_rows, first_order_error, jacobian_vector_product, kernel_cosine,
                                          kernel_law_probe, loglog_slope, realized_changes, supervised_rows,
                                          tuple_ceiling)
from attention_dynamics.tasks.bijection import WindTunnel, sample_batch
from attention_dynamics.windtunnel import WindTunnelConfig, supervised_log_probs

EPS = torch.finfo(torch.float64).eps
LRS = (1e-4, 1e-3, 1e-2)


def _causal(T):
    return torch.ones(T, T, dtype=torch.bool).tril()


def _head_loss(s, values, W, y):
    """Mean cross-entropy of a read-out of softmax(s) @ values: a loss of free scores."""
    alpha = torch.softmax(s, -1)
    logits = (alpha @ values).transpose(1, 2).reshape(s.shape[0], s.shape[2], -1) @ W
    return torch.nn.functional.cross_entropy(logits.reshape(-1, W.shape[1]), y.reshape(-1))


def _toy(seed=0, B=3, H=2, T=5, d=3, C=4):
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(B, H, T, d, generator=g, dtype=torch.float64)
    W = torch.randn(H * d, C, generator=g, dtype=torch.float64)
    y = torch.randint(0, C, (B, T), generator=g)
    return values, W, y


# ---------------------------------------------------------------- positive controls

def test_free_scores_the_kernel_is_the_identity_and_the_law_passes_whole():
    """Scores that are themselves the parameters (J = I): the kernel-projected step is -eta g
    exactly, the realized step equals it up to the rounding of theta - eta g, and the cosine
    of J J^T g with g is 1."""
    values, W, y = _toy()
    B, H, T = values.shape[:3]
    mask = _causal(T)
    theta = torch.randn(B, H, T, T, generator=torch.Generator().manual_seed(1), dtype=torch.float64,
                        requires_grad=True)

    def scores():
        return theta.masked_fill(~mask, float("-inf"))

    s = scores()
    g, = torch.autograd.grad(_head_loss(s, values, W, y), theta, retain_graph=True)
    kg, = jacobian_vector_product([s], [theta], [g])
    # J = I on the visible entries, 0 on the hidden ones (masked_fill): the product is g
    # itself, bit for bit (the double backward only multiplies by ones and adds zeros)
    assert torch.equal(kg, torch.where(mask, g, torch.zeros(())))
    visible = mask.expand_as(g)
    steps = realized_changes(lambda: [scores()], [theta], [g], LRS)
    for eta, (ds,) in zip(LRS, steps):
        err = first_order_error(ds, -eta * kg, visible=visible)
        # Delta s = fl(fl(theta - eta g) - theta): two roundings of size eps |theta| per
        # entry, against a change of size eta |g| (centring adds at most a factor 2)
        bound = 4 * EPS * theta.detach().norm() / (eta * centre_rows(g, visible).norm())
        assert float(err.max()) <= float(bound), (eta, err, bound)
    rows = supervised_rows(g)
    assert not bool(rows[:, :, 0].any()) and bool(rows[:, :, 1:].all())  # the first query sees one key
    # cosine of g with itself: T-term sums, rounding ~ T eps
    torch.testing.assert_close(kernel_cosine(kg, g, rows), torch.ones(H, dtype=torch.float64), rtol=0, atol=1e3 * EPS)


def test_bilinear_scores_first_order_check_is_exact_to_the_second_order_term():
    """s = Q K^T / sqrt(d) with Q, K the parameters: J J^T g = (g K K^T + Q Q^T g) / d in
    closed form, and the realized step is exactly s - eta J J^T g + eta^2 dQ dK^T / sqrt(d),
    so the relative error is eta |c(dQ dK^T)| / (sqrt(d) |c(J J^T g)|): slope 1 on the
    log-log plot."""
    values, W, y = _toy(2)
    B, H, T, d = values.shape
    gen = torch.Generator().manual_seed(3)
    Q = torch.randn(B, H, T, d, generator=gen, dtype=torch.float64, requires_grad=True)
    K = torch.randn(B, H, T, d, generator=gen, dtype=torch.float64, requires_grad=True)
    mask = _causal(T)
    visible = mask.expand(B, H, T, T)

    def scores():
        return (Q @ K.transpose(-1, -2) / math.sqrt(d)).masked_fill(~mask, float("-inf"))

    s = scores()
    g, dQ, dK = torch.autograd.grad(_head_loss(s, values, W, y), [s, Q, K], retain_graph=True)
    kg, = jacobian_vector_product([s], [Q, K], [dQ, dK])
    closed = torch.where(mask, (g @ K @ K.transpose(-1, -2) + Q @ Q.transpose(-1, -2) @ g).detach() / d,
                         torch.zeros(()))
    # sums of T d terms of size |g| |K|^2: rounding a few hundred eps of the largest entry
    assert float((kg - closed).abs().max()) <= 1e3 * EPS * float(closed.abs().max())
    steps = realized_changes(lambda: [scores()], [Q, K], [dQ, dK], LRS)
    errors = torch.stack([first_order_error(ds, -eta * kg, visible=visible) for eta, (ds,) in zip(LRS, steps)], 1)
    second = centre_rows((dQ @ dK.transpose(-1, -2)) / math.sqrt(d), visible)

    def per_head(x):
        return x.transpose(0, 1).reshape(H, -1).norm(dim=1)

    # rounding of the realized change: Q - eta dQ, K - eta dK and the d-term products s, s'
    # are each rounded to eps of |Q| |K|^T / sqrt(d); against the change eta |c(kg)| (and a
    # factor 2 for centring)
    qk = per_head((Q.detach().abs() @ K.detach().abs().transpose(-1, -2) / math.sqrt(d)).masked_fill(~mask, 0))
    for e, eta in enumerate(LRS):
        exact = eta * per_head(second) / per_head(centre_rows(kg, visible))
        bound = 2 * (d + 3) * EPS * qk / (eta * per_head(centre_rows(kg, visible)))
        assert bool(((errors[:, e] - exact).abs() <= bound).all()), (errors[:, e] - exact, bound)
        assert bool((bound < 1e-2 * exact).all())  # the check is sharp: rounding well below the error
    for h in range(H):
        # each error is exact to within 1e-2 of itself (above), so each log to 1e-2, and the
        # slope over ln(100) = 4.6 of log eta to 2e-2 / 4.6 < 5e-3
        assert abs(loglog_slope(LRS, errors[h].tolist()) - 1) < 5e-3


def test_jacobian_vector_product_matches_the_explicit_jacobian():
    """J t against torch.autograd.functional.jacobian on a small non-linear map of two
    parameter tensors (one output independent of the second, one of neither)."""
    gen = torch.Generator().manual_seed(4)
    a = torch.randn(3, 2, generator=gen, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, generator=gen, dtype=torch.float64, requires_grad=True)
    ta, tb = torch.randn(3, 2, generator=gen, dtype=torch.float64), torch.randn(4, generator=gen, dtype=torch.float64)

    def f(a, b):
        return torch.tanh(a @ a.T).sum(0) * b[:3], torch.sin(a).exp()

    outs = f(a, b)
    got = jacobian_vector_product(list(outs) + [torch.ones(2, dtype=torch.float64)], [a, b], [ta, tb])
    jac = torch.autograd.functional.jacobian(f, (a.detach(), b.detach()))  # jac[output][input]
    for i in range(2):
        want = (jac[i][0].reshape(outs[i].numel(), -1) @ ta.reshape(-1) + jac[i][1].reshape(outs[i].numel(), -1) @ tb)
        # a handful of terms each: rounding ~ 10 eps of the entries
        torch.testing.assert_close(got[i].reshape(-1), want, rtol=0, atol=1e-13)
    assert torch.equal(got[2], torch.zeros(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="tangents\\[1\\] must have the shape"):
        jacobian_vector_product(outs, [a, b], [ta, ta])


# ---------------------------------------------------------------- the small transformer

@pytest.fixture(scope="module")
def small():
    """A 2-layer, 2-head, 16-wide wind-tunnel transformer at initialization, V = 4, L = 3,
    on 16 sequences: 4 heads of 2 query rows x 7 positions."""
    cfg = WindTunnelConfig(V=4, L=3, d_model=16, n_layers=2, n_heads=2, n_steps=10, batch=16)
    task = cfg.task
    tokens, targets = sample_batch(task, 16, torch.Generator().manual_seed(1))
    model = cfg.model()
    state = copy.deepcopy(model.state_dict())
    probe = kernel_law_probe(model, task, tokens, targets, lrs=LRS)
    for name, t in model.state_dict().items():  # the model is untouched
        assert torch.equal(t, state[name])
    return cfg, model, task, tokens, targets, probe


def test_probe_reports_one_documented_record_per_head(small):
    cfg, model, _, _, _, probe = small
    assert [(p["layer"], p["head"]) for p in probe] == [(l, h) for l in range(2) for h in range(2)]
    for p in probe:
        for key in ("kernel_rel_error_layer", "kernel_rel_error_all", "values_rel_error_wv",
                    "values_rounding_bound_wv", "values_rel_error_all"):
            assert len(p[key]) == len(LRS)
        assert (p["ceiling_layer0"] is None) == (p["layer"] > 0)
        assert p["lrs"] == list(LRS)
    # the first query row is zero in every layer; in the last layer so are the rows at the 3
    # unsupervised positions: 3 of 7 rows are read there, 6 of 7 in the first
    assert [p["supervised_rows_share"] for p in probe] == pytest.approx([6 / 7] * 2 + [3 / 7] * 2, abs=1e-12)


def test_r1_and_r2_hold_in_situ_to_float64_rounding(small):
    """The closed forms against autograd's dL/ds and dL/dv in every head: below the derived
    a-priori rounding bound (reported with them, 2 (d_h + T + 2) eps times the cancellation
    factor for R1, 2 T eps times it for R2), itself far below any modelling error."""
    for p in small[-1]:
        assert p["r1_insitu_rel_error"] <= p["r1_insitu_rounding_bound"] < 1e-11
        assert p["r2_insitu_rel_error"] <= p["r2_insitu_rounding_bound"] < 1e-11


def test_the_kernel_prediction_is_first_order_in_eta(small):
    """Realized Delta s (row-centred) against -eta J J^T g: the remainder is O(eta^2) against
    an O(eta) prediction, so the relative error falls like eta: log-log slope within 0.2 of
    1, and the error at eta = 1e-4 below that at 1e-2 by about their ratio 100 (between 100 /
    10^0.4 and 100 * 10^0.4, the same 0.2 of slope over two decades). Same for the values
    when all parameters move. With only W_V moving the values' prediction is exact (v is
    linear in W_V): the error stays under its derived rounding bound."""
    ratio = LRS[-1] / LRS[0]
    for p in small[-1]:
        for key in ("kernel_rel_error_layer", "kernel_rel_error_all", "values_rel_error_all"):
            e = p[key]
            assert abs(loglog_slope(LRS, e) - 1) < 0.2, (key, e)
            assert ratio / 10 ** 0.4 < e[-1] / e[0] < ratio * 10 ** 0.4, (key, e)
            assert e[-1] < 0.1  # still in the first-order regime at the largest eta
        assert abs(p["kernel_slope_layer"] - 1) < 0.2 and abs(p["kernel_slope_all"] - 1) < 0.2
        for e, bound in zip(p["values_rel_error_wv"], p["values_rounding_bound_wv"]):
            assert e <= bound < 1e-8
        # the exact W_V prediction is orders below the first-order error of the full step
        assert max(p["values_rel_error_wv"]) < 1e-3 * p["values_rel_error_all"][0]


def test_cosines_are_observations_in_range(small):
    for p in small[-1]:
        for key in ("cos_kernel_g", "cos_kernel_g_centred", "cos_kernel_all_g", "cos_kernel_G_values"):
            assert -1 <= p[key] <= 1
        # g's rows sum to zero, so removing J J^T g's row means only drops a part orthogonal to g
        assert p["cos_kernel_g_centred"] >= p["cos_kernel_g"] - 1e-12


# ---------------------------------------------------------------- negative controls

def _layer_kernel(model, task, tokens, targets, layer, seed=7):
    """The probe's arithmetic for one layer's W_Q, W_K step, rebuilt from the public helpers:
    realized steps per eta, J J^T g, g, J J^T r for a random r (a wrong law: r in place of
    g, scaled to the size of J J^T g) and the visible mask. Every product is taken before
    the steps (they write the parameters in place)."""
    twin = copy.deepcopy(model).double().eval()
    logp, traces = supervised_log_probs(twin, tokens, task, inspect=True)
    loss = torch.nn.functional.nll_loss(logp.reshape(-1, task.V), targets.reshape(-1))
    block = twin.blocks[layer]
    ps = [block.q.weight, block.q.bias, block.k.weight, block.k.bias]
    s = traces[layer].attention.scores
    g, *grads = torch.autograd.grad(loss, [s] + ps, retain_graph=True)
    kg, = jacobian_vector_product([s], ps, grads)
    visible = torch.isfinite(s.detach())
    r = torch.where(visible, torch.randn(g.shape, generator=torch.Generator().manual_seed(seed),
                                         dtype=torch.float64), torch.zeros(()))
    kr, = jacobian_vector_product([s], ps, torch.autograd.grad(s, ps, grad_outputs=r, retain_graph=True))
    kr = kr * (kg.norm() / kr.norm())
    steps = realized_changes(lambda: [twin(tokens, inspect=True)[1][layer].attention.scores], ps, grads, LRS)
    return [st[0] for st in steps], kg, g, kr, torch.isfinite(s.detach())


@pytest.mark.parametrize("layer", [0, 1])
def test_a_wrong_law_fails_the_first_order_check_and_the_cosine(small, layer):
    """The same instrument fed wrong laws: the sign-flipped prediction (error 2 at every eta:
    |x + x| / |x| after removing a remainder that vanishes with eta) and J J^T r for a random
    r in place of g (error of order 1 or more, not shrinking: slope near 0). A random
    tensor's cosine with g is near 0: for N entries it is ~ N(0, 1/N), bounded here by
    4 / sqrt(N)."""
    _, model, task, tokens, targets, _ = small
    steps, kg, g, kr, visible = _layer_kernel(model, task, tokens, targets, layer)
    right = torch.stack([first_order_error(d, -eta * kg, visible=visible) for eta, d in zip(LRS, steps)], 1)
    flipped = torch.stack([first_order_error(d, eta * kg, visible=visible) for eta, d in zip(LRS, steps)], 1)
    gen = torch.Generator().manual_seed(8)
    wrong = torch.stack([first_order_error(d, -eta * kr, visible=visible) for eta, d in zip(LRS, steps)], 1)
    for h in range(g.shape[1]):
        assert right[h, 0] < 1e-5
        torch.testing.assert_close(flipped[h], torch.full_like(flipped[h], 2.0), rtol=1e-5, atol=1e-3)
        assert abs(loglog_slope(LRS, flipped[h].tolist())) < 0.01
        assert float(wrong[h].min()) > 0.5 and abs(loglog_slope(LRS, wrong[h].tolist())) < 0.05
    rows = supervised_rows(g)
    n = int(rows[:, 0].sum()) * (task.length + 1) // 2  # about N entries per head (visible, read rows)
    noise = torch.where(visible, torch.randn(g.shape, generator=gen, dtype=torch.float64), torch.zeros(()))
    assert float(kernel_cosine(noise, g, rows).abs().max()) < 4 / math.sqrt(n)
    assert torch.allclose(kernel_cosine(-g, g, rows), -torch.ones(g.shape[1], dtype=torch.float64), atol=1e-12)


# ---------------------------------------------------------------- the layer-0 ceiling

def test_layer0_kernel_step_is_a_function_of_the_tuple_and_stays_under_the_ceiling(small):
    """In the first block a score depends on (token_i, i, token_j, j) only, so J J^T g does
    too: projecting it onto functions of the tuple leaves it unchanged (to rounding), and on
    a batch where tuples repeat the ceiling |P g| / |g| is below 1 and bounds the measured
    cosine (up to the rounding of N-term sums, N < 1000 here: 1e-12)."""
    cfg, model, task, tokens, targets, probe = small
    T = task.length
    causal = _causal(T)
    n_entries = tokens.shape[0] * int(causal.sum())
    keys = {(int(tokens[b, i]), i, int(tokens[b, j]), j) for b in range(tokens.shape[0]) for i in range(T)
            for j in range(i + 1)}
    assert len(keys) < n_entries  # tuples do repeat in this batch
    _, kg, g, _, _ = _layer_kernel(model, task, tokens, targets, 0)
    rows = supervised_rows(g)
    # |P kg| / |kg| = 1 exactly when kg is a function of the tuple; group means of up to 16
    # equal numbers: rounding ~ 16 eps
    assert torch.allclose(tuple_ceiling(kg, tokens, rows), torch.ones(kg.shape[1], dtype=torch.float64),
                          atol=1e-12, rtol=0)
    for p in probe[:2]:
        assert p["ceiling_layer0"] < 0.99
        assert p["cos_kernel_g"] <= p["ceiling_layer0"] + 1e-12
    # more batches and seeds: never above the ceiling
    for seed in (1, 2):
        m = WindTunnelConfig(**{**vars(cfg), "seed": seed}).model()
        tok, tgt = sample_batch(task, 24, torch.Generator().manual_seed(10 + seed))
        for p in kernel_law_probe(m, task, tok, tgt, lrs=(1e-4, 1e-3)):
            if p["layer"] == 0:
                assert p["cos_kernel_g"] <= p["ceiling_layer0"] + 1e-12 < 1


def test_the_ceiling_is_one_for_a_function_of_the_tuple_and_zero_for_its_complement():
    task = WindTunnel(4, 3)
    tokens, _ = sample_batch(task, 20, torch.Generator().manual_seed(3))
    B, T, H = tokens.shape[0], task.length, 2
    gen = torch.Generator().manual_seed(5)
    table = torch.randn(H, task.V, T, task.V, T, generator=gen, dtype=torch.float64)
    i = torch.arange(T)
    f = table[:, tokens[:, :, None], i[:, None], tokens[:, None, :], i[None, :]]  # (H, B, T, T)
    f = torch.where(_causal(T), f.transpose(0, 1), torch.zeros(()))
    # group means of a constant group reproduce it up to ~ (group size) eps
    torch.testing.assert_close(tuple_ceiling(f, tokens), torch.ones(H, dtype=torch.float64), rtol=0, atol=1e-12)
    rows = torch.rand(B, H, T, generator=gen) < 0.6
    torch.testing.assert_close(tuple_ceiling(f, tokens, rows), torch.ones(H, dtype=torch.float64), rtol=0, atol=1e-12)
    # a generic g: strictly between; its part with zero group means: ceiling 0
    g = torch.where(_causal(T), torch.randn(B, H, T, T, generator=gen, dtype=torch.float64), torch.zeros(()))
    c = tuple_ceiling(g, tokens)
    assert bool(((c > 0) & (c < 1)).all())
    proj = g.clone()
    for h in range(H):  # remove each tuple's mean by brute force
        groups: dict = {}
        for b in range(B):
            for a in range(T):
                for j in range(a + 1):
                    groups.setdefault((int(tokens[b, a]), a, int(tokens[b, j]), j), []).append((b, a, j))
        for members in groups.values():
            mean = sum(float(g[b, h, a, j]) for b, a, j in members) / len(members)
            for b, a, j in members:
                proj[b, h, a, j] -= mean
    assert float(tuple_ceiling(proj, tokens).max()) < 1e-12
    # and the brute-force projection agrees with the ceiling: |P g|^2 = |g|^2 - |g - P g|^2
    assert torch.allclose(c ** 2, 1 - proj.transpose(0, 1).reshape(H, -1).norm(dim=1) ** 2
                          / g.transpose(0, 1).reshape(H, -1).norm(dim=1) ** 2, atol=1e-12)


# ---------------------------------------------------------------- arguments

def test_kernel_law_probe_refuses_bad_arguments(small):
    cfg, model, task, tokens, targets, _ = small
    with pytest.raises(TypeError, match="model must be a CausalTransformer"):
        kernel_law_probe(torch.nn.Linear(2, 2), task, tokens, targets)
    with pytest.raises(TypeError, match="task must be a WindTunnel"):
        kernel_law_probe(model, "bijection", tokens, targets)
    with pytest.raises(ValueError, match="symbols"):
        kernel_law_probe(model, WindTunnel(5, 3), tokens, targets)
    with pytest.raises(ValueError, match="tokens must be"):
        kernel_law_probe(model, task, tokens[:, :-1], targets)
    with pytest.raises(ValueError, match="targets must be"):
        kernel_law_probe(model, task, tokens, targets[:, :-1])
    with pytest.raises(ValueError, match="tokens must lie"):
        kernel_law_probe(model, task, tokens + 4, targets)
    with pytest.raises(TypeError, match="tokens must have an integer dtype"):
        kernel_law_probe(model, task, tokens.double(), targets)
    with pytest.raises(TypeError, match="lrs must be a list of at least 2"):
        kernel_law_probe(model, task, tokens, targets, lrs=(1e-3,))
    with pytest.raises(ValueError, match="lrs\\[1\\] must be a finite number"):
        kernel_law_probe(model, task, tokens, targets, lrs=(1e-3, -1.0))
    with pytest.raises(ValueError, match="distinct"):
        kernel_law_probe(model, task, tokens, targets, lrs=(1e-3, 1e-3))
