"""The sticky chain: its matrix and floors against independent computations, the sampler,
and the fast path (batched, blocked, closed-form) against the naive one and autograd."""
from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from attention_dynamics.causal_head import (blocked_causal_step, causal_head_loss_fn, dense_causal_forward, init_heads,
                                           protocol_batch, protocol_rates, train_reference)
from attention_dynamics.tasks import sticky_chain as sc
from attention_dynamics.training import SGD, NormalizedValueStep, train


def script_matrix(n=8, w=0.3):
    """The authors' construction, written out with plain loops."""
    A = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            d = min(abs(i - j), n - abs(i - j))
            A[i, j] = w if i == j else 1.0 / d
        A[i] /= A[i].sum()
        A[i] *= 1 - w
        A[i, i] += w
        A[i] /= A[i].sum()
    return A


def test_transition_matrix_is_the_scripts():
    A = sc.transition_matrix().numpy()
    np.testing.assert_allclose(A, script_matrix(), rtol=1e-5, atol=1e-7)  # the script computes it in float32
    assert not np.array_equal(A, script_matrix())  # ... and so do we: float32, not float64
    assert np.allclose(A[0], [0.3498, 0.1660, 0.0830, 0.0553, 0.0415, 0.0553, 0.0830, 0.1660], atol=5e-5)
    assert A[0, 0] == pytest.approx(0.3498, abs=5e-5) and abs(A[0, 0] - 0.3) > 0.04
    np.testing.assert_allclose(A.sum(1), 1, rtol=1e-5, atol=1e-8)
    meant = sc.transition_matrix(quirk=False).numpy()
    np.testing.assert_allclose(np.diag(meant), 0.3, rtol=1e-5, atol=1e-8)


def test_conditional_entropy_is_1_8292_nats():
    A = script_matrix()
    h = -(A[0] * np.log(A[0])).sum()  # circulant: uniform stationary law, every row alike
    assert sc.conditional_entropy(sc.transition_matrix()) == pytest.approx(h, abs=1e-6)
    assert h == pytest.approx(1.8292, abs=5e-5)


def test_forward_filter_and_x_only_against_enumeration():
    rng = np.random.default_rng(0)
    n, T, d = 3, 4, 2
    A = rng.random((n, n)) + 0.2
    A /= A.sum(1, keepdims=True)
    A_t = torch.tensor(A)
    pi = sc.stationary_distribution(A_t).numpy()  # the filter's prior on y_0
    means = rng.normal(size=(n, d)) * 0.8
    x = rng.normal(size=(T, d))
    # P(y_t | x_1..x_t) by summing over every path y_0..y_{t-1}; path[s] emits x_{s+1}
    lik = np.exp(-0.5 * ((x[:, None, :] - means[None]) ** 2).sum(-1))
    out = np.zeros((T, n))
    for t in range(T):
        post = np.zeros(n)
        for path in itertools.product(range(n), repeat=t + 1):
            p = pi[path[0]] * lik[0, path[0]]
            for s in range(1, t + 1):
                p *= A[path[s - 1], path[s]] * lik[s, path[s]]
            post += p * A[path[t]]
        out[t] = post / post.sum()
    got = sc.forward_filter(torch.tensor(x), A_t, torch.tensor(means)).exp().numpy()
    np.testing.assert_allclose(got, out, rtol=1e-5, atol=1e-12)
    post1 = pi * lik
    post1 /= post1.sum(1, keepdims=True)
    assert np.allclose(sc.predict_from_x_only(torch.tensor(x), A_t, torch.tensor(means)).exp().numpy(), post1 @ A, atol=1e-12)


def test_sampler_follows_the_chain_and_is_deterministic():
    seq = sc.sample_sequences([3], seq_len=60_000, dtype=torch.float64)
    s = seq.states[0].numpy()
    counts = np.zeros((8, 8))
    np.add.at(counts, (s[:-1], s[1:]), 1)
    freq = counts / counts.sum(1, keepdims=True)
    assert np.abs(freq - sc.transition_matrix().numpy()).max() < 0.02
    means = sc.symbol_means()
    noise = seq.x[0] - means[seq.states[0, :-1]]
    assert abs(float(noise.mean())) < 0.01 and abs(float(noise.std()) - 1) < 0.01
    assert torch.equal(seq.y[0], seq.states[0, 1:])
    again = sc.sample_sequences([3], seq_len=60_000, dtype=torch.float64)
    assert torch.equal(again.x, seq.x) and torch.equal(again.states, seq.states)


