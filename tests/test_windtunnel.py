"""The wind tunnel: exact posteriors by brute-force enumeration, metrics on constructed
cases with known answers, and the transformer's two attention paths."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from attention_dynamics.geometry import (attention_entropy_bits, calibration_errors, entropy_bits, key_orthogonality,
                                         pc_shares, random_frame_abs_cosine, spearman)
from attention_dynamics.tasks.bijection import (WindTunnel, bayes_entropy_bits, posterior, posterior_entropy_bits,
                                                sample_batch,
                                                supervised_positions)
from attention_dynamics.transformer import CausalTransformer, TransformerConfig, parameter_groups
from attention_dynamics.geometry import measure
from attention_dynamics.law_probe import law_probe
from attention_dynamics.windtunnel import WindTunnelConfig


def brute_force_posterior(tokens, V, L):
    """Enumerate every bijection consistent with the prefix; the predictive distribution of
    the next value (and of the answer) is the share of consistent bijections giving each."""
    out = []
    perms = list(itertools.permutations(range(V)))
    for i in range(L + 1):
        if i < L:
            seen = [(tokens[2 * j], tokens[2 * j + 1]) for j in range(i)]
            key = tokens[2 * i]
        else:
            seen = [(tokens[2 * j], tokens[2 * j + 1]) for j in range(L)]
            key = tokens[2 * L]
        counts = np.zeros(V)
        for pi in perms:
            if all(pi[k] == v for k, v in seen):
                counts[pi[key]] += 1
        out.append(counts / counts.sum())
    return np.array(out)


@pytest.mark.parametrize("V,L", [(3, 2), (4, 3), (4, 4), (5, 3)])
def test_posterior_and_entropies_match_enumeration(V, L):
    task = WindTunnel(V, L)
    tokens, targets = sample_batch(task, 6, torch.Generator().manual_seed(V * 10 + L))
    post = posterior(tokens, task)
    for b in range(len(tokens)):
        ref = brute_force_posterior(tokens[b].tolist(), V, L)
        assert np.allclose(post[b].numpy(), ref, atol=1e-12)
        ent = [-(p[p > 0] * np.log2(p[p > 0])).sum() for p in ref]
        assert np.allclose(bayes_entropy_bits(task).numpy(), ent, atol=1e-12)
        assert post[b, np.arange(L + 1), targets[b]].min() > 0  # every target is possible


@pytest.mark.parametrize("V,L", [(3, 3), (4, 5), (5, 4)])
def test_posterior_with_repeated_keys_matches_enumeration(V, L):
    """The control variant: keys drawn with replacement; a repeated key's value is certain,
    and the posterior entropy at a position varies from sample to sample."""
    task = WindTunnel(V, L, repeats=True)
    tokens, targets = sample_batch(task, 40, torch.Generator().manual_seed(V * 10 + L))
    post = posterior(tokens, task)
    bits = posterior_entropy_bits(post)
    for b in range(8):
        ref = brute_force_posterior(tokens[b].tolist(), V, L)
        assert np.allclose(post[b].numpy(), ref, atol=1e-12)
    assert post[torch.arange(40)[:, None], torch.arange(L + 1), targets].min() > 0
    keys = tokens[:, 0:2 * L:2]
    assert any(len(set(r.tolist())) < L for r in keys)  # some keys do repeat
    assert float(bits[:, 1:L].std(0).max()) > 0  # entropy is not a function of position alone
    with pytest.raises(ValueError, match="depends on the sample"):
        bayes_entropy_bits(task)


def test_samples_are_valid_bijection_sequences():
    task = WindTunnel(6, 4)
    tokens, targets = sample_batch(task, 200, torch.Generator().manual_seed(0))
    keys, vals = tokens[:, 0:8:2], tokens[:, 1:8:2]
    assert all(len(set(r.tolist())) == 4 for r in keys) and all(len(set(r.tolist())) == 4 for r in vals)
    q = tokens[:, 8]
    assert bool((keys == q[:, None]).any(1).all())
    assert torch.equal(targets[:, :4], vals)
    assert torch.equal(targets[:, 4], vals[keys == q[:, None]])
    assert supervised_positions(task).tolist() == [0, 2, 4, 6, 8]
    with pytest.raises(ValueError, match=r"L must be an integer in \[1, 6\]"):
        WindTunnel(6, 7)


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
    assert np.allclose(out["abs_error_bits"].numpy(), [0.0, 1.0, 2.0])
    assert np.allclose(out["kl_bits"].numpy(), [0.0, 1.0, 2.0])


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


def test_transformer_paths_agree_and_expose_every_head():
    torch.manual_seed(0)
    cfg = TransformerConfig(n_out=5, d_model=16, n_layers=2, n_heads=4, d_ff=32, input="tokens", vocab=5, max_len=9)
    m = CausalTransformer(cfg).eval()
    x = torch.randint(0, 5, (3, 9))
    with torch.no_grad():
        fast, _ = m(x)
        slow, traces = m(x, inspect=True)
    assert torch.allclose(fast, slow, atol=1e-5)
    assert len(traces) == 2 and traces[0].attention.weights.shape == (3, 4, 9, 9)
    assert traces[0].k.shape == (3, 4, 9, 4) and torch.all(torch.triu(traces[1].attention.weights[0, 0], 1) == 0)
    groups = parameter_groups(m)
    assert {n.split(".")[2] for n in groups["routing"]} == {"q", "k"} and all(".v." in n for n in groups["values"])
    with pytest.raises(ValueError, match="token ids must lie in"):
        m(torch.full((1, 3), 7))
    with pytest.raises(ValueError, match="d_model = 10 must be a multiple of n_heads = 4"):
        TransformerConfig(n_out=2, d_model=10, n_heads=4, input="tokens", vocab=3)


def test_short_training_lowers_the_calibration_error_and_probe_is_exact_for_r2():
    cfg = WindTunnelConfig(V=4, L=3, d_model=16, n_heads=2, n_steps=150, batch=64, lr=3e-3, eval_size=64)
    task, ev, m = cfg.task, cfg.eval_set(), cfg.model()
    before = measure(m, task, ev)["mae_bits"]
    probes = []
    tok, tgt = sample_batch(task, 32, torch.Generator().manual_seed(1))

    def cb(step, p, out):
        if step == 0:
            probes.extend(law_probe(out.info["model"], out.info["optimizer"], task, tok, tgt, sgd_lr=0.1))

    cfg.train(m, callback=cb, every=200, progress=False)
    after = measure(m, task, ev)
    assert after["mae_bits"] < before
    assert len(after["layers"]) == 2 and len(probes) == 2 * 2
    assert max(p["r2_error"] for p in probes) < 1e-5
    with pytest.raises(ValueError, match="roles must be among"):
        cfg.train(m, frozen=("keys",))
