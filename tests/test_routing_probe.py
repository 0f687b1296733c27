"""The routing law in parameter space (routing_probe.routing_law_split): the split of the
routing gradient J^T b into the advantage channel J^T A and the row-mass channel J^T (b - A),
against closed forms on a synthetic map whose rows do not sum to one (the laws separate),
on a small transformer (softmax rows sum to one: the laws coincide to rounding) and on a
small selective SSM at initialization (unnormalized weights: they need not)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attention_dynamics.primitive_models import PrimitivesConfig, build_model
from attention_dynamics.routing_probe import _routing_split, _split_report, routing_law_split
from attention_dynamics.tasks.primitives import make_task

U64 = 2.0 ** -53  # unit roundoff of float64


def gamma(n: int) -> float:
    """Higham's gamma_n in float64: a sum or dot product of n terms, computed in any order,
    errs by at most gamma_n times the sum of its terms' magnitudes."""
    return n * U64 / (1 - n * U64)


# ---------------------------------------------------------------------------------------
# 1. A synthetic routing map with a closed form: w_tj = sigmoid(beta theta . x_tj) - shift
#    on j <= t (zero above the diagonal). Its rows do not sum to a constant, so the
#    row-mass channel is not zero: the laws separate, by construction.
# ---------------------------------------------------------------------------------------