@pytest.mark.parametrize("block", [1, 7, 64, 500])
def test_blocked_step_matches_autograd_in_float64(block):
    seq = sc.sample_sequences([5, 6], seq_len=120, dtype=torch.float64)
    p = init_heads([5, 6], std=0.5, dtype=torch.float64)
    step = blocked_causal_step(p, seq.x, seq.y, block=block, stats=True)
    loss, grads, stats = step.loss, step.grads, step.stats
    leaves = {n: t.clone().requires_grad_(True) for n, t in p.items()}
    alpha, logp = dense_causal_forward(leaves, seq.x)
    ref = -logp.gather(-1, seq.y[..., None]).squeeze(-1).mean(-1)
    ref.sum().backward()
    torch.testing.assert_close(loss, ref.detach(), rtol=1e-5, atol=1e-13)
    for n in leaves:
        assert torch.allclose(grads[n], leaves[n].grad, atol=1e-13, rtol=1e-11), n
    ent = -(logp.exp() * logp).sum(-1).mean(-1)
    torch.testing.assert_close(stats.entropy, ent.detach(), rtol=1e-5, atol=1e-13)


def test_fast_path_equals_naive_path_on_a_short_run():
    seeds, steps = [42, 2024], 25
    batch = protocol_batch(seeds, 300)
    seq, names = batch.sequences, batch.names
    assert names == ["SGD", "SGD", "EM-style", "EM-style"]
    h = train(batch.params, causal_head_loss_fn(batch.x, batch.y, block=32), SGD(protocol_rates(names)), steps)
    for i, name in enumerate(names):
        naive = train_reference(seeds[i % 2], seq.x[i % 2], seq.y[i % 2], name, steps)
        assert np.allclose(h.loss[:, i], naive, atol=1e-5), name
    assert abs(h.loss[-1, 2] - h.loss[-1, 0]) > 1e-4  # the schedules differ: the comparison can fail


def test_normalized_value_step_changes_only_the_value_update():
    seq = sc.sample_sequences([1], seq_len=80, dtype=torch.float64)
    p0 = init_heads([1], dtype=torch.float64)
    fn = causal_head_loss_fn(seq.x, seq.y, value_info=True)
    out = fn(p0)
    assert out.info["N"].sum().item() == pytest.approx(79.0)  # every query spreads one unit of attention
    torch.testing.assert_close(seq.x.transpose(1, 2) @ out.info["dV"], out.grads["W_V"], rtol=1e-5, atol=1e-15)
    p = {n: t.clone() for n, t in p0.items()}
    NormalizedValueStep(0.1, seq.x, min_share=1e9)(p, out, 0)  # a huge floor: every share equals it
    torch.testing.assert_close(p["W_Q"], p0["W_Q"] - 0.1 * out.grads["W_Q"], rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(p["W_V"], p0["W_V"] - 0.1 * out.grads["W_V"] / 1e9, rtol=1e-5, atol=1e-8)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="schedule must be one of"):
        protocol_rates(["Adam"])
    with pytest.raises(ValueError, match=r"seq_len must be an integer in \[2, 10000000\]"):
        sc.sample_sequences([1], seq_len=1)
    seq = sc.sample_sequences([1], seq_len=10)
    with pytest.raises(ValueError, match=r"y must have shape \(R, T\)"):
        blocked_causal_step(init_heads([1]), seq.x, seq.y[:, :5])
    with pytest.raises(ValueError, match="block must be an integer >= 1"):
        blocked_causal_step(init_heads([1]), seq.x, seq.y, block=0)


