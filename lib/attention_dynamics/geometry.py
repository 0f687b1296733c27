"""Geometric statistics of a trained transformer (R8; chapters *Calibration: the model
against the exact posterior* and *Geometry over training*): the value manifold, the key
frame, attention focusing, and calibration against an exact posterior. All in bits where
an entropy is involved."""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from .tasks.bijection import supervised_positions
from .validation import check_int, check_tensor

__all__ = [
    "entropy_bits",
    "calibration_errors",
    "pc_shares",
    "spearman",
    "random_frame_abs_cosine",
    "key_orthogonality",
    "attention_entropy_bits",
    "measure_model",
    "partial_spearman",
    "frame_mass",
]

LOG2E = 1 / math.log(2)


def entropy_bits(log_probs: Tensor) -> Tensor:
    """Entropy of each distribution (last axis, natural-log probabilities) in bits."""
    check_tensor("log_probs", log_probs, min_ndim=1, finite=False)
    p = log_probs.exp()
    return -(p * torch.where(p > 0, log_probs, torch.zeros((), dtype=log_probs.dtype))).sum(-1) * LOG2E


def calibration_errors(log_probs: Tensor, bayes_bits: Tensor, posterior: Tensor | None = None) -> dict[str, Tensor]:
    """Model against exact posterior at the supervised positions.

    log_probs: (B, P, C) the model's log-probabilities; bayes_bits: (P,) exact posterior
    entropies. Returns per-position (P,) mean model entropy, mean |H_model - H_Bayes| and,
    given the posterior (B, P, C), the mean KL(posterior || model) in bits; plus 'mae', the
    mean absolute entropy error over all samples and positions."""
    check_tensor("log_probs", log_probs, ndim=3, finite=False)  # log 0 = -inf is legitimate
    check_tensor("bayes_bits", bayes_bits, min_ndim=1)
    if bayes_bits.shape not in ((log_probs.shape[1],), tuple(log_probs.shape[:2])):
        raise ValueError(f"bayes_bits must give one entropy per position ({log_probs.shape[1]},) or per sample and "
                         f"position {tuple(log_probs.shape[:2])}, got shape {tuple(bayes_bits.shape)}")
    if posterior is not None and posterior.shape != log_probs.shape:
        raise ValueError(f"posterior must have the shape of log_probs {tuple(log_probs.shape)}, got {tuple(posterior.shape)}")
    H = entropy_bits(log_probs.double())
    err = (H - (bayes_bits if bayes_bits.dim() == 2 else bayes_bits[None]).to(H.dtype)).abs()
    out = {"model_bits": H.mean(0), "abs_error_bits": err.mean(0), "mae": err.mean()}
    if posterior is not None:
        p = posterior.to(torch.float64)
        logp = torch.where(p > 0, p.log(), torch.zeros((), dtype=p.dtype))
        kl = torch.where(p > 0, p * (logp - log_probs.double()), torch.zeros((), dtype=p.dtype)).sum(-1) * LOG2E
        out["kl_bits"] = kl.mean(0)
    return out


def pc_shares(X: Tensor, k: int = 3) -> np.ndarray:
    """Fractions of the total variance carried by the first k principal components."""
    check_tensor("X", X, ndim=2)
    k = check_int("k", k, 1, min(X.shape))
    if X.shape[0] < 2:
        raise ValueError(f"X needs at least two rows to have a variance, got shape {tuple(X.shape)}")
    Xc = (X - X.mean(0)).double()
    s = torch.linalg.svdvals(Xc) ** 2
    return (s[:k] / s.sum()).numpy()


def leading_coordinate(X: Tensor) -> Tensor:
    Xc = (X - X.mean(0)).double()
    _, _, Vh = torch.linalg.svd(Xc, full_matrices=False)
    return Xc @ Vh[0]