def _synthetic(shift: float, seed: int, Bt: int = 2, T: int = 6, p: int = 3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(Bt, T, T, p, generator=g, dtype=torch.float64)
    b = torch.randn(Bt, T, T, generator=g, dtype=torch.float64)
    theta = torch.randn(p, generator=g, dtype=torch.float64).requires_grad_()
    beta = torch.tensor(1.3, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    w = (torch.sigmoid(beta * (x @ theta)) - shift) * mask
    return w, b, [theta, beta], x


def _by_hand(w, b, theta, beta, x, shift: float, mass_tol: float) -> dict:
    """The split in plain loops over rows and entries (numpy, no autograd): dw_tj/dtheta =
    s'_tj beta x_tj, dw_tj/dbeta = s'_tj theta . x_tj with s' = sigma (1 - sigma), and the
    row-mass channel as its formula reads, sum_t E_t dr_t/d(theta, beta). Also an entry-wise
    error scale S (see the test)."""
    w, b, x = (t.detach().numpy() for t in (w, b, x))
    th, be = theta.detach().numpy(), float(beta.detach())
    Bt, T, _, p = x.shape
    true, adv, mass, excl, scale = (np.zeros(p + 1) for _ in range(5))
    rows = np.zeros((Bt, T), dtype=bool)
    differs = n_in = 0
    for n in range(Bt):
        for t in range(T):
            ws, bs = w[n, t, : t + 1], b[n, t, : t + 1]
            r, size = ws.sum(), np.abs(ws).sum()
            rows[n, t] = inc = bool(abs(r) >= mass_tol * size and size > 0)
            E = (ws * bs).sum() / r if inc else 0.0  # excluded rows: no mean subtracted
            dr = np.zeros(p + 1)
            for j in range(t + 1):
                sig = w[n, t, j] + shift
                d = sig * (1 - sig) * np.append(be * x[n, t, j], th @ x[n, t, j])  # dw_tj/d(theta, beta)
                true += bs[j] * d
                adv += (bs[j] - E) * d
                dr += d
                if not inc:
                    excl += bs[j] * d
                else:
                    n_in += 1
                    differs += np.sign(bs[j]) != np.sign(bs[j] - E)
                # the error scale: |c_tj| for the weight of the entry, plus what the
                # rounding of E_t can add to it, at most 2 max|b_t| / mass_tol (E_t's sums
                # of t + 1 terms over |r_t| >= mass_tol sum|w_t|)
                scale += (abs(bs[j]) + abs(E) + 2 * np.abs(bs).max() / mass_tol) * np.abs(d)
            mass += E * dr
    return {"true": true, "advantage": adv, "row_mass": mass, "excluded": excl, "rows": rows,
            "differs": differs, "n_in": n_in, "scale": scale}


@pytest.mark.parametrize("shift, mass_tol, seed", [(0.0, 0.1, 0), (0.5, 0.25, 1)])
def test_split_matches_closed_form_where_the_laws_separate(shift, mass_tol, seed):
    """Positive control. shift = 0: positive weights whose rows sum to anything but one,
    every row included; shift = 0.5: weights of both signs, some rows excluded (their b
    enters J^T b and J^T A alike and the row-mass channel not at all). The core split
    (_routing_split, autograd) equals the hand computation to float64 rounding, J^T b =
    J^T A + J^T (b - A), and the row-mass channel is far from zero: the instrument sees
    the difference between the laws when there is one."""
    w, b, params, x = _synthetic(shift, seed)
    split = _routing_split(w, b, params, mass_tol)
    hand = _by_hand(w, b, *params, x, shift, mass_tol)
    assert torch.equal(split["rows"], torch.as_tensor(hand["rows"]))
    if shift:  # the case is meant to exercise both kinds of rows
        assert 0 < hand["rows"].sum() < hand["rows"].size
    else:
        assert hand["rows"].all()
    # Entry-wise error: both sides sum n = Bt T (T + 1) / 2 = 42 terms per parameter, each
    # a product of a handful of roundings (sigmoid and its derivative, about 10 ulp, in
    # torch and in numpy), so |autograd - hand| <= gamma(n + T + 16) * S_k with S_k the
    # hand computation's sum of the terms' magnitudes (widened for the rounding of E_t).
    Bt, T = b.shape[:2]
    bound = gamma(Bt * T * (T + 1) // 2 + T + 16) * hand["scale"]
    for key in ("true", "advantage", "row_mass", "excluded"):
        err = np.abs(split[key].numpy() - hand[key])
        assert np.all(err <= bound), (key, err, bound)
    # that bound is of order 1e-14 of the gradient here, well inside the ~1e-12 aimed at
    assert np.linalg.norm(bound) <= 1e-12 * np.linalg.norm(hand["true"])

    # The reported numbers, from the hand vectors. Each is a ratio of norms and inner
    # products of vectors known to |bound|; to first order a ratio errs by at most
    # 4 |bound| / (its smallest vector's norm), so that is the tolerance.
    rep = _split_report(split)
    g, a, m, e = (hand[k] for k in ("true", "advantage", "row_mass", "excluded"))
    nrm = np.linalg.norm
    tol = 4 * nrm(bound) / min(nrm(g), nrm(a), nrm(m))
    expect = {
        "cos_true_advantage": g @ a / (nrm(g) * nrm(a)),
        "row_mass_ratio": nrm(m) / nrm(g),
        "row_mass_share": nrm(m) ** 2 / (nrm(a) ** 2 + nrm(m) ** 2),
        "excluded_ratio": nrm(e) / nrm(g),
        "excluded_share": nrm(e) ** 2 / (nrm(g - e) ** 2 + nrm(e) ** 2),
    }
    for key, value in expect.items():
        assert abs(rep[key] - value) <= tol, (key, rep[key], value, tol)
    assert rep["sign_differs_share"] == hand["differs"] / hand["n_in"]  # a count: exact
    assert rep["rows_included"] == hand["rows"].mean()
    assert rep["n_params"] == 4 and rep["n_entries"] == hand["n_in"]
    # J^T b = J^T A + J^T (b - A): three products of one linear map, each within |bound|
    assert rep["split_residual"] <= 3 * nrm(bound) / nrm(g)
    # the laws separate: the row-mass channel is a sizeable part of the gradient, a million
    # times and more above what rounding could produce (the bound of the vectors)
    assert expect["row_mass_ratio"] >= 1e6 * nrm(bound) / nrm(g)
    assert expect["cos_true_advantage"] < 1 - 1e6 * tol
    print(f"\nsynthetic shift={shift}: row_mass_ratio {rep['row_mass_ratio']:.4f}, "
          f"cos {rep['cos_true_advantage']:.4f}, rows_included {rep['rows_included']:.3f}")


# ---------------------------------------------------------------------------------------
# 2. and 3. The models: one task, one small configuration, attention and the SSM
# ---------------------------------------------------------------------------------------

T_SEQ, N_SEQ = 16, 4
CFG = PrimitivesConfig(d_model=16, n_layers=2, n_heads=2, d_state=4)


@pytest.fixture(scope="module")
def task_and_batch():
    task = make_task("accumulation", T=T_SEQ)
    return task, task.sample(N_SEQ, np.random.default_rng(0))


def attention_bound() -> float:
    """How far from zero softmax attention's row-mass channel may come by rounding alone.
    Autograd's softmax backward turns the row-constant c_tj = E_t into alpha_tj E_t
    (1 - sum_j alpha_tj): the computed weights sum to one within gamma(2 T + 6) (T roundings
    of the normalization, T of the sum, a few of exp), so every entry is at most
    gamma(2 T + 6) alpha_tj |E_t|, where the true score gradient alpha_tj (b_tj - E_t) is of
    the size of alpha_tj |b|, and |E_t| <= max_j |b_tj| (E_t is a weighted mean). The
    parameters' gradient sums N = batch x heads x T (T + 1) / 2 such entries, whose
    rounding errors have no common sign: they grow like sqrt(N), not N."""
    N = N_SEQ * CFG.n_heads * T_SEQ * (T_SEQ + 1) // 2
    return gamma(2 * T_SEQ + 6) * math.sqrt(N)  # 1.4e-13 here


def test_softmax_attention_the_laws_coincide(task_and_batch):
    """A small CausalTransformer: rows of alpha sum to one, the row-mass channel is
    rounding (row_mass_ratio, and 1 - cos, below attention_bound), though b and the
    advantage differ in sign on a fair share of entries: the laws differ entry by entry
    in weight space and give the same parameter step."""
    task, batch = task_and_batch
    model = build_model("attention", task, CFG, 0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    rows = routing_law_split(model, batch)
    bound = attention_bound()
    assert [r["layer"] for r in rows] == list(range(1, CFG.n_layers + 1))
    for r in rows:
        print(f"\nattention layer {r['layer']}: " + ", ".join(f"{k} {v:.3g}" for k, v in r.items() if k != "layer"))
        assert r["row_mass_ratio"] <= bound
        assert r["cos_true_advantage"] >= 1 - bound
        assert r["row_mass_share"] <= bound ** 2  # (|m| / |a|)^2 with |a| ~ |g|
        assert r["split_residual"] <= bound
        assert r["rows_included"] == 1.0 and r["excluded_ratio"] == 0.0 and r["excluded_share"] == 0.0
        assert 0 < r["sign_differs_share"] < 1
        assert r["n_entries"] == N_SEQ * CFG.n_heads * T_SEQ * (T_SEQ + 1) // 2
        # this layer's q and k maps, weights and biases
        assert r["n_params"] == 2 * (CFG.d_model ** 2 + CFG.d_model)
        assert r["grad_norm"] > 0
    # the model itself is left as it was (the split runs on a float64 copy)
    for n, p in model.named_parameters():
        assert p.dtype == torch.float32 and p.grad is None and torch.equal(p, before[n])


def test_ssm_at_initialization_the_instrument_tells_the_difference(task_and_batch):
    """A small SSMModel at initialization: finite numbers on every layer, most rows
    included, and a row-mass channel orders of magnitude above attention's: the weights do
    not sum to one, and the instrument sees it. The values are printed, not prescribed:
    they depend on the configuration."""
    task, batch = task_and_batch
    attention = routing_law_split(build_model("attention", task, CFG, 0), batch)
    rows = routing_law_split(build_model("ssm", task, CFG, 0), batch)
    assert [r["layer"] for r in rows] == list(range(1, CFG.n_layers + 1))
    bound = attention_bound()
    for r, att in zip(rows, attention):
        print(f"\nssm layer {r['layer']}: " + ", ".join(f"{k} {v:.3g}" for k, v in r.items() if k != "layer"))
        assert all(math.isfinite(v) for v in r.values())
        assert 0 < r["rows_included"] <= 1
        assert -1 <= r["cos_true_advantage"] <= 1
        for key in ("row_mass_share", "excluded_share", "sign_differs_share"):
            assert 0 <= r[key] <= 1
        # the split is exact to rounding; the two channels may be larger than the gradient
        # itself when they cancel, so rounding is judged against the largest of the three
        # (|J^T A| <= |J^T b| + |J^T (b - A)|): a few ulp times sqrt of the ~2e4 entries
        assert r["split_residual"] <= 1e-12 * (1 + 2 * r["row_mass_ratio"])
        assert r["row_mass_ratio"] >= 1e6 * max(bound, att["row_mass_ratio"])
        # this layer's x_proj (d_inner x (rank + 2 N)), dt_proj (rank -> d_inner, bias) and A_log
        di, N, R = 2 * CFG.d_model, CFG.d_state, math.ceil(CFG.d_model / 16)
        assert r["n_params"] == di * (R + 2 * N) + R * di + di + di * N


# ---------------------------------------------------------------------------------------
# 4. Bad input
# ---------------------------------------------------------------------------------------

def test_routing_law_split_names_what_is_wrong(task_and_batch):
    task, batch = task_and_batch
    model = build_model("ssm", task, CFG, 0)
    with pytest.raises(TypeError, match="model must be a CausalTransformer or an SSMModel, got Linear"):
        routing_law_split(torch.nn.Linear(2, 2), batch)
    with pytest.raises(TypeError, match=r"batch must be a tasks.primitives.Batch, got tuple"):
        routing_law_split(model, (batch.inputs, batch.targets))
    for bad in (0.0, 1.0, -0.1, 1.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"mass_tol must be a finite number in \(0, 1\)"):
            routing_law_split(model, batch, mass_tol=bad)
    for bad in ("0.1", True, None):
        with pytest.raises(TypeError, match=r"mass_tol must be a real number in \(0, 1\)"):
            routing_law_split(model, batch, mass_tol=bad)
