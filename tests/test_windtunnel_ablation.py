"""windtunnel_ablation: a stored ablated run measures as the same run measured while it
trained (bit for bit), loads as it was stored, and rejects bad settings by name."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from attention_dynamics.geometry import measure_model
from attention_dynamics.windtunnel import WindTunnelConfig
from attention_dynamics.windtunnel_ablation import Ablation, ablated, ablation_settings

CFG = WindTunnelConfig(V=5, L=4, d_model=16, n_layers=2, n_heads=2, n_steps=30, batch=16, eval_size=32)


def _measured_while_training(cfg, every, channel=None, **kw):
    """The chapter's former path: a fresh model trained with the measurement as callback."""
    model, ev = cfg.model(), cfg.eval_set()
    if channel is not None:
        model.freeze_channel(channel)
    return cfg.train(model, callback=lambda s, p, o: measure_model(model, cfg.task, ev), every=every,
                     progress=False, **kw)


@pytest.mark.parametrize("name", list(ablation_settings(CFG, 0.1)))
def test_stored_ablation_measures_as_the_run_measured_while_training(name):
    how = ablation_settings(CFG, 0.1)[name]
    direct = _measured_while_training(CFG, 10, **how)
    stored = ablated(CFG, 10, progress=False, **how)
    ev = CFG.eval_set()
    replayed = stored.measured(lambda s, model: measure_model(model, CFG.task, ev))
    assert stored.provenance["loaded"] is False
    np.testing.assert_array_equal(replayed.loss, direct.loss)
    assert [s for s, _ in replayed.checkpoints] == [s for s, _ in direct.checkpoints] == [0, 10, 20, 30]
    for (_, a), (_, b) in zip(replayed.checkpoints, direct.checkpoints):
        np.testing.assert_equal(a, b)  # every number measure_model gives, exactly
    again = ablated(CFG, 10, progress=False, **how)  # loaded, with every state as stored
    assert again.provenance["loaded"] is True
    assert again.steps == stored.steps
    for sa, sb in zip(again.states, stored.states):
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_a_loaded_model_keeps_its_channel_frozen_at_initialization():
    """Positive control: the pattern frozen at step 30 is the initial model's; negative: the
    plain run's pattern has moved."""
    ev = CFG.eval_set()

    def pattern(model):
        with torch.no_grad():
            return [tr.attention.weights for tr in model(ev.tokens, inspect=True)[1]]

    init = pattern(CFG.model())
    frozen = ablated(CFG, 30, channel="pattern", progress=False)
    assert all(torch.equal(a, b) for a, b in zip(pattern(frozen.model_at(30)), init))
    plain = ablated(CFG, 30, progress=False)
    assert not all(torch.equal(a, b) for a, b in zip(pattern(plain.model_at(30)), init))
    assert isinstance(frozen, Ablation) and frozen.steps == [0, 30]
    with pytest.raises(ValueError, match="step must be one of the stored steps"):
        frozen.model_at(10)


@pytest.mark.parametrize("kw, error, message", [
    ({"every": 0}, ValueError, "every must be"),
    ({"every": 31}, ValueError, "every must be"),
    ({"channel": "keys"}, ValueError, "channel must be one of"),
    ({"frozen": ("queries",)}, ValueError, "frozen must be one of"),
    ({"frozen": "routing"}, TypeError, "frozen must be a tuple of roles"),
    ({"rates": {"queries": 0.1}}, ValueError, "rates' role must be one of"),
    ({"rates": {"values": "0.1"}}, TypeError, r"rates\['values'\] must be a real number"),
    ({"rates": {"values": True}}, TypeError, r"rates\['values'\] must be a real number"),
    ({"rates": {"values": 0.0}}, ValueError, r"rates\['values'\] must be"),
])
def test_bad_settings_are_named(kw, error, message):
    args = {"every": 10} | kw
    with pytest.raises(error, match=message):
        ablated(CFG, args.pop("every"), progress=False, **args)


def test_bad_config_and_scale_are_named():
    with pytest.raises(TypeError, match="cfg must be a WindTunnelConfig"):
        ablated({"V": 5}, 10)
    with pytest.raises(TypeError, match="cfg must be a WindTunnelConfig"):
        ablation_settings({"V": 5}, 0.1)
    for bad in (0.0, 1.0):
        with pytest.raises(ValueError, match="em_slow_scale must be"):
            ablation_settings(CFG, bad)


def test_one_key_per_set_of_roles():
    """The same model asked for with its roles in another order, or with a rate given as
    an int, is the same stored model (loaded, not trained again)."""
    first = ablated(CFG, 30, frozen=("values", "routing"), rates={"other": 1, "values": 0.5}, progress=False)
    again = ablated(CFG, 30, frozen=("routing", "values", "routing"), rates={"values": 0.5, "other": 1.0},
                    progress=False)
    assert first.provenance["loaded"] is False and again.provenance["loaded"] is True