def spearman(a, b) -> float:
    """Spearman rank correlation (average ranks for ties)."""
    from scipy.stats import spearmanr

    if np.shape(a) != np.shape(b) or np.ndim(a) != 1 or len(a) < 2:
        raise ValueError(f"spearman needs two 1-D sequences of the same length >= 2, got shapes {np.shape(a)} and {np.shape(b)}")
    r = spearmanr(np.asarray(a, float), np.asarray(b, float)).statistic
    return float(r)


def key_orthogonality(keys: Tensor, symbols: Tensor, n_symbols: int) -> tuple[float, float]:
    """Mean |cos| between the mean keys of different symbols, and the same for random
    directions in the key space (the baseline). keys: (n, d); symbols: (n,).

    The symbol means are centred first: a component shared by every key adds the same
    amount to all of a query's scores and cannot affect attention, so it is not part of
    the frame the keys form."""
    check_tensor("keys", keys, ndim=2)
    means = torch.stack([keys[symbols == s].mean(0) for s in range(n_symbols) if (symbols == s).any()])
    means = means - means.mean(0)
    unit = means / means.norm(dim=1, keepdim=True).clamp_min(1e-12)
    cos = unit @ unit.T
    off = ~torch.eye(len(unit), dtype=torch.bool)
    return float(cos[off].abs().mean()), random_frame_abs_cosine(len(unit), keys.shape[1])


def _centred_abs_cos(vectors: Tensor) -> Tensor:
    c = vectors - vectors.mean(-2, keepdim=True)
    u = c / c.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    cos = u @ u.transpose(-1, -2)
    k = vectors.shape[-2]
    off = ~torch.eye(k, dtype=torch.bool)
    return cos[..., off].abs().mean(-1)


def random_frame_abs_cosine(k: int, d: int, draws: int = 2000) -> float:
    """The same statistic for k centred random Gaussian vectors in R^d (seeded Monte Carlo):
    the baseline a learned frame is compared with. The most spread-out centred frame, a
    regular simplex, has |cos| = 1/(k - 1)."""
    g = torch.Generator().manual_seed(0)
    return float(_centred_abs_cos(torch.randn(draws, check_int("k", k, 2, None), check_int("d", d, 1, None),
                                              generator=g, dtype=torch.float64)).mean())


def attention_entropy_bits(weights: Tensor) -> Tensor:
    """Entropy of each attention row in bits: (..., T)."""
    from .laws import attention_entropy

    return attention_entropy(weights) * LOG2E


def partial_spearman(x, y, z) -> float:
    """Spearman correlation of x and y with z held fixed: the partial correlation of their
    ranks, (r_xy - r_xz r_yz) / sqrt((1 - r_xz^2)(1 - r_yz^2)); NaN when z determines x or y."""
    r_xy, r_xz, r_yz = spearman(x, y), spearman(x, z), spearman(y, z)
    den = math.sqrt(max((1 - r_xz**2) * (1 - r_yz**2), 0.0))
    return float((r_xy - r_xz * r_yz) / den) if den > 1e-12 else float("nan")


def frame_mass(weights: Tensor, tokens: Tensor, L: int) -> Tensor:
    """Per sample and head, the attention mass the query puts on the pairs that hold its
    key (the key token and the value after it): how firmly the frame routes the query to
    the answer. weights: (B, H, T, T); tokens: (B, 2L + 1). Returns (B, H)."""
    keys, q = tokens[:, 0:2 * L:2], tokens[:, 2 * L]
    match = (keys == q[:, None]).to(weights.dtype)  # (B, L)
    pair = match.repeat_interleave(2, dim=1)  # (B, 2L): key and value positions of the matching pairs
    return (weights[:, :, 2 * L, :2 * L] * pair[:, None, :]).sum(-1)


