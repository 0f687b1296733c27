"""The deep variant of the sticky-chain protocol (R7; chapter *The sticky Markov chain, deep
variant*): per seed, a small transformer trained on that seed's one training sequence and
evaluated on its held-out sequence, as the authors' script does it. Each seed's run is
stored (:mod:`attention_dynamics.artifacts`), so a build can train the seeds as tasks of
their own, side by side or on a cluster, and the chapter loads them."""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from .artifacts import load_or_make
from .tasks import sticky_chain as sc
from .training import History
from .transformer import CausalTransformer, TransformerConfig, fit, sequence_metrics
from .validation import check_float, check_int, settings_from_dict

__all__ = ["DeepVariant", "DeepRun", "HELD_OUT"]

HELD_OUT = 10_000  # seed s is tested on the sequence of seed s + 10000, as in the script


@dataclass(frozen=True)
class DeepRun:
    """One seed's trained model, its training loss at every step (dropout on), the held-out
    metrics every ``eval_every`` steps (``history.checkpoints``: loss, entropy, accuracy in
    evaluation mode), the seconds its training took and the stored run's provenance."""

    seed: int
    model: CausalTransformer
    history: History
    seconds: float
    provenance: dict


@dataclass(frozen=True)
class DeepVariant:
    """The settings of the deep variant, validated by name: ``n_steps`` AdamW steps on one
    sequence of ``seq_len`` states (full batch), a transformer ``d_model`` wide with
    ``n_layers`` layers of ``n_heads`` heads, feed-forward ``d_ff``, ``dropout``; rate ``lr``
    (cosine decay to zero), ``weight_decay``, gradient norm clipped at ``clip_norm``; the
    held-out metrics every ``eval_every`` steps."""

    n_steps: int = 2000
    seq_len: int = 2000
    d_model: int = 64
    n_layers: int = 4
    n_heads: int = 4
    d_ff: int = 256
    dropout: float = 0.1
    lr: float = 3e-4
    weight_decay: float = 0.01
    clip_norm: float = 1.0
    eval_every: int = 100

    def __post_init__(self):
        check_int("n_steps", self.n_steps, 1, 1_000_000)
        check_int("seq_len", self.seq_len, 3, 100_000)
        check_float("lr", self.lr, 0.0, 1.0, low_open=True)
        check_float("weight_decay", self.weight_decay, 0.0, 1.0)
        check_float("clip_norm", self.clip_norm, 0.0, None, low_open=True)
        check_int("eval_every", self.eval_every, 1, self.n_steps)
        self.model_config()  # checks the model's settings together (d_model, n_heads)

    @classmethod
    def from_dict(cls, d: dict) -> "DeepVariant":
        return settings_from_dict(cls, d, "deep variant")

    def model_config(self) -> TransformerConfig:
        return TransformerConfig(n_out=sc.N_STATES, d_model=self.d_model, n_layers=self.n_layers,
                                 n_heads=self.n_heads, d_ff=self.d_ff, dropout=self.dropout, input="linear",
                                 d_in=sc.D_X)

    def train(self, seed: int, *, progress: bool = True) -> DeepRun:
        """Seed ``seed``'s run: loaded where an earlier call (in any process) stored it, else
        trained and stored. Its initial weights are the script's: drawn from the global
        generator in the state it has after drawing the held-out sequence (seed + 10000)."""
        seed = check_int("seed", seed, 0, 2**31 - 1 - HELD_OUT)

        def make() -> dict:
            train_seq = sc.sample_sequences([seed], seq_len=self.seq_len)
            test_seq = sc.sample_sequences([seed + HELD_OUT], seq_len=self.seq_len)
            train_xy, test_xy = (train_seq.x, train_seq.y), (test_seq.x, test_seq.y)
            with torch.random.fork_rng():  # the weights and the dropout masks draw from the global generator
                torch.set_rng_state(sc.generator_after(seed + HELD_OUT, self.seq_len).get_state())
                model = CausalTransformer(self.model_config())
                hist = fit(model, lambda: train_xy, self.n_steps, lr=self.lr, weight_decay=self.weight_decay,
                           clip_norm=self.clip_norm, every=self.eval_every, progress=progress,
                           desc=f"seed {seed}", callback=lambda step, p, out: sequence_metrics(model, *test_xy))
            return {"state": model.state_dict(), "loss": torch.as_tensor(hist.loss),
                    "checkpoints": [[s, c] for s, c in hist.checkpoints]}

        saved, prov = load_or_make("deep-variant", asdict(self) | {"seed": seed}, make, modules=[__name__])
        with torch.random.fork_rng():  # building the model draws weights; the caller's generator is left as it was
            model = CausalTransformer(self.model_config())
        model.load_state_dict(saved["state"])
        history = History(saved["loss"].numpy(),
                          [(int(s), dict(c)) for s, c in saved["checkpoints"]])
        return DeepRun(seed, model, history, float(prov["seconds"]), prov)
