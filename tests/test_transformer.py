"""The one small transformer: its attention paths agree and expose every head, and its compiled
attention and dropout are what they replace."""
from __future__ import annotations

import math

import pytest
import torch

from attention_dynamics.transformer import CausalTransformer, TransformerConfig


def test_transformer_paths_agree_and_expose_every_head():
    torch.manual_seed(0)
    cfg = TransformerConfig(n_out=5, d_model=16, n_layers=2, n_heads=4, d_ff=32, input="tokens", vocab=5, max_len=9)
    m = CausalTransformer(cfg).eval()
    x = torch.randint(0, 5, (3, 9))
    with torch.no_grad():
        fast, _ = m(x)
        slow, traces = m(x, inspect=True)
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-5)
    assert len(traces) == 2 and traces[0].attention.weights.shape == (3, 4, 9, 9)
    assert traces[0].k.shape == (3, 4, 9, 4) and torch.all(torch.triu(traces[1].attention.weights[0, 0], 1) == 0)
    groups = m.parameter_roles()
    assert {n.split(".")[2] for n in groups["routing"]} == {"q", "k"} and all(".v." in n for n in groups["values"])
    with pytest.raises(ValueError, match="token ids must lie in"):
        m(torch.full((1, 3), 7))
    with pytest.raises(ValueError, match="d_model = 10 must be a multiple of n_heads = 4"):
        TransformerConfig(n_out=2, d_model=10, n_heads=4, input="tokens", vocab=3)


SHAPES = [(2, 3, 7, 16), (1, 2, 203, 16), (5, 4, 15, 16), (1, 1, 1, 16), (3, 2, 33, 8), (2, 1, 17, 4), (1, 2, 40, 32)]


@pytest.mark.parametrize("B,H,T,D", SHAPES)
def test_the_compiled_causal_attention_is_softmax_attention_and_its_gradient(B, H, T, D):
    """The compiled kernel (float32, query blocks of 8, keys in chunks of 16: T and the
    shapes straddle both) against softmax attention computed explicitly in float64, forward
    and the gradients of q, k and v, each entry within its float32 error bound (support.gamma):

    - a score is a D-term dot product, error gamma_D |q| |k| / sqrt(D); a weight
      exp(s - lse) carries that of two scores, of the T-term sum under the log, 4 ulp each
      of exp and log (libmvec's bound) and the roundings of max + log and s - lse: a
      relative error e_a;
    - o_i = sum_j a_ij v_j (T terms, weights summing to 1): (e_a + gamma_T) |v|;
    - ds_ij = a_ij (dO_i . v_j - dO_i . o_i) / sqrt(D): per unit weight, e_a times
      |dO_i . v_j - delta_i| <= 2 |dO| |v|, two D-term dot products, and the error of o;
    - dq_i = sum_j ds_ij k_j (weights of a row sum to 1), dk_j = sum_i ds_ij q_i and
      dv_j = sum_i a_ij dO_i (weights of a column sum to N_j, its responsibility).

    Norms are the largest row norms. With one key the exact gradients are zero and the
    kernel's are rounding: the bound is on the terms, so it holds there too."""
    failed = _attention_beyond_bounds(B, H, T, D)
    assert not failed, failed
    # the PyTorch path: the same function, within its own bound of the float64 one
    assert not [f for f in _attention_beyond_bounds(B, H, T, D, compiled=False) if f.startswith("o:")]


