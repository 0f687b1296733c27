"""The selective entropy probe (R8): positive and negative controls with tolerances derived
from the sample sizes, the control target's distribution, the representations against the
model's traces, a model at initialization, and bad input refused by name."""
from __future__ import annotations

import math

import pytest
import torch

from attention_dynamics.entropy_probe import (REPRESENTATIONS, RIDGE_GRID, entropy_selectivity, permuted_control,
                                              probe_selectivity, representations, value_match_entropy)
from attention_dynamics.tasks.bijection import WindTunnel, eval_set, supervised_positions
from attention_dynamics.transformer import CausalTransformer, TransformerConfig
from attention_dynamics.windtunnel import WindTunnelConfig

TASK = WindTunnel(8, 7, repeats=True)
B, P = 600, TASK.L + 1  # sequences, supervised positions per sequence
N_TR = N_TE = B // 2  # sequences
POS = torch.arange(P)


@pytest.fixture(scope="module")
def ev():
    return eval_set(TASK, B, seed=101)


def split(seed=0):
    perm = torch.randperm(B, generator=torch.Generator().manual_seed(seed))
    return perm[:N_TR], perm[N_TR:]


def beyond_position(y):
    """y minus its mean at each position, scaled to unit variance over all rows."""
    r = y - y.mean(0)
    return r / r.pow(2).mean().sqrt()


# Rows with entropy beyond position: positions 1..L-1 (position 0 is log2 V, the query 0).
# The mean-shift floor: a probe that predicts nothing beyond position is scored against the
# test's own positional means, so it loses sum_p n_te (mu_tr,p - mu_te,p)^2 / SS_tot, whose
# expectation is (1/n_tr + 1/n_te) (sequences), a weighted chi-square with about L - 1
# degrees of freedom; 4x its mean bounds it far into the tail.
SHIFT = 1 / N_TR + 1 / N_TE


def test_positive_control_recovers_the_signal_to_noise_r2(ev):
    """Features: s = r + sigma n (r the entropy beyond position at unit variance, n standard
    normal), position embeddings, nuisance noise. The best linear read-out has
    R^2* = corr(r, s)^2 = 1 / (1 + sigma^2) = 0.5. Deviations: sampling, SE of R^2 about
    2 rho (1 - rho^2) / sqrt(n) on n test rows (0.014 here; 30 seeds gave 0.013), and two
    biases, the mean shift (SHIFT) and ridge's fit error (1 - R^2*) p / n_train_rows."""
    g = torch.Generator().manual_seed(1)
    H = ev.pos_bits
    sigma = 1.0
    signal = beyond_position(H) + sigma * torch.randn(B, P, generator=g, dtype=torch.float64)
    posemb = torch.randn(P, 4, generator=g, dtype=torch.float64)[None].expand(B, P, 4)
    nuisance = torch.randn(B, P, 11, generator=g, dtype=torch.float64)
    X = torch.cat([signal[..., None], posemb, nuisance], -1)
    tr, te = split()
    out = probe_selectivity(X, H, POS, train=tr, test=te)
    expected = 1 / (1 + sigma**2)
    rho = math.sqrt(expected)
    se = 2 * rho * (1 - rho**2) / math.sqrt(N_TE * P)
    bias = SHIFT + (1 - expected) * 12 / (N_TR * P)
    assert abs(out["r2"] - expected) <= 4 * se + bias, out
    assert out["n_features"] == 12  # the 4 positional dimensions are functions of position: dropped
    assert abs(out["r2_control"]) <= 4 * SHIFT  # the permuted entropy: nothing to read
    assert out["selectivity"] >= expected - 4 * se - bias - 4 * SHIFT
    assert out["ridge"] in RIDGE_GRID and out["n_train"] == N_TR and out["n_test"] == N_TE
    # the value-match control: a perfect code of the entropy reads rho_HC^2 of it, rho_HC ~ 0.05
    vm = probe_selectivity(X, H, POS, train=tr, test=te, control_target=value_match_entropy(ev.tokens, TASK))
    assert vm["r2"] == out["r2"] and abs(vm["r2_control"]) <= 0.02 and vm["selectivity"] > 0.4