def test_sequences_and_weights_follow_the_scripts_draws():
    """The authors' script seeds torch's global generator and draws, in order: the start
    state (randint), one multinomial per next state on the float32 row of the current state,
    the noise (randn, float32); the symbol means after manual_seed(0); the initial weights
    after manual_seed(seed) again, W_Q, W_K, W_V, W_O, each randn * 0.1. Those calls on the
    global generator give our sequences and weights exactly."""
    P = sc.transition_matrix(dtype=torch.float32)
    torch.manual_seed(0)
    means = torch.randn(8, 20)
    for seed in (42, 7):
        torch.manual_seed(seed)
        states = [int(torch.randint(8, (1,)))]
        for _ in range(29):
            states.append(int(torch.multinomial(P[states[-1]], 1)))
        states = torch.tensor(states)
        x = means[states[:-1]] + torch.randn(29, 20)
        ours = sc.sample_sequences([seed], seq_len=30)
        assert torch.equal(ours.states[0], states) and torch.equal(ours.x[0], x)
        torch.manual_seed(seed)
        drawn = [torch.randn(20, 10) * 0.1, torch.randn(20, 10) * 0.1, torch.randn(20, 15) * 0.1,
                 torch.randn(15, 8) * 0.1]
        w = init_heads([seed])
        assert all(torch.equal(w[n][0], d) for n, d in zip(("W_Q", "W_K", "W_V", "W_O"), drawn))
    torch.manual_seed(1010)  # the deep variant's weights come after the held-out sequence
    sc.sample_sequences([1010], seq_len=30)
    g = sc.generator_after(1010, 30)
    torch.manual_seed(1010)
    sc._draw(torch.default_generator, 30)
    assert torch.equal(torch.randn(5), torch.randn(5, generator=g))


