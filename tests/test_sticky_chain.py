"""The sticky chain: its matrix and floors against independent computations, the sampler,
and the fast path (batched, blocked, closed-form) against the naive one and autograd."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from attention_dynamics.causal_head import (blocked_causal_step, causal_head_loss_fn, dense_causal_forward, init_heads,
                                           protocol_rates, train_reference)
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
    assert np.allclose(A, script_matrix(), atol=1e-7)  # the script computes it in float32
    assert not np.array_equal(A, script_matrix())  # ... and so do we: float32, not float64
    assert np.allclose(A[0], [0.3498, 0.1660, 0.0830, 0.0553, 0.0415, 0.0553, 0.0830, 0.1660], atol=5e-5)
    assert A[0, 0] == pytest.approx(0.3498, abs=5e-5) and abs(A[0, 0] - 0.3) > 0.04
    assert np.allclose(A.sum(1), 1)
    meant = sc.transition_matrix(quirk=False).numpy()
    assert np.allclose(np.diag(meant), 0.3)


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
    assert np.allclose(got, out, atol=1e-12)
    post1 = pi * lik
    post1 /= post1.sum(1, keepdims=True)
    assert np.allclose(sc.predict_from_x_only(torch.tensor(x), A_t, torch.tensor(means)).exp().numpy(), post1 @ A, atol=1e-12)


def test_sampler_follows_the_chain_and_is_deterministic():
    seq = sc.sample_sequences([3], n_states_seq=60_000, dtype=torch.float64)
    s = seq.states[0].numpy()
    counts = np.zeros((8, 8))
    np.add.at(counts, (s[:-1], s[1:]), 1)
    freq = counts / counts.sum(1, keepdims=True)
    assert np.abs(freq - sc.transition_matrix().numpy()).max() < 0.02
    means = sc.symbol_means()
    noise = seq.x[0] - means[seq.states[0, :-1]]
    assert abs(float(noise.mean())) < 0.01 and abs(float(noise.std()) - 1) < 0.01
    assert torch.equal(seq.y[0], seq.states[0, 1:])
    again = sc.sample_sequences([3], n_states_seq=60_000, dtype=torch.float64)
    assert torch.equal(again.x, seq.x) and torch.equal(again.states, seq.states)


@pytest.mark.parametrize("block", [1, 7, 64, 500])
def test_blocked_step_matches_autograd_in_float64(block):
    seq = sc.sample_sequences([5, 6], n_states_seq=120, dtype=torch.float64)
    p = init_heads([5, 6], std=0.5, dtype=torch.float64)
    loss, grads, stats = blocked_causal_step(p, seq.x, seq.y, block=block, stats=True)
    leaves = {n: t.clone().requires_grad_(True) for n, t in p.items()}
    alpha, logp = dense_causal_forward(leaves, seq.x)
    ref = -logp.gather(-1, seq.y[..., None]).squeeze(-1).mean(-1)
    ref.sum().backward()
    assert torch.allclose(loss, ref.detach(), atol=1e-13)
    for n in leaves:
        assert torch.allclose(grads[n], leaves[n].grad, atol=1e-13, rtol=1e-11), n
    ent = -(logp.exp() * logp).sum(-1).mean(-1)
    assert torch.allclose(stats.entropy, ent.detach(), atol=1e-13)


def test_fast_path_equals_naive_path_on_a_short_run():
    seeds, steps = [42, 2024], 25
    seq = sc.sample_sequences(seeds, n_states_seq=300)
    names = ["SGD", "SGD", "EM-style", "EM-style"]
    x, y = torch.cat([seq.x, seq.x]), torch.cat([seq.y, seq.y])
    h = train(init_heads(seeds + seeds), causal_head_loss_fn(x, y, block=32), SGD(protocol_rates(names)), steps)
    for i, name in enumerate(names):
        naive = train_reference(seeds[i % 2], seq.x[i % 2], seq.y[i % 2], name, steps)
        assert np.allclose(h.loss[:, i], naive, atol=1e-5), name
    assert abs(h.loss[-1, 2] - h.loss[-1, 0]) > 1e-4  # the schedules differ: the comparison can fail


def test_normalized_value_step_changes_only_the_value_update():
    seq = sc.sample_sequences([1], n_states_seq=80, dtype=torch.float64)
    p0 = init_heads([1], dtype=torch.float64)
    fn = causal_head_loss_fn(seq.x, seq.y, value_info=True)
    out = fn(p0)
    assert out.info["N"].sum().item() == pytest.approx(79.0)  # every query spreads one unit of attention
    assert torch.allclose(seq.x.transpose(1, 2) @ out.info["dV"], out.grads["W_V"], atol=1e-15)
    p = {n: t.clone() for n, t in p0.items()}
    NormalizedValueStep(0.1, seq.x, min_share=1e9)(p, out, 0)  # a huge floor: every share equals it
    assert torch.allclose(p["W_Q"], p0["W_Q"] - 0.1 * out.grads["W_Q"])
    assert torch.allclose(p["W_V"], p0["W_V"] - 0.1 * out.grads["W_V"] / 1e9)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="schedule must be one of"):
        protocol_rates(["Adam"])
    with pytest.raises(ValueError, match=r"n_states_seq must be an integer in \[2, 10000000\]"):
        sc.sample_sequences([1], n_states_seq=1)
    seq = sc.sample_sequences([1], n_states_seq=10)
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
        ours = sc.sample_sequences([seed], n_states_seq=30)
        assert torch.equal(ours.states[0], states) and torch.equal(ours.x[0], x)
        torch.manual_seed(seed)
        drawn = [torch.randn(20, 10) * 0.1, torch.randn(20, 10) * 0.1, torch.randn(20, 15) * 0.1,
                 torch.randn(15, 8) * 0.1]
        w = init_heads([seed])
        assert all(torch.equal(w[n][0], d) for n, d in zip(("W_Q", "W_K", "W_V", "W_O"), drawn))
    torch.manual_seed(1010)  # the deep variant's weights come after the held-out sequence
    sc.sample_sequences([1010], n_states_seq=30)
    g = sc.generator_after(1010, 30)
    torch.manual_seed(1010)
    sc._draw(torch.default_generator, 30)
    assert torch.equal(torch.randn(5), torch.randn(5, generator=g))


@pytest.mark.parametrize("seq_len,d_k", [(150, 10), (2, 10), (18, 3), (70, 16), (41, 7)])
def test_the_compiled_kernel_computes_the_torch_paths_closed_forms(monkeypatch, seq_len, d_k):
    """The fused C kernel (float32) against the blocked PyTorch path: loss, the four
    gradients, R2's per-position value gradients and responsibilities, and the statistics,
    for lengths and key widths that straddle the kernel's blocks of 8 queries, chunks of 16
    keys and power-of-two padding."""
    import shutil

    from attention_dynamics.native import NativeUnavailable, causal_head_kernel

    try:
        causal_head_kernel(d_k, 8)
    except NativeUnavailable:
        if shutil.which("cc") or shutil.which("gcc"):
            raise  # a compiler is there: the kernel must build
        pytest.skip("no C compiler here: the pure-PyTorch path runs instead")
    seq = sc.sample_sequences([3, 4, 5], n_states_seq=seq_len)
    p = {n: t * 5 for n, t in init_heads([3, 4, 5], d_k=d_k).items()}  # larger weights: peaked attention
    a = blocked_causal_step(p, seq.x, seq.y, stats=True, value_info=True, native=True)
    b = blocked_causal_step(p, seq.x, seq.y, stats=True, value_info=True, native=False)
    assert torch.allclose(a[0], b[0], atol=1e-6)
    # relative to the largest gradient: with one position the routing gradients are exactly
    # zero in the torch path and rounding-small in the kernel
    scale = max(float(g.abs().max()) for g in b[1].values())
    for name, g in b[1].items():
        assert float((a[1][name] - g).abs().max()) < 1e-5 * max(float(g.abs().max()), 1e-2 * scale), name
    for f in ("entropy", "accuracy", "attention_entropy"):
        assert torch.allclose(getattr(a[2], f), getattr(b[2], f), atol=1e-5), f
    loss_only, none, _ = blocked_causal_step(p, seq.x, seq.y, grads=False, native=True)
    assert none is None and torch.equal(loss_only, a[0])
    monkeypatch.setenv("ATTENTION_DYNAMICS_NATIVE", "0")  # switched off: the torch path, same numbers
    with pytest.raises(NativeUnavailable):
        blocked_causal_step(p, seq.x, seq.y, native=True)
    assert torch.allclose(blocked_causal_step(p, seq.x, seq.y)[0], b[0])