def _layer_geometry(tr, task, ev, pos: Tensor) -> dict:
    """One layer's geometry from its trace, each head measured, then averaged over heads
    (the best head's rank correlation kept apart): see :func:`measure_model`."""
    key_pos = torch.arange(0, 2 * task.L, 2)
    position = pos[None].expand(ev.tokens.shape[0], -1).reshape(-1).numpy()
    shares, rhos, partial, orth, attn = [], [], [], [], []
    for h in range(tr.v.shape[1]):
        vals = tr.v[:, h][:, pos].reshape(-1, tr.v.shape[-1])  # values at the supervised positions
        shares.append(pc_shares(vals, 3))
        coord = leading_coordinate(vals).numpy()
        rhos.append(spearman(coord, ev.pos_bits.reshape(-1).numpy()))
        if task.repeats:
            partial.append(partial_spearman(coord, ev.pos_bits.reshape(-1).numpy(), position))
        keys = tr.k[:, h][:, key_pos].reshape(-1, tr.k.shape[-1])
        orth.append(key_orthogonality(keys, ev.tokens[:, key_pos].reshape(-1), task.V))
        attn.append(attention_entropy_bits(tr.attention.weights[:, h][:, pos]).mean(0).numpy())
    best = int(np.argmax(np.abs(rhos)))
    return {
        "pc_shares": np.mean(shares, 0), "rho_best": float(abs(rhos[best])), "rho_best_head": best,
        "rho_mean": float(np.mean(np.abs(rhos))), "key_abs_cos": float(np.mean([o[0] for o in orth])),
        "key_abs_cos_random": float(orth[0][1]), "attention_bits": np.mean(attn, 0),
        "rho_partial_mean": float(np.mean(np.abs(partial))) if partial else float("nan"),
        "attention_maps": tr.attention.weights[:, :, pos].mean(0).numpy(),  # (H, P, T) mean over samples
    }


def measure_model(model, task, ev, *, geometry: bool = True, frame: bool = False) -> dict:
    """A wind-tunnel model (:mod:`attention_dynamics.windtunnel`) measured on an evaluation
    set (:class:`attention_dynamics.tasks.bijection.EvalSet`): calibration against the exact
    posterior (bits); with ``frame`` (implied by ``geometry``) the frame mass (mean over
    samples, heads and layers of :func:`frame_mass`, and per head as ``frame_mass_heads``,
    (n_layers, n_heads)); with ``geometry``, per layer:
    value-manifold PC shares and each head's rank correlation of the leading value coordinate
    with the Bayes entropy (and, with repeated keys, with the position held fixed), key
    orthogonality against the random baseline, attention entropy by supervised position
    (bits) beside uniform causal attention's, all averaged over heads; and the same
    averaged over layers."""
    from .transformer import evaluating
    from .windtunnel import supervised_log_probs

    inspect = geometry or frame
    with evaluating(model):
        logp, traces = supervised_log_probs(model, ev.tokens, task, inspect=inspect)
    cal = calibration_errors(logp, ev.bayes_bits, ev.posterior)
    out = {"mae_bits": float(cal["mae"]), "model_bits": cal["model_bits"].numpy(),
           "abs_error_bits": cal["abs_error_bits"].numpy(), "kl_bits": cal["kl_bits"].numpy(),
           "loss": float(torch.nn.functional.nll_loss(logp.reshape(-1, task.V), ev.targets.reshape(-1)))}
    if not inspect:
        return out
    masses = [frame_mass(tr.attention.weights, ev.tokens, task.L).mean(0) for tr in traces]  # (H,) per layer
    out["frame_mass"] = float(torch.stack(masses).mean())
    out["frame_mass_heads"] = torch.stack(masses).numpy()  # (n_layers, H): one head can carry the frame
    if not geometry:
        return out
    pos = supervised_positions(task)
    layers = [_layer_geometry(tr, task, ev, pos) | {"frame_mass": float(mass.mean())}
              for tr, mass in zip(traces, masses)]
    out["layers"] = layers
    out["uniform_bits"] = np.log2(pos.numpy() + 1.0)  # uniform causal attention over the visible keys
    for key in ("rho_mean", "key_abs_cos", "rho_partial_mean"):
        out[key] = float(np.mean([layer[key] for layer in layers]))
    out["attention_bits"] = np.mean([layer["attention_bits"] for layer in layers], 0)
    return out