def head_error_bounds(p: dict, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """How far a float32 evaluation of the causal head may lie from the exact one, per run:
    float32 rounding times the size of each sum, as a running-error bound (Wilkinson; Higham,
    *Accuracy and Stability*, 3.1). The sizes come from the closed forms evaluated in
    float64 on absolute values (|x| |W_Q| for q, alpha (|b| + E_alpha|b|) for ds, ...), so a
    sum that cancels (ds at one position, where the gradients are exactly zero) keeps the
    size of its terms. Each quantity's relative error is gamma_n for the n roundings along
    its longest chain of sums, plus what the softmaxes pass on: a score that errs by
    e_s = gamma_{d_x + d_k} |s|_abs changes a weight relatively by 2 e_s + 8u (exp and log,
    4 ulp each), and a logit error e_z changes a probability relatively by 2 e_z + 8u."""
    from support import U32, gamma

    W = {n: p[n].double() for n in p}
    x = x.double()
    R, T, d_x = x.shape
    d_k, d_v, C = W["W_Q"].shape[-1], W["W_V"].shape[-1], W["W_O"].shape[-1]
    scale = d_k ** -0.5
    ax, aW = x.abs(), {n: w.abs() for n, w in W.items()}
    q_abs, k_abs, v_abs = ax @ aW["W_Q"], ax @ aW["W_K"], ax @ aW["W_V"]
    zv_abs = v_abs @ aW["W_O"]
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    s_abs = (q_abs @ k_abs.transpose(1, 2) * scale).masked_fill(future, 0)
    alpha, logp = dense_causal_forward(W, x)
    S = s_abs.amax((1, 2))
    # two scores, the T-term sum under the log, exp and log (4 ulp each, log's of log T at
    # most), the roundings of max + log and of s - lse
    e_a = 2 * gamma(d_x + d_k) * S + gamma(T) + (10 + 6 * math.log(T) + 3 * S) * U32  # (R,) relative
    z_abs = alpha @ zv_abs
    e_z = (e_a + gamma(T) + gamma(d_x + d_v + C))[:, None] * z_abs.amax(-1)  # (R, T) absolute
    e_p = 2 * e_z.amax(-1) + 8 * U32  # (R,) relative, of a probability
    onehot = torch.nn.functional.one_hot(y, C).double()
    dz_abs = (logp.exp() + onehot) / T
    b_abs = dz_abs @ zv_abs.transpose(1, 2)
    ds_abs = alpha * (b_abs + (alpha * b_abs).sum(-1, keepdim=True))
    u_abs = dz_abs @ aW["W_O"].transpose(1, 2)
    sizes = {
        "W_Q": ax.transpose(1, 2) @ (ds_abs @ k_abs) * scale,
        "W_K": ax.transpose(1, 2) @ (ds_abs.transpose(1, 2) @ q_abs) * scale,
        "dV": alpha.transpose(1, 2) @ u_abs,
        "W_O": (alpha @ v_abs).transpose(1, 2) @ dz_abs,
        "N": alpha.sum(1),
    }
    sizes["W_V"] = ax.transpose(1, 2) @ sizes["dV"]
    n_chain = 3 * T + d_x + d_k + d_v + C  # the longest chain of sums on the way to a gradient
    rel = gamma(n_chain) + 3 * e_a + e_p  # ds holds alpha twice and b once (through p)
    tol = {n: (rel[:, None] * m.reshape(R, -1)).amax(-1) for n, m in sizes.items()}
    tol["N"] = (gamma(T) + e_a) * sizes["N"].amax(-1)
    log_c, log_t = math.log(C), math.log(T)
    # a log-softmax errs by at most twice its logits' error; entropies by 2 log(size) times it
    tol["loss"] = 2 * e_z.mean(-1) + (gamma(C) + gamma(T) + 8 * U32) * (2 * z_abs.amax((1, 2)) + log_c)
    tol["entropy"] = 2 * log_c * e_z.amax(-1) + (gamma(C) + gamma(T) + 8 * U32) * (2 * z_abs.amax((1, 2)) + log_c)
    e_s = gamma(d_x + d_k) * s_abs.amax((1, 2))
    tol["attention_entropy"] = 4 * log_t * e_s + (gamma(T) + 8 * U32) * (log_t + 2 * s_abs.amax((1, 2)))
    tol["logits"] = e_z
    return tol


def _head_violations(p, seq, got, ref) -> dict[str, float]:
    """quantity -> the largest error of ``got`` against ``ref`` as a share of its bound
    (above 1: beyond it)."""
    from support import gamma

    tol = head_error_bounds(p, seq.x, seq.y)
    # an argmax may flip only where the two largest logits lie within 2 e_z of each other;
    # the mean of T hits rounds too
    p64 = {n: t.double() for n, t in p.items()}
    top2 = dense_causal_forward(p64, seq.x.double())[1].topk(2, dim=-1).values
    T = seq.x.shape[1]
    tol["accuracy"] = ((top2[..., 0] - top2[..., 1]) <= 2 * tol["logits"]).sum(-1) / T + gamma(T)
    pairs = {"loss": (got.loss, ref.loss)}
    pairs.update({n: (got.grads[n], ref.grads[n]) for n in ("W_Q", "W_K", "W_V", "W_O")})
    pairs.update({n: (getattr(got, n), getattr(ref, n)) for n in ("dV", "N")})
    pairs.update({f: (getattr(got.stats, f), getattr(ref.stats, f)) for f in ("entropy", "accuracy", "attention_entropy")})
    out = {}
    for name, (value, want) in pairs.items():
        err = (value.double() - want).abs().reshape(len(tol[name]), -1).amax(-1)
        out[name] = float((err / tol[name]).nan_to_num(0.0).max())  # 0 / 0: exact where nothing can err
    return out


def _head_case(seq_len, d_k, weight_scale):
    seq = sc.sample_sequences([3, 4, 5], seq_len=seq_len)
    p = {n: t * weight_scale for n, t in init_heads([3, 4, 5], d_k=d_k).items()}
    p64 = {n: t.double() for n, t in p.items()}
    ref = blocked_causal_step(p64, seq.x.double(), seq.y, stats=True, value_info=True, native=False)
    return seq, p, ref


@pytest.mark.parametrize("name,factor", [("W_Q", 1.25), ("W_K", 0.8), ("W_V", 1.01), ("W_O", 0.99), ("N", 1.001),
                                         ("loss", 1.001)])
def test_the_kernels_bounds_reject_a_planted_error(name, factor):
    """Negative control of the test above, at the protocol's scale (T = 17, d_k = 3): the
    exact values with one quantity off by a few per cent (routing gradients by 20-25%, the
    cancelling sums whose float32 bound is widest) fall outside the bounds."""
    seq, p, ref = _head_case(18, 3, 1)
    if name == "loss":
        got = replace(ref, loss=ref.loss * factor)
    elif name == "N":
        got = replace(ref, N=ref.N * factor)
    else:
        got = replace(ref, grads={**ref.grads, name: ref.grads[name] * factor})
    shares = _head_violations(p, seq, got, ref)
    assert shares[name] > 1 and max(v for k, v in shares.items() if k != name) == 0


def _buggy_head(p64, x, y, bug: str):
    """Loss, gradients and statistics of the head with a realistic kernel bug, in float64:
    "peek", each query also sees the next key (an off-by-one causal mask); "uncentred", the
    routing gradient without its centring term (ds = alpha b instead of alpha (b - E b))."""
    leaves = {n: t.clone().requires_grad_() for n, t in p64.items()}
    T = x.shape[1]
    s = (x @ leaves["W_Q"]) @ (x @ leaves["W_K"]).transpose(1, 2) / math.sqrt(p64["W_Q"].shape[-1])
    mask = torch.ones(T, T, dtype=torch.bool).triu(2 if bug == "peek" else 1)
    alpha = torch.softmax(s.masked_fill(mask, float("-inf")), -1)
    if bug == "uncentred":  # through the scores, alpha's Jacobian without its rank-one part
        a0 = alpha.detach()
        alpha = a0 + a0 * (s - s.detach())
    logits = alpha @ (x @ leaves["W_V"]) @ leaves["W_O"]
    loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), y, reduction="none").mean(-1)
    grads = dict(zip(leaves, torch.autograd.grad(loss.sum(), list(leaves.values()))))
    return loss.detach(), grads


