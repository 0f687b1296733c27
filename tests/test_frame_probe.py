"""The frame probe (attention_dynamics.frame_probe): every instrument on a case true by
construction (it must say "holds") and on one where no structure exists (it must read
chance), and bad inputs refused by name."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attention_dynamics.frame_probe import (choose_frame_head, frame_heads, frame_mass_chance, manifold_dimensionality,
                                            matched_pair_dominance, paper_key_orthogonality, qk_alignment,
                                            query_scores, random_abs_cosine, score_dominance, symbol_key_frame,
                                            value_manifold)
from attention_dynamics.geometry import random_frame_abs_cosine
from attention_dynamics.tasks.bijection import WindTunnel, eval_set
from attention_dynamics.transformer import CausalTransformer, TransformerConfig
from attention_dynamics.windtunnel import WindTunnelConfig

V, L = 8, 7
TASK = WindTunnel(V, L)
EV = eval_set(TASK, 512, seed=3)
D, H = 32, 2  # the hand-built model: d_head = 16
DH = D // H
EVEN, ODD, QUERY = V, V + 1, V + 2  # residual coordinates of the three position codes
FRAME = (1, 1)  # the head hand-set to retrieve
DECOY = (0, 1)  # the same construction, weaker


def retrieval_model(c: float = 40.0, c_decoy: float = 4.0) -> CausalTransformer:
    """A two-layer model whose head FRAME attends, at the query, to the key position of the
    pair holding the query's key, by construction.

    Residual input x = e_token + e_code (one-hot token in coordinates 0..V-1, one of three
    position codes: even context, odd context, query). Every x has two ones, so LayerNorm
    is one affine map a (x - m 1) for all of them, which the maps below undo. In head FRAME
    the key is k = e_token + [even context] u and the query c (e_token + u) (u a spare
    coordinate of the head): the query scores c (2, 1, 1, 0) / 4 on the matching key, the
    other keys (and itself), a value of the same token, the other values. Layer 0 writes
    nothing to the residual stream; every other head has zero queries and keys (uniform)."""
    model = CausalTransformer(TransformerConfig(n_out=V, d_model=D, n_layers=2, n_heads=H, d_ff=16, input="tokens",
                                                vocab=V, max_len=2 * L + 1))
    m = 2.0 / D
    a = 1.0 / math.sqrt(2.0 / D - m * m + 1e-5)  # LayerNorm's scale for these inputs (biased variance, eps)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for block in model.blocks:
            block.ln1.weight.fill_(1.0)
            block.ln2.weight.fill_(1.0)
        model.ln_f.weight.fill_(1.0)
        model.inp.weight[:, :V] = torch.eye(V)
        model.pos.weight[0:2 * L:2, EVEN] = 1.0
        model.pos.weight[1:2 * L:2, ODD] = 1.0
        model.pos.weight[2 * L, QUERY] = 1.0
        for (layer, head), scale in ((FRAME, c), (DECOY, c_decoy)):
            block, rows = model.blocks[layer], slice(head * DH, (head + 1) * DH)
            Mk = torch.zeros(DH, D)
            Mk[:V, :V] = torch.eye(V)
            Mk[V, EVEN] = 1.0  # u: the even-context code
            Mq = torch.zeros(DH, D)
            Mq[:V, :V] = scale * torch.eye(V)
            uq = torch.zeros(DH)
            uq[V] = scale
            block.k.weight[rows] = Mk / a
            block.k.bias[rows] = m * Mk.sum(1)
            block.q.weight[rows] = Mq / a
            block.q.bias[rows] = m * Mq.sum(1) + uq
    return model.eval()


# ----------------------------------------------------------------------------- frame heads


def test_the_hand_set_retrieval_head_is_chosen_and_uniform_heads_read_chance():
    model = retrieval_model()
    masses = frame_heads(model, TASK, EV)
    chance = frame_mass_chance(TASK, EV.tokens)
    assert masses.shape == (2, H)
    assert choose_frame_head(masses) == FRAME
    assert masses[FRAME] > 0.99
    assert chance < masses[DECOY] < masses[FRAME]  # the weaker copy gets some mass, not the most
    uniform = [(0, 0), (1, 0)]
    assert np.allclose([masses[i] for i in uniform], chance, atol=1e-6)  # zero scores: uniform attention
    assert chance == pytest.approx(2 / (2 * L + 1))


def test_frame_mass_chance_counts_repeated_keys():
    task = WindTunnel(4, 3, repeats=True)
    tokens = torch.tensor([[1, 0, 1, 2, 3, 1, 1],  # the query's key in two pairs
                           [0, 3, 1, 2, 2, 0, 2]])  # in one
    assert frame_mass_chance(task, tokens) == pytest.approx((4 / 7 + 2 / 7) / 2)
    model = retrieval_model(c=0.0, c_decoy=0.0)  # every head uniform
    rep = WindTunnel(V, L, repeats=True)
    ev = eval_set(rep, 256, seed=1)
    chance = frame_mass_chance(rep, ev.tokens)
    assert chance > 2 / (2 * L + 1)  # some queries' keys sit in several pairs
    np.testing.assert_allclose(frame_heads(model, rep, ev), chance, rtol=1e-5, atol=1e-6)


def test_choose_frame_head_takes_the_argmax_and_refuses_bad_arrays():
    assert choose_frame_head(np.array([[0.1, 0.2], [0.9, 0.3]])) == (1, 0)
    assert choose_frame_head(torch.tensor([[0.5, 0.5]])) == (0, 0)  # first on a tie
    with pytest.raises(ValueError, match="masses must be a non-empty"):
        choose_frame_head(np.array([0.1, 0.2]))
    with pytest.raises(ValueError, match="masses must be finite"):
        choose_frame_head(np.array([[0.1, np.nan]]))


# ----------------------------------------------------------------------------- matched-pair dominance


def test_query_scores_are_the_traced_scores_of_that_head():
    model = WindTunnelConfig(seed=4).model().eval()
    ev = eval_set(TASK, 64, seed=6)
    with torch.no_grad():
        _, traces = model(ev.tokens, inspect=True)
    for layer, head in ((0, 2), (1, 3)):
        s = query_scores(model, TASK, ev, layer, head)
        ref = traces[layer].attention.scores[:, head, 2 * L, :2 * L].double()
        torch.testing.assert_close(s, ref, rtol=1e-5, atol=1e-5)


def test_dominance_holds_on_the_hand_set_head_and_not_elsewhere():
    model = retrieval_model()
    d = matched_pair_dominance(model, TASK, EV, *FRAME)
    assert d["top_is_match"] == 1.0 and d["key_top_is_match"] == 1.0 and d["value_top_is_match"] == 0.0
    assert d["chance_top"] == pytest.approx(2 / (2 * L)) and d["key_chance_top"] == pytest.approx(1 / (2 * L))
    # the other scores are bimodal (other keys c/4, values 0), so even a perfect retriever's
    # margin is a few of their sd: (2 - 1/2) / (1/2 + a little) here
    assert d["margin_sd"] > 2.5 and d["margin_sd"] > 3 * d["chance_margin_sd"]
    assert d["top_z"] > 20
    flat = matched_pair_dominance(model, TASK, EV, 0, 0)  # zero scores: the top is position 0, a fixed place
    assert abs(flat["top_is_match"] - flat["chance_top"]) < 4 * flat["chance_top_sd"]


def test_dominance_on_synthetic_scores_true_and_null():
    B, d = 400, 16
    gen = torch.Generator().manual_seed(0)
    tokens = EV.tokens[:B]
    pair = (tokens[:, 0:2 * L:2] == tokens[:, 2 * L, None]).int().argmax(1)  # the matching pair
    keys = torch.linalg.qr(torch.randn(B, d, 2 * L, generator=gen, dtype=torch.float64))[0].transpose(1, 2)  # orthonormal
    q = 10 * keys[torch.arange(B), 2 * pair] + 0.1 * torch.randn(B, d, generator=gen, dtype=torch.float64)
    scores = torch.einsum("bd,bpd->bp", q, keys) / math.sqrt(d)
    yes = score_dominance(scores, tokens, TASK)
    assert yes["top_is_match"] == 1.0 and yes["key_top_is_match"] == 1.0 and yes["margin_sd"] > 20
    # null: independent scores; the share is binomial, the margin the Monte Carlo null's
    noise = torch.randn(B, 2 * L, generator=gen, dtype=torch.float64)
    no = score_dominance(noise, tokens, TASK, draws=50)
    for prefix in ("", "key_", "value_"):
        assert abs(no[prefix + "top_is_match"] - no[prefix + "chance_top"]) < 4 * no[prefix + "chance_top_sd"]
    assert abs(no["margin_sd"] - no["chance_margin_sd"]) < 4 * 1.0 / math.sqrt(B)  # margins have sd about 1
    assert no["chance_margin_sd"] > 0.3  # the best of two positions sits above the mean of the rest


def test_a_content_blind_model_at_init_reads_chance():
    """Random weights at init with the token embedding zeroed: every sample's scores are
    the same, the top is one fixed position, and whether it falls in the matching pair is
    a Bernoulli(1/L) draw per sample, so the share is binomial around chance_top."""
    model = WindTunnelConfig(seed=0).model().eval()
    with torch.no_grad():
        model.inp.weight.zero_()
    ev = eval_set(TASK, 256, seed=7)
    for layer, head in ((0, 0), (0, 3), (1, 1), (1, 2)):
        d = matched_pair_dominance(model, TASK, ev, layer, head)
        assert abs(d["top_is_match"] - d["chance_top"]) < 4 * d["chance_top_sd"]
        assert d["chance_top_sd"] == pytest.approx(math.sqrt((1 / L) * (1 - 1 / L) / len(ev.tokens)))


# ----------------------------------------------------------------------------- key orthogonality (Paper I)


def test_key_orthogonality_on_orthonormal_keys_and_on_a_centred_simplex():
    model = CausalTransformer(TransformerConfig(n_out=V, d_model=D, n_layers=1, n_heads=H, input="tokens", vocab=V))
    with torch.no_grad():
        model.inp.weight.zero_()
        model.inp.weight[:, :V] = torch.eye(V)
        model.blocks[0].k.weight.zero_()
        model.blocks[0].k.weight[:V, :V] = torch.eye(V)  # head 0: keys e_s, orthonormal
        model.blocks[0].k.weight[DH:DH + V, :V] = torch.eye(V) - 1.0 / V  # head 1: e_s - 1/V, a regular simplex
        model.blocks[0].k.bias.fill_(3.0)  # the paper's keys carry no bias: ignored
    r = paper_key_orthogonality(model)
    simplex = 1 / (V - 1)
    assert r["simplex_abs_cos"] == pytest.approx(simplex)
    assert r["abs_cos"][0] == pytest.approx(0.0, abs=1e-12) and r["signed_cos"][0] == pytest.approx(0.0, abs=1e-12)
    assert r["centred_abs_cos"][0] == pytest.approx(simplex)  # orthonormal keys, centred, are a simplex
    assert r["abs_cos"][1] == pytest.approx(simplex) and r["signed_cos"][1] == pytest.approx(-simplex)
    assert r["centred_abs_cos"][1] == pytest.approx(simplex)
    assert r["random_abs_cos"] == pytest.approx(random_abs_cosine(DH))
    assert r["random_centred_abs_cos"] == pytest.approx(random_frame_abs_cosine(V, DH))


def test_random_keys_give_the_computed_baselines():
    draws, d = 4000, 16
    keys = torch.randn(draws, V, d, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    s = symbol_key_frame(keys)
    n_pairs = V * (V - 1) / 2
    sd_signed = math.sqrt(1 / d / n_pairs)  # the baseline paper_key_orthogonality reports
    assert abs(float(s["signed_cos"].mean())) < 4 * sd_signed / math.sqrt(draws)
    assert float(s["signed_cos"].std()) == pytest.approx(sd_signed, rel=0.05)
    se = float(s["abs_cos"].std()) / math.sqrt(draws)
    assert abs(float(s["abs_cos"].mean()) - random_abs_cosine(d)) < 4 * se
    se = float(s["centred_abs_cos"].std()) / math.sqrt(draws)
    assert abs(float(s["centred_abs_cos"].mean()) - random_frame_abs_cosine(V, d)) < 4 * se + 0.003  # MC baseline
    assert random_abs_cosine(1) == 1.0 and random_abs_cosine(3) == pytest.approx(0.5)  # uniform |cos| on S^2
    assert random_abs_cosine(4000) == pytest.approx(math.sqrt(2 / (math.pi * 4000)), rel=1e-3)


# ----------------------------------------------------------------------------- query-key alignment (Paper I)


def test_qk_alignment_on_the_hand_set_head_and_at_chance():
    model = retrieval_model()
    r = qk_alignment(model, TASK, EV, *FRAME)
    assert r["match_cos"] == pytest.approx(1.0, abs=1e-5)  # q(query) is parallel to the matching key
    assert r["other_cos"] == pytest.approx(0.5, abs=1e-5)  # the other keys share only the even code
    assert r["grid"].shape == (L + 1, L)
    assert np.isnan(r["grid"][0]).all() and np.isnan(r["grid"][3, 3:]).all()
    assert np.allclose(r["grid"][1:L][np.tril(np.ones((L - 1, L), bool))], 0.5, atol=1e-5)  # fresh keys: no match
    assert r["random_cos_sd"] == pytest.approx(1 / math.sqrt(DH))
    # a content-blind model at init: every sample alike, the matching key a uniformly placed one
    blind = WindTunnelConfig(seed=0).model().eval()
    with torch.no_grad():
        blind.inp.weight.zero_()
    for layer in range(2):
        b = qk_alignment(blind, TASK, EV, layer)
        assert abs(b["match_minus_other"]) < 4 * b["match_minus_other_se"] + 1e-9


# ----------------------------------------------------------------------------- value manifold (Paper I)


def test_manifold_dimensionality_on_known_spectra_and_on_noise():
    n = 600
    gen = torch.Generator().manual_seed(2)
    e = np.repeat(np.log2(V - np.arange(L)), n // L + 1)[:n]
    line = torch.as_tensor(e)[:, None] * torch.randn(1, 12, generator=gen, dtype=torch.float64)  # rank one
    r = manifold_dimensionality(line, e)
    assert r["dims_std"] == 1 and r["dims_95"] == 1 and r["pc1_share_std"] == pytest.approx(1.0)
    # Spearman: entropies tie within a position, and rounding orders the tied PC1 values
    assert r["pc1_spearman_std"] == pytest.approx(1.0, abs=1e-3) and r["pc1_abs_pearson"] == pytest.approx(1.0)
    assert r["random"]["dims_std"] > 8 and r["random"]["pc1_spearman_std"] < 0.2
    # exact variance shares 0.7, 0.22, 0.05, 0.03: 90 % in two components, 95 % in three
    G = torch.randn(n, 4, generator=gen, dtype=torch.float64)
    Q = torch.linalg.qr(G - G.mean(0))[0]  # orthonormal columns of mean zero
    X = Q * torch.tensor([0.7, 0.22, 0.05, 0.03], dtype=torch.float64).sqrt()
    r = manifold_dimensionality(X, e)
    assert (r["dims_90"], r["dims_95"]) == (2, 3) and r["pc1_share"] == pytest.approx(0.7)
    noise = torch.randn(n, 12, generator=gen, dtype=torch.float64)
    r = manifold_dimensionality(noise, e)
    assert r["pc1_spearman_std"] < 4 / math.sqrt(n) and r["dims_std"] >= r["random"]["dims_std"] - 1


def test_value_manifold_reads_the_final_representation_at_the_key_positions():
    model = WindTunnelConfig(seed=0).model().eval()
    ev = eval_set(TASK, 64, seed=5)
    with torch.no_grad():
        h = model.inp(ev.tokens) + model.pos(torch.arange(2 * L + 1))
        for block in model.blocks:
            h, _ = block(h)
        h = model.ln_f(h)
    for positions, offset in (("keys", 0), ("values", 1)):
        X = h[:, offset:2 * L:2].double().reshape(-1, model.cfg.d_model)
        ref = manifold_dimensionality(X, ev.pos_bits[:, :L].reshape(-1).numpy())
        got = value_manifold(model, TASK, ev, positions=positions)
        assert got["n"] == 64 * L and got["positions"] == positions
        for key in ("dims_std", "pc1_share_std", "pc1_spearman_std", "dims_95", "pc1_abs_pearson"):
            assert got[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-9)


# ----------------------------------------------------------------------------- bad input


def test_bad_input_is_refused_by_name():
    model = retrieval_model()
    with pytest.raises(TypeError, match="model must be a CausalTransformer"):
        frame_heads("model", TASK, EV)
    with pytest.raises(TypeError, match="task must be a WindTunnel"):
        frame_heads(model, (V, L), EV)
    with pytest.raises(TypeError, match="ev must be an EvalSet"):
        frame_heads(model, TASK, EV.tokens)
    with pytest.raises(ValueError, match=r"ev.tokens must have 13 columns"):
        frame_heads(model, WindTunnel(V, 6), EV)
    with pytest.raises(ValueError, match="max_len = 15 must be at least"):
        frame_heads(model, WindTunnel(V, 8), eval_set(WindTunnel(V, 8), 8))
    with pytest.raises(ValueError, match=r"layer must be an integer in \[0, 1\], got 2"):
        matched_pair_dominance(model, TASK, EV, 2, 0)
    with pytest.raises(ValueError, match=r"head must be an integer in \[0, 1\], got -1"):
        matched_pair_dominance(model, TASK, EV, 0, -1)
    with pytest.raises(ValueError, match=r"scores must have shape \(B, 2L\)"):
        score_dominance(torch.zeros(3, 5), EV.tokens[:3], TASK)
    bad = EV.tokens[:4].clone()
    bad[:, 2 * L] = torch.tensor([next(s for s in range(V) if s not in row[0:2 * L:2].tolist()) for row in bad])
    with pytest.raises(ValueError, match="query key .* must occur among the context keys"):
        score_dominance(torch.zeros(4, 2 * L), bad, TASK)
    with pytest.raises(ValueError, match=r"draws must be an integer in \[1, 10000\]"):
        score_dominance(torch.zeros(4, 2 * L), EV.tokens[:4], TASK, draws=0)
    with pytest.raises(ValueError, match="keys must hold at least 2 symbols"):
        symbol_key_frame(torch.zeros(1, 4))
    with pytest.raises(ValueError, match=r"n_symbols must be an integer in \[2, 8\]"):
        paper_key_orthogonality(model, n_symbols=9)
    with pytest.raises(ValueError, match="entropies must have one entry per row"):
        manifold_dimensionality(torch.zeros(10, 3), np.zeros(9))
    with pytest.raises(ValueError, match=r"threshold must be a finite number in \(0, 1\]"):
        manifold_dimensionality(torch.randn(10, 3), np.zeros(10), threshold=1.5)
    with pytest.raises(ValueError, match="positions must be one of"):
        value_manifold(model, TASK, EV, positions="queries")
    with pytest.raises(ValueError, match=r"d must be an integer >= 1"):
        random_abs_cosine(0)
