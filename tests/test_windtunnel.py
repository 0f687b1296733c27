"""The wind tunnel: exact posteriors by brute-force enumeration, metrics on constructed
cases with known answers, and the transformer's two attention paths."""
from __future__ import annotations

import itertools
import math
from pathlib import Path

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


@pytest.mark.parametrize("B,H,T,D", [(2, 3, 7, 16), (1, 2, 203, 16), (5, 4, 15, 16), (1, 1, 1, 16), (3, 2, 33, 8),
                                     (2, 1, 17, 4), (1, 2, 40, 32)])
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
    from attention_dynamics.head import attend
    from attention_dynamics.transformer import causal_attention

    from support import U32, gamma

    g = torch.Generator().manual_seed(T * 31 + D)
    q, k, v = (torch.randn(B, H, T, D, generator=g, requires_grad=True) for _ in range(3))
    grad_out = torch.randn(B, H, T, D, generator=g)
    out = causal_attention(q, k, v, compiled=True)
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
    for name, got, want in zip(tols, (out, *grads), (att.output, *ref_grads)):
        err = (got.double() - want).abs()
        assert bool((err <= tols[name]).all()), f"{name}: error {float(err.max()):.3g} beyond its bound"
    # the PyTorch path: the same function, each within its own bound of the float64 one
    sdpa = causal_attention(q, k, v, compiled=False)
    assert bool(((sdpa.double() - att.output).abs() <= tol_o).all())


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


def test_a_stored_trajectory_replays_what_training_callbacks_see(tmp_path, monkeypatch):
    """The baseline the wind-tunnel chapters share: the measurements replayed from the
    stored states equal those a callback takes during training (the law probe included,
    which needs the optimizer's state), a second request loads instead of training, and
    settings that change training (not eval_size) make a different artifact."""
    monkeypatch.setenv("ATTENTION_DYNAMICS_ARTIFACTS", str(tmp_path))
    cfg = WindTunnelConfig(V=4, L=3, d_model=16, n_heads=2, n_steps=12, batch=8, eval_size=16)
    task, ev = cfg.task, cfg.eval_set()
    tokens, targets = sample_batch(task, 8, torch.Generator().manual_seed(5))

    def probe(model, optimizer):
        return [h["value_alignment"] for h in law_probe(model, optimizer, task, tokens, targets)]

    model = cfg.model()
    live = cfg.train(model, every=4, progress=False, callback=lambda s, p, out: (
        measure(model, task, ev)["mae_bits"], probe(model, out.info["optimizer"])))
    first = cfg.trajectory(every=4, progress=False)
    replayed = first.replay(lambda s, m, opt: (measure(m, task, ev)["mae_bits"], probe(m, opt)))
    assert first.provenance["loaded"] is False and first.steps == [0, 4, 8, 12]
    assert [s for s, _ in live.checkpoints] == first.steps
    for (_, a), (_, b) in zip(live.checkpoints, replayed.checkpoints):
        assert a[0] == b[0] and a[1] == b[1]
    np.testing.assert_array_equal(live.loss, first.loss)
    again = WindTunnelConfig(**{**vars(cfg), "eval_size": 32}).trajectory(every=4, progress=False)
    assert again.provenance["loaded"] is True and again.provenance["key"] == first.provenance["key"]
    for name, t in first.model_at(12).state_dict().items():
        assert torch.equal(t, again.model_at(12).state_dict()[name])
    other = WindTunnelConfig(**{**vars(cfg), "seed": 1}).trajectory(every=4, progress=False)
    assert other.provenance["key"] != first.provenance["key"] and not other.provenance["loaded"]
    with pytest.raises(ValueError, match="step must be one of the stored steps"):
        first.model_at(5)


def test_an_unreadable_artifact_is_made_again(tmp_path, monkeypatch, capsys):
    from attention_dynamics.artifacts import stored

    monkeypatch.setenv("ATTENTION_DYNAMICS_ARTIFACTS", str(tmp_path))
    calls = []

    def make():
        calls.append(1)
        return {"x": torch.arange(3)}

    payload, prov = stored("test", {"a": 1}, make, modules=["attention_dynamics.stats"])
    assert not prov["loaded"] and payload["x"].tolist() == [0, 1, 2]
    Path(prov["path"]).write_bytes(b"truncated")
    payload, prov = stored("test", {"a": 1}, make, modules=["attention_dynamics.stats"])
    assert len(calls) == 2 and not prov["loaded"] and "does not load" in capsys.readouterr().err
    assert stored("test", {"a": 1}, make, modules=["attention_dynamics.stats"])[1]["loaded"]
    assert not [p for p in tmp_path.iterdir() if p.suffix == ".tmp"]


@pytest.mark.parametrize("channel, maps", [("pattern", ("q", "k")), ("values", ("v",))])
def test_a_frozen_channel_stops_learning_and_freezing_its_maps_alone_does_not(channel, maps):
    """An ablation must switch its channel off. Positive control: with the channel frozen,
    the maps it replaces no longer matter (perturbing them leaves the logits unchanged, and
    they receive no gradient), and after training the trained model's attention (or values)
    on held-out sequences are the initial model's, while the rest has moved. Negative
    control: freezing the maps alone (W_Q, W_K; or W_V) leaves the channel free to change
    through the embeddings, positions and LayerNorms."""
    cfg = WindTunnelConfig(V=5, L=4, d_model=16, n_layers=2, n_heads=2, n_steps=60, batch=32, eval_size=32)
    ev = cfg.eval_set()

    def channel_of(model):
        with torch.no_grad():
            traces = model(ev.tokens, inspect=True)[1]
        return [tr.attention.weights.clone() if channel == "pattern" else tr.v.clone() for tr in traces]

    model = cfg.model()
    start = channel_of(model)
    other = model.blocks[1].ff[0].weight.detach().clone()
    model.freeze_channel(channel)
    with torch.no_grad():
        before = model(ev.tokens)[0]
        for name in maps:  # the replaced maps no longer matter
            getattr(model.blocks[0], name).weight.add_(1.0)
        assert torch.equal(model(ev.tokens)[0], before)
        for name in maps:
            getattr(model.blocks[0], name).weight.sub_(1.0)
    cfg.train(model, progress=False)
    assert all(getattr(model.blocks[0], name).weight.grad is None for name in maps)
    assert all(torch.equal(a, b) for a, b in zip(channel_of(model), start))
    assert not torch.equal(model.blocks[1].ff[0].weight, other)  # the rest learns
    assert not any("frozen" in k for k in model.state_dict())  # not saved with the model
    with pytest.raises(ValueError, match="a channel is frozen already"):
        model.freeze_channel("values")
    with pytest.raises(ValueError, match="channel"):
        cfg.model().freeze_channel("keys")

    maps_only = cfg.model()
    cfg.train(maps_only, frozen=("routing",) if channel == "pattern" else ("values",), progress=False)
    moved = max(float((a - b).abs().max()) for a, b in zip(channel_of(maps_only), start))
    assert moved > 1e-3  # float32 weights or values move by far more than rounding (1e-7)