@pytest.mark.parametrize("bug,caught", [("peek", ("loss", "W_Q", "W_K", "W_V", "W_O")),
                                        ("uncentred", ("W_Q", "W_K"))])
def test_the_kernels_bounds_reject_realistic_bugs(bug, caught):
    """Negative control with bugs a kernel could have, at the protocol's scale (T = 17,
    d_k = 3): each quantity the bug changes falls outside its float32 bound."""
    seq, p, ref = _head_case(18, 3, 1)
    p64 = {n: t.double() for n, t in p.items()}
    loss, grads = _buggy_head(p64, seq.x.double(), seq.y, bug)
    got = replace(ref, loss=loss, grads={**ref.grads, **grads})
    shares = _head_violations(p, seq, got, ref)
    assert all(shares[q] > 1 for q in caught), shares


@pytest.mark.parametrize("weight_scale", [1, 5])
# (9, 10) and (17, 10): one block of queries and two, at the protocol's d_k, where the bounds
# are tight enough to see a routing gradient off by a quarter (at 150 positions W_K's bound
# passes one off by a half)
@pytest.mark.parametrize("seq_len,d_k", [(150, 10), (2, 10), (18, 3), (70, 16), (41, 7), (9, 10), (17, 10)])
def test_the_compiled_kernel_computes_the_torch_paths_closed_forms(monkeypatch, seq_len, d_k, weight_scale):
    """The fused C kernel (float32) and the blocked PyTorch path in float32 against the
    PyTorch path in float64 (whose closed forms equal autograd, above): loss, the four
    gradients, R2's per-position value gradients and responsibilities, and the statistics,
    each within its float32 error bound (:func:`head_error_bounds`, valid on any processor),
    for lengths and key widths that straddle the kernel's blocks of 8 queries, chunks of 16
    keys and power-of-two padding; at the protocol's initial scale and at five times it
    (peaked attention, where float32 is ill-conditioned and the bounds of the routing
    gradients exceed the gradients themselves: there the test checks stability, not the
    last digits). With one position the routing gradients are exactly zero and the
    kernel's are rounding: the bounds are on the terms, so they hold there too."""
    from attention_dynamics.native import NativeUnavailable, causal_head_kernel

    from support import kernel_or_skip

    kernel_or_skip(lambda: causal_head_kernel(d_k, 8))
    seq, p, ref = _head_case(seq_len, d_k, weight_scale)
    a = blocked_causal_step(p, seq.x, seq.y, stats=True, value_info=True, native=True)
    b = blocked_causal_step(p, seq.x, seq.y, stats=True, value_info=True, native=False)
    for label, got in (("kernel", a), ("PyTorch float32", b)):
        shares = _head_violations(p, seq, got, ref)
        assert max(shares.values()) <= 1, f"{label}: errors as shares of their bounds {shares}"
    loss_only = blocked_causal_step(p, seq.x, seq.y, grads=False, native=True)
    assert loss_only.grads is None and loss_only.dV is None and torch.equal(loss_only.loss, a.loss)
    monkeypatch.setenv("ATTENTION_DYNAMICS_NATIVE", "0")  # switched off: the torch path, the same numbers
    with pytest.raises(NativeUnavailable):
        blocked_causal_step(p, seq.x, seq.y, native=True)
    assert torch.equal(blocked_causal_step(p, seq.x, seq.y).loss, b.loss)