def test_position_only_features_read_nothing_beyond_position(ev):
    """Features that are a function of position only: residualized, every column is
    constant and dropped, the probe predicts the training positional mean, and R^2 is the
    mean-shift floor: <= 0 exactly (the test's own means are the least-squares best), and
    about -(1/n_tr + 1/n_te)."""
    g = torch.Generator().manual_seed(2)
    emb = torch.randn(P, 6, generator=g, dtype=torch.float64)
    X = (3 * emb + 1)[None].expand(B, P, 6).clone()
    X[..., 0] = POS.double() ** 2  # a non-linear function of position too
    tr, te = split(1)
    out = probe_selectivity(X, ev.pos_bits, POS, train=tr, test=te)
    assert out["n_features"] == 0
    assert -4 * SHIFT <= out["r2"] <= 0.0 and -4 * SHIFT <= out["r2_control"] <= 0.0
    assert abs(out["selectivity"]) <= 4 * SHIFT


def test_random_features_read_nothing_and_least_squares_overfits_by_p_over_n(ev):
    """Pure noise features, p of them (unit variance), n training rows, m test rows.
    Least squares (the grid forced to almost no penalty): the fitted w has
    ||w||^2 ~ chi2_p / n in units of the target's variance, so held-out
    R^2 ~ -(chi2_p / n) + 2 N(0, (p/n) / m) - mean shift, of mean -p/(n - p - 1) - SHIFT and
    standard deviation sqrt((sqrt(2p) / n)^2 + 4 p / (n m) + (0.6 SHIFT)^2) (the last: the
    shift is about a chi-square with L - 1 = 6 degrees of freedom, relative sd 0.58); p is
    large enough that -p/n stands out of that spread. With the default grid,
    cross-validation picks a penalty and R^2 lies between the least-squares loss and what a
    prediction uncorrelated with y can reach: rho^2 with rho ~ N(0, 1/m), so <= 9/m."""
    g = torch.Generator().manual_seed(3)
    p = 128
    X = torch.randn(B, P, p, generator=g, dtype=torch.float64)
    tr, te = split(2)
    n, m = N_TR * P, N_TE * P
    ols = -p / (n - p - 1)
    sd = math.sqrt((math.sqrt(2 * p) / n) ** 2 + 4 * p / (n * m) + (0.6 * SHIFT) ** 2)
    least = probe_selectivity(X, ev.pos_bits, POS, train=tr, test=te, ridge=[1e-6])
    for key in ("r2", "r2_control"):
        assert abs(least[key] - (ols - SHIFT)) <= 4 * sd, (least, ols - SHIFT, sd)
        assert least[key] < ols / 3  # the -p/n loss is there, not just the mean shift
    out = probe_selectivity(X, ev.pos_bits, POS, train=tr, test=te)
    for key in ("r2", "r2_control"):
        assert ols - SHIFT - 4 * sd <= out[key] <= 9 / m, out
    assert abs(out["selectivity"]) <= abs(ols) + SHIFT + 4 * sd + 9 / m