def _attention_beyond_bounds(B, H, T, D, compiled=True) -> list[str]:
    """The outputs of causal_attention (forward, and the gradients of q, k and v) that leave
    their float32 bounds (the test above) somewhere, with their largest errors."""
    from attention_dynamics.head import attend
    from attention_dynamics.transformer import causal_attention

    from support import U32, gamma

    g = torch.Generator().manual_seed(T * 31 + D)
    q, k, v = (torch.randn(B, H, T, D, generator=g, requires_grad=True) for _ in range(3))
    grad_out = torch.randn(B, H, T, D, generator=g)
    out = causal_attention(q, k, v, compiled=compiled)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    att = attend(q64, k64, v64, causal=True)
    ref_grads = torch.autograd.grad(att.output, (q64, k64, v64), grad_out.double())

    Qn, Kn, Vn, Gn = (float(t.detach().double().norm(dim=-1).max()) for t in (q, k, v, grad_out))
    scale = D ** -0.5
    S = Qn * Kn * scale  # bounds every |score|
    # two scores; the T-term sum of the softmax; exp (4 ulp), log (4 ulp of log T at most),
    # and the roundings of max + log and of s - lse
    e_a = 2 * gamma(D) * S + gamma(T) + (10 + 6 * math.log(T) + 3 * S) * U32
    tol_o = (e_a + gamma(T)) * Vn
    e_ds = (2 * e_a * Gn * Vn + 2 * gamma(D) * Gn * Vn + Gn * tol_o) * scale  # per unit weight
    e_sum = e_ds + gamma(T) * 2 * Gn * Vn * scale  # and the T-term sum over ds
    N = att.weights.detach().sum(-2)[..., None]  # (B, H, T, 1): each key's responsibility
    tols = {"o": tol_o, "dq": e_sum * Kn, "dk": e_sum * Qn * N, "dv": (e_a + gamma(T)) * Gn * N}
    failed = []
    for name, got, want in zip(tols, (out, *grads), (att.output, *ref_grads)):
        err = (got.detach().double() - want.detach()).abs()
        if not bool((err <= tols[name]).all()):
            failed.append(f"{name}: error {float(err.max()):.3g} beyond its bound")
    return failed


@pytest.mark.parametrize("B,H,T,D", SHAPES)
def test_the_proposed_attention_kernel_is_softmax_attention_and_its_gradient(tmp_path, B, H, T, D):
    """The attention kernel proposed in benchmarks/proposed/ (not the library's yet: see
    benchmarks/proposed_kernel.py), by the bounds of the test above, so that it is right
    before a paper build adopts it: D = 16 takes its path for rows wider than a machine
    vector on AVX2 (two parts), D = 32 there and on AVX-512 (four and two)."""
    from attention_dynamics.native import causal_attention_kernel

    from support import kernel_or_skip, proposed_kernels

    proposed = proposed_kernels()
    folder = proposed.proposed_sources(tmp_path / "native")  # refuses patches that change nothing
    with proposed.built_from(folder):
        kernel_or_skip(lambda: causal_attention_kernel(D))
        failed = _attention_beyond_bounds(B, H, T, D)
    assert not failed, failed


@pytest.mark.parametrize("line,bug,caught", [
    ("store_part(O + (size_t)(i0 + r) * DH + h, acc[r] * inv[r]);",
     "store_part(O + (size_t)(i0 + r) * DH + h, acc[r] * (0.99f * inv[r]));", "o"),
    ("accq[r] += ds * kj;", "accq[r] += 0.75f * ds * kj;", "dq"),
    ("store_part(dV + (size_t)j * DH + h, load_part(dV + (size_t)j * DH + h) + dvj);",
     "store_part(dV + (size_t)j * DH + h, load_part(dV + (size_t)j * DH + h) + 0.5f * dvj);", "dv"),
], ids=["o-off-by-1%", "three-quarter-dq", "half-dv"])
def test_the_proposed_attention_kernels_check_rejects_planted_bugs(tmp_path, line, bug, caught):
    """Negative control of the test above: the patch with a bug planted in its path for wide
    rows, at D = 32 (that path on AVX2 and AVX-512 alike), fails it in the output the bug
    changes."""
    from attention_dynamics.native import causal_attention_kernel

    from support import kernel_or_skip, planted_patches, proposed_kernels

    proposed = proposed_kernels()
    folder = proposed.proposed_sources(tmp_path / "native",
                                       planted_patches(tmp_path / "patches", "causal_attention", line, bug))
    assert bug in (folder / "causal_attention.c").read_text()
    with proposed.built_from(folder):
        kernel_or_skip(lambda: causal_attention_kernel(32))
        failed = _attention_beyond_bounds(1, 2, 40, 32)
    assert [f for f in failed if f.startswith(caught + ":")], failed


def test_the_compiled_dropout_keeps_the_right_share_scaled():
    from attention_dynamics.transformer import Dropout

    torch.manual_seed(0)
    drop, x = Dropout(0.25), torch.ones(200_000)
    y = drop(x)
    kept = y != 0
    assert abs(float(kept.double().mean()) - 0.75) < 0.005 and torch.allclose(y[kept], torch.full_like(y[kept], 4 / 3))
    assert torch.equal(drop.eval()(x), x)
    with pytest.raises(ValueError, match="p must"):
        Dropout(1.0)