def _proposed_violations(folder, seq_len, d_k, weight_scale):
    """The errors of the kernel built from ``folder`` (shares of their bounds, as in
    _head_violations), and the loss it computes without gradients."""
    from attention_dynamics.native import causal_head_kernel

    from support import kernel_or_skip, proposed_kernels

    proposed = proposed_kernels()
    seq, p, ref = _head_case(seq_len, d_k, weight_scale)
    with proposed.built_from(folder):
        kernel_or_skip(lambda: causal_head_kernel(d_k, 8))
        got = blocked_causal_step(p, seq.x, seq.y, stats=True, value_info=True, native=True)
        loss_only = blocked_causal_step(p, seq.x, seq.y, grads=False, native=True)
    assert loss_only.grads is None and torch.equal(loss_only.loss, got.loss)
    return _head_violations(p, seq, got, ref)


# d_k = 10 and 18 take the proposed kernel's path for keys wider than a machine vector on
# AVX2 (two and four parts), d_k = 18 and 33 on AVX-512 too (two and four). The bounds of
# the routing gradients grow with the length, so that at 150 positions they pass W_K's
# gradient off by a half (a share of 0.5); the short cases (8 and 16 positions: one block
# of queries and two) are the ones where the bounds can say no
# (test_the_proposed_kernels_check_rejects_planted_bugs).
@pytest.mark.parametrize("seq_len,d_k,weight_scale", [(150, 10, 1), (150, 10, 5), (2, 10, 1), (18, 3, 1), (70, 16, 1),
                                                      (41, 7, 1), (9, 10, 1), (9, 18, 1), (17, 18, 1), (17, 33, 1),
                                                      (37, 33, 1)])
def test_the_proposed_kernel_computes_the_torch_paths_closed_forms(tmp_path, seq_len, d_k, weight_scale):
    """The kernel proposed in benchmarks/proposed/ (not the library's yet: see
    benchmarks/proposed_kernel.py), by the test above and its bounds, so that it is right
    before a paper build adopts it."""
    from support import proposed_kernels

    folder = proposed_kernels().proposed_sources(tmp_path / "native")  # refuses patches that change nothing
    shares = _proposed_violations(folder, seq_len, d_k, weight_scale)
    assert max(shares.values()) <= 1, f"errors as shares of their bounds {shares}"


@pytest.mark.parametrize("line,bug,seq_len,caught", [
    ("for (int h = 0; h < KP; h += KW) {", "for (int h = 0; h < KW; h += KW) {", 9, ("W_Q", "W_K")),  # the first part only
    ("load_part(dk + (size_t)j * KP + h) + dkj);", "load_part(dk + (size_t)j * KP + h) + 0.5f * dkj);", 9, ("W_K",)),
    ("accq[r] += ds * kj;", "accq[r] += 0.75f * ds * kj;", 9, ("W_Q",)),
    # dk of the keys overwritten by each block of queries instead of summed over them: two blocks
    ("store_part(dk + (size_t)j * KP + h, load_part(dk + (size_t)j * KP + h) + dkj);",
     "store_part(dk + (size_t)j * KP + h, dkj);", 17, ("W_K",)),
], ids=["first-part-only", "half-dk", "three-quarter-dq", "dk-not-summed-over-blocks"])
def test_the_proposed_kernels_check_rejects_planted_bugs(tmp_path, line, bug, seq_len, caught):
    """Negative control of the test above: the patch with a bug planted in its path for wide
    keys, at d_k = 18 (that path on AVX2 and AVX-512 alike) and 8 or 16 positions, fails it in
    the quantities the bug changes."""
    from support import planted_patches, proposed_kernels

    folder = proposed_kernels().proposed_sources(tmp_path / "native", planted_patches(tmp_path / "patches", "causal_head", line, bug))
    assert bug in (folder / "causal_head.c").read_text()
    shares = _proposed_violations(folder, seq_len, 18, 1)
    assert all(shares[q] > 1 for q in caught), shares