def test_the_value_match_control_has_the_entropy_s_distribution_and_catches_generic_recurrence(ev):
    """The control target: its definition by hand on a few sequences; at every position
    its mean and its rate of zeros agree with the real entropy's (within 4 standard errors
    of the difference); and the case it exists for: features that carry generic token
    recurrence ('the current key appeared before, in any slot') and the distinct count
    read the entropy (R^2 ~ 0.4) but read the control as well, so the selectivity is ~0,
    where the permuted control would call them selective."""
    C, H = value_match_entropy(ev.tokens, TASK), ev.pos_bits
    V, L = TASK.V, TASK.L
    for b in range(5):
        t = ev.tokens[b].tolist()
        keys, vals = t[0:2 * L:2], t[1:2 * L:2]
        want = [0.0 if keys[i] in vals[:i] else math.log2(V - len(set(vals[:i]))) for i in range(L)] + [0.0]
        assert C[b].tolist() == pytest.approx(want, abs=1e-12)
    for i in range(P):
        se = math.sqrt((H[:, i].var() + C[:, i].var()) / B)
        assert abs(float(H[:, i].mean() - C[:, i].mean())) <= 4 * se + 1e-12
        pz, qz = float((H[:, i] == 0).double().mean()), float((C[:, i] == 0).double().mean())
        assert abs(pz - qz) <= 4 * math.sqrt((pz * (1 - pz) + qz * (1 - qz)) / B) + 1e-12
    assert not torch.equal(C, H)
    # generic recurrence features
    keys, vals = ev.tokens[:, 0:2 * L:2], ev.tokens[:, 1:2 * L:2]
    rows = torch.arange(B)
    seen_k, seen_v = torch.zeros(B, V, dtype=torch.bool), torch.zeros(B, V, dtype=torch.bool)
    F = torch.zeros(B, P, 2, dtype=torch.float64)
    for i in range(L):
        F[:, i, 0] = (seen_k | seen_v)[rows, keys[:, i]].double()
        F[:, i, 1] = torch.log2(V - seen_v.sum(1).double())
        seen_k[rows, keys[:, i]], seen_v[rows, vals[:, i]] = True, True
    X = torch.cat([F, torch.randn(B, P, 8, generator=torch.Generator().manual_seed(4), dtype=torch.float64)], -1)
    tr, te = split(3)
    vm = probe_selectivity(X, H, POS, train=tr, test=te, control_target=C)
    perm = probe_selectivity(X, H, POS, train=tr, test=te)
    # by the symmetry of 'any slot' between the key match and the value match, both R^2
    # have one expectation (~0.45): each has SE 2 rho (1 - rho^2) / sqrt(m) on m test rows
    rho = math.sqrt(0.45)
    se = 2 * rho * (1 - rho**2) / math.sqrt(N_TE * P)
    assert vm["r2"] > 0.3 and vm["r2_control"] > 0.3 and abs(vm["selectivity"]) < 4 * math.sqrt(2) * se, vm
    assert perm["selectivity"] > 0.3, perm
    # features that copy the control: negative selectivity
    Xc = torch.cat([C[..., None], X[..., 2:]], -1)
    out = probe_selectivity(Xc, H, POS, train=tr, test=te, control_target=C)
    assert out["r2_control"] > 0.9 and out["selectivity"] < -0.8


def test_permuted_control_permutes_within_position():
    y = torch.arange(40, dtype=torch.float64).reshape(10, 4)
    c = permuted_control(y, torch.arange(4), seed=5)
    for j in range(4):
        assert sorted(c[:, j].tolist()) == y[:, j].tolist()
    assert not torch.equal(c, y) and torch.equal(c, permuted_control(y, torch.arange(4), seed=5))


def small_model(V, L, seed=0):
    torch.manual_seed(seed)
    cfg = TransformerConfig(n_out=V, d_model=16, n_layers=2, n_heads=4, d_ff=32, input="tokens", vocab=V,
                            max_len=2 * L + 1)
    return CausalTransformer(cfg)


