"""The deep variant's stored per-seed runs (attention_dynamics.deep_variant) against the
chapter's former in-place loop, bit for bit, trained and loaded."""
from __future__ import annotations

import pytest
import torch

from attention_dynamics.deep_variant import HELD_OUT, DeepVariant
from attention_dynamics.tasks import sticky_chain as sc
from attention_dynamics.transformer import CausalTransformer, fit, sequence_metrics

TINY = dict(n_steps=4, seq_len=40, d_model=8, n_layers=1, n_heads=2, d_ff=16, dropout=0.1, eval_every=2)


def _in_place(deep: DeepVariant, seeds: list[int], i: int):
    """The chapter's loop before the runs were stored: every seed's sequences drawn at once,
    the global generator set to the script's state, the model trained where it is built."""
    train_seq = sc.sample_sequences(seeds, seq_len=deep.seq_len)
    test_seq = sc.sample_sequences([s + HELD_OUT for s in seeds], seq_len=deep.seq_len)
    torch.set_rng_state(sc.generator_after(seeds[i] + HELD_OUT, deep.seq_len).get_state())
    model = CausalTransformer(deep.model_config())
    train_xy, test_xy = (train_seq.x[i:i + 1], train_seq.y[i:i + 1]), (test_seq.x[i:i + 1], test_seq.y[i:i + 1])
    hist = fit(model, lambda: train_xy, deep.n_steps, lr=deep.lr, weight_decay=deep.weight_decay,
               clip_norm=deep.clip_norm, every=deep.eval_every,
               callback=lambda step, p, out: sequence_metrics(model, *test_xy))
    return model, hist


def test_a_stored_seed_is_the_in_place_run_bit_for_bit_trained_and_loaded():
    deep, seeds = DeepVariant(**TINY), [5, 6]
    before = torch.get_rng_state()
    made = deep.train(6, progress=False)
    assert torch.equal(torch.get_rng_state(), before)  # the caller's generator is left alone
    loaded = deep.train(6, progress=False)
    assert not made.provenance["loaded"] and loaded.provenance["loaded"]
    model, hist = _in_place(deep, seeds, 1)
    for run in (made, loaded):
        for (name, a), b in zip(run.model.state_dict().items(), model.state_dict().values()):
            assert torch.equal(a, b), name
        assert (run.history.loss == hist.loss).all() and run.history.checkpoints == hist.checkpoints
        assert run.seconds == made.provenance["seconds"] > 0
    # another seed is another run
    assert not torch.equal(deep.train(5, progress=False).model.out.weight, made.model.out.weight)


def test_settings_are_checked_by_name():
    with pytest.raises(ValueError, match="d_model = 8 must be a multiple of n_heads = 3"):
        DeepVariant(**dict(TINY, n_heads=3))
    with pytest.raises(ValueError, match="eval_every"):
        DeepVariant(**dict(TINY, eval_every=5))
    with pytest.raises(ValueError, match="lr"):
        DeepVariant(**dict(TINY, lr=0.0))
    with pytest.raises(ValueError, match="seed"):
        DeepVariant(**TINY).train(-1)