@pytest.mark.parametrize("kernel,defines", [("causal_head", {"DK": 10, "KP": 16, "NC": 8}),
                                            ("causal_attention", {"DH": 16})])
def test_the_proposed_kernels_row_maximum_is_max_ofs(tmp_path, kernel, defines):
    """Each proposed kernel's vectorized row maximum against vectors.h's scalar max_of, both
    compiled as the kernel is, on rows of every length from 0 to 80 (10 AVX2 vectors) holding NaN,
    infinities, signed zeros and -FLT_MAX: the same value (max_of passes over NaN). The
    closed-form checks cannot see a wrong maximum: the softmax does not change when every
    score is shifted by the same amount, until exp overflows."""
    import ctypes

    import attention_dynamics.native as native

    from support import kernel_or_skip, proposed_kernels

    kernel_or_skip(lambda: native.causal_head_kernel(10, 8))
    folder = proposed_kernels().proposed_sources(tmp_path / "native")
    # the kernel's text itself, not an #include of it: the build cache's key covers the
    # source it compiles and the headers, not the files that source includes
    (folder / "max_harness.c").write_text(
        (folder / f"{kernel}.c").read_text()
        + "\nfloat vector_max(const float *p, int n) { return max_of_vectors(p, n); }\n"
        "float scalar_max(const float *p, int n) { return max_of(p, n); }\n")
    path, _ = native._build(folder / "max_harness.c", defines)
    lib = ctypes.CDLL(str(path))
    for f in (lib.vector_max, lib.scalar_max):
        f.argtypes, f.restype = [ctypes.c_void_p, ctypes.c_int], ctypes.c_float
    rng = np.random.default_rng(0)
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, -np.finfo(np.float32).max], dtype=np.float32)
    for trial in range(3000):
        n = trial % 81
        row = rng.normal(size=n).astype(np.float32) * 10
        pick = rng.random(n) < 0.2
        row[pick] = rng.choice(special, int(pick.sum()))
        row = np.ascontiguousarray(row)
        got, want = lib.vector_max(row.ctypes.data, n), lib.scalar_max(row.ctypes.data, n)
        assert got == want, (row.tolist(), got, want)
    planted = np.array([1.0, 2.0, 3.0, 9.0, 1.0, 2.0, 3.0, 4.0, 5.0], dtype=np.float32)  # the largest in the first vector
    assert lib.vector_max(planted.ctypes.data, 9) == 9.0


def test_a_proposed_patch_that_no_longer_applies_is_named(tmp_path):
    """A patch written against sources that have changed since is an error that names it,
    not a benchmark of the library's own kernel."""
    patches = tmp_path / "patches"
    patches.mkdir()
    (patches / "stale.patch").write_text("--- a/causal_head.c\n+++ b/causal_head.c\n@@ -1,2 +1,2 @@\n"
                                         "-a line the source does not have\n+another\n context\n")
    from support import proposed_kernels

    with pytest.raises(RuntimeError, match=r"stale\.patch does not apply to the library's kernel sources"):
        proposed_kernels().proposed_sources(tmp_path / "native", patches)


def test_the_seeds_are_the_authors_scripts():
    from attention_dynamics.reference import SCRIPT_R7

    # written twice on purpose: reading them from reference.py would put the paper's numbers
    # into the key of every model trained on the sticky chain
    assert sc.SEEDS == tuple(SCRIPT_R7["seeds"])