def test_representations_are_the_tensors_they_claim():
    """Against the explicit path's traces: the second block's concatenated head outputs,
    the first block's values; and the final residual is what ln_f and the read-out turn
    into the logits. Hooks are removed and the model's mode restored."""
    task = WindTunnel(6, 5, repeats=True)
    model = small_model(6, 5).train()
    tokens = eval_set(task, 7, seed=0).tokens
    reps = representations(model, tokens, task)
    assert list(reps) == list(REPRESENTATIONS)
    pos = supervised_positions(task)
    model.eval()
    with torch.no_grad():
        logits, traces = model(tokens, inspect=True)
    B_, H_, T_, dh = traces[1].attention.output.shape
    cat = lambda t: t.transpose(1, 2).reshape(B_, T_, H_ * dh)[:, pos]  # noqa: E731
    assert all(r.shape == (7, task.L + 1, 16) for r in reps.values())
    torch.testing.assert_close(reps["attention_l1"], cat(traces[1].attention.output), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(reps["values_l0"], cat(traces[0].v), rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        torch.testing.assert_close(model.out(model.ln_f(reps["residual_final"])), logits[:, pos], rtol=1e-5, atol=1e-5)
    model.train()
    representations(model, tokens, task)
    assert model.training
    assert not model.blocks[1].proj._forward_pre_hooks and not model.ln_f._forward_pre_hooks
    assert not model.blocks[0].v._forward_hooks


def test_entropy_selectivity_runs_on_a_model_at_initialization():
    cfg = WindTunnelConfig(V=8, L=7, d_model=32, n_heads=4, repeats=True, eval_size=160)
    model, task, ev = cfg.model(), cfg.task, cfg.eval_set()
    out = entropy_selectivity(model, task, ev, split_seed=1, train_share=0.5)
    assert set(out) == set(REPRESENTATIONS)
    for name, res in out.items():
        for key in ("r2", "r2_control", "selectivity", "r2_permuted", "selectivity_permuted", "control_rho"):
            assert math.isfinite(res[key]), (name, key, res[key])
        assert res["n_train"] == 80 and res["n_test"] == 80
        assert res["r2"] < 0.3  # at initialization nothing is learnt
    perm = entropy_selectivity(model, task, ev, control="permutation")
    assert perm["values_l0"]["r2_control"] == perm["values_l0"]["r2_permuted"]


def test_bad_input_is_refused_by_name(ev):
    X = torch.randn(B, P, 3, dtype=torch.float64)
    H = ev.pos_bits
    tr, te = split()
    with pytest.raises(ValueError, match="train and test must be disjoint"):
        probe_selectivity(X, H, POS, train=tr, test=torch.cat([te, tr[:1]]))
    with pytest.raises(ValueError, match="target must have shape"):
        probe_selectivity(X, H[:, :-1], POS, train=tr, test=te)
    with pytest.raises(ValueError, match="features must have 3 dimensions"):
        probe_selectivity(X[..., 0], H, POS, train=tr, test=te)
    with pytest.raises(ValueError, match="position must have shape"):
        probe_selectivity(X, H, POS[:-1], train=tr, test=te)
    with pytest.raises(TypeError, match="position must have an integer dtype"):
        probe_selectivity(X, H, POS.double(), train=tr, test=te)
    with pytest.raises(ValueError, match="ridge must be a non-empty list"):
        probe_selectivity(X, H, POS, train=tr, test=te, ridge=[])
    with pytest.raises(ValueError, match=r"ridge\[1\] must be a finite number in \(0"):
        probe_selectivity(X, H, POS, train=tr, test=te, ridge=[1.0, -1.0])
    with pytest.raises(ValueError, match=r"test must hold sequence indices in \[0, 599\]"):
        probe_selectivity(X, H, POS, train=tr, test=torch.tensor([B]))
    with pytest.raises(TypeError, match="train must hold integer sequence indices"):
        probe_selectivity(X, H, POS, train=tr.double(), test=te)
    with pytest.raises(ValueError, match="train holds a sequence index more than once"):
        probe_selectivity(X, H, POS, train=torch.cat([tr, tr[:1]]), test=te)
    with pytest.raises(ValueError, match="control_target must have the shape of target"):
        probe_selectivity(X, H, POS, train=tr, test=te, control_target=H[:10])
    with pytest.raises(ValueError, match="target is a function of position"):
        probe_selectivity(X, H.mean(0).expand(B, P).clone(), POS, train=tr, test=te)
    with pytest.raises(ValueError, match="at least folds = 5 sequences"):
        probe_selectivity(X, H, POS, train=tr[:3], test=te)
    plain = WindTunnel(8, 7)
    with pytest.raises(ValueError, match="repeats variant"):
        value_match_entropy(eval_set(plain, 4).tokens, plain)
    model = small_model(8, 7)
    with pytest.raises(ValueError, match="task must be the repeats variant"):
        entropy_selectivity(model, plain, eval_set(plain, 40))
    small = eval_set(TASK, 40)
    with pytest.raises(ValueError, match=r"train_share must be a finite number in \(0, 1\)"):
        entropy_selectivity(model, TASK, small, train_share=1.0)
    with pytest.raises(ValueError, match="need at least 10"):
        entropy_selectivity(model, TASK, small, train_share=0.1)
    with pytest.raises(ValueError, match="control must be one of"):
        entropy_selectivity(model, TASK, small, control="shuffle")
    with pytest.raises(ValueError, match="tokens must have 15 columns"):
        representations(model, small.tokens[:, :-1], TASK)
    with pytest.raises(ValueError, match="at least 2 layers"):
        torch.manual_seed(0)
        one = CausalTransformer(TransformerConfig(n_out=8, d_model=16, n_layers=1, n_heads=4, input="tokens",
                                                  vocab=8, max_len=15))
        representations(one, small.tokens, TASK)
