"""The wind-tunnel experiment: short training lowers the calibration error, a stored
trajectory replays what training saw, an unreadable stored model is made again, and a frozen
channel stops learning. (Its task is tested in test_bijection.py, its metrics in
test_geometry.py, its transformer in test_transformer.py.)"""
from __future__ import annotations


import numpy as np
import pytest
import torch

from attention_dynamics.tasks.bijection import sample_batch
from attention_dynamics.geometry import measure_model
from attention_dynamics.law_probe import law_probe
from attention_dynamics.windtunnel import WindTunnelConfig


def test_short_training_lowers_the_calibration_error_and_probe_is_exact_for_r2():
    cfg = WindTunnelConfig(V=4, L=3, d_model=16, n_heads=2, n_steps=150, batch=64, lr=3e-3, eval_size=64)
    task, ev, m = cfg.task, cfg.eval_set(), cfg.model()
    before = measure_model(m, task, ev)["mae_bits"]
    probes = []
    tok, tgt = sample_batch(task, 32, torch.Generator().manual_seed(1))

    def cb(step, p, out):
        if step == 0:
            probes.extend(law_probe(out.info["model"], out.info["optimizer"], task, tok, tgt, sgd_lr=0.1))

    cfg.train(m, callback=cb, every=200, progress=False)
    after = measure_model(m, task, ev)
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
        measure_model(model, task, ev)["mae_bits"], probe(model, out.info["optimizer"])))
    first = cfg.trajectory(every=4, progress=False)
    replayed = first.replay(lambda s, m, opt: (measure_model(m, task, ev)["mae_bits"], probe(m, opt)))
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
