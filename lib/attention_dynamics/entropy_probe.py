"""Is posterior entropy encoded beyond position? A selective linear probe (R8; chapter
*Geometry over training*).

R8 says the values collapse onto a low-dimensional manifold ordered by posterior entropy.
Correlating a head's leading value coordinate with the entropy cannot say yes in the wind
tunnel: layer-0 values are functions of (token, position), and in the plain task the
entropy is a function of position, so that correlation is positional by construction.
This module asks the sharper question on the variant with repeated keys
(:class:`~attention_dynamics.tasks.bijection.WindTunnel` with ``repeats=True``), where the
entropy at a value position depends on the sample (a key seen before makes its value
certain): *how much of the entropy's variation beyond position can a linear map read off a
representation, on sequences it was not fitted on, compared with a control target that a
representation has no reason to carry?*

- :func:`representations`: the features, at the supervised positions, of three places in
  a :class:`~attention_dynamics.transformer.CausalTransformer`: the second block's
  attention output (concatenated heads, before the output projection), the final residual
  stream (before the final LayerNorm), and for reference the layer-0 values.
- :func:`probe_selectivity`: closed-form ridge from features to a target, position regressed
  out of both (fitted on the training sequences), the penalty chosen by cross-validation on
  the training sequences only, R^2 scored on held-out sequences, for the target and for a
  control target; selectivity = R^2 - R^2_control (Hewitt and Liang, *Designing and
  Interpreting Probes with Control Tasks*, EMNLP 2019).
- :func:`value_match_entropy`: the control target of this task (why it is a better control
  than a permutation: see its docstring); :func:`permuted_control`: the generic one.
- :func:`entropy_selectivity`: all of it, on each representation, on one evaluation set.

R^2 here is always *beyond position*: 1 - SS_res / SS_tot on the held-out rows, SS_res
the squared error of (training mean of the target at the row's position + probe output),
SS_tot the squared deviation of the target from its held-out mean at each position. A
representation that knows only position scores about -(1/n_train + 1/n_test) (in
sequences), noise features about -p/n (p features, n training rows); a perfect copy 1.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from .tasks.bijection import EvalSet, WindTunnel, supervised_positions
from .transformer import CausalTransformer, evaluating
from .validation import check_choice, check_float, check_int, check_tensor

__all__ = ["RIDGE_GRID", "REPRESENTATIONS", "representations", "probe_selectivity", "permuted_control",
           "value_match_entropy", "entropy_selectivity"]

# Candidate penalties lambda of the ridge objective (1/n) ||y - X w||^2 + lambda ||w||^2 on
# standardized features (each column variance 1 on the training rows): 1e-4 (next to least
# squares) to 1e4 (next to predicting the positional mean), one per decade.
RIDGE_GRID: tuple[float, ...] = tuple(10.0 ** k for k in range(-4, 5))

# The names :func:`representations` returns, in order.
REPRESENTATIONS: tuple[str, ...] = ("attention_l1", "residual_final", "values_l0")

# A feature whose standard deviation after position is regressed out falls below this share
# of its raw standard deviation is a function of position (up to rounding): it is dropped
# rather than standardized (standardizing would blow its rounding error up to unit variance).
_DEAD = 1e-9


# --------------------------------------------------------------------------- representations


def _check_tokens(tokens, task: WindTunnel) -> Tensor:
    check_tensor("tokens", tokens, ndim=2, kind="int", nonempty=True)
    if tokens.shape[1] != task.length:
        raise ValueError(f"tokens must have {task.length} columns (2L + 1 for L = {task.L}), "
                         f"got shape {tuple(tokens.shape)}")
    if int(tokens.min()) < 0 or int(tokens.max()) >= task.V:
        raise ValueError(f"tokens must lie in [0, {task.V - 1}] (V = {task.V})")
    return tokens


def _check_task(task) -> WindTunnel:
    if not isinstance(task, WindTunnel):
        raise TypeError(f"task must be a WindTunnel, got {type(task).__name__}")
    return task


def representations(model: CausalTransformer, tokens: Tensor, task: WindTunnel) -> dict[str, Tensor]:
    """Three representations of ``tokens`` (B, 2L + 1) in a wind-tunnel ``model``, each
    (B, L + 1, d_model) at the supervised positions (:func:`~attention_dynamics.tasks.bijection.supervised_positions`:
    every key, whose value comes next, and the query), in evaluation mode without gradients,
    read by forward hooks on the model's ordinary (fast) forward pass:

    - ``'attention_l1'``: the second block's (``blocks[1]``) attention output, the outputs
      g = sum_j alpha_ij v_j of its heads concatenated (head h in columns h d_h to
      (h + 1) d_h), the input of the block's output projection ``proj``: before that
      projection, its bias and the residual addition;
    - ``'residual_final'``: the residual stream after the last block, the input of the final
      LayerNorm ``ln_f`` (before it and before the read-out);
    - ``'values_l0'``: the first block's values v = W_V ln1(h) + b_V, all heads concatenated
      (the output of ``blocks[0].v``), for reference: a function of (token, position) alone.

    Returned in the model's dtype, detached."""
    _check_task(task)
    if not isinstance(model, CausalTransformer):
        raise TypeError(f"model must be a CausalTransformer, got {type(model).__name__}")
    cfg = model.cfg
    if cfg.input != "tokens":
        raise ValueError(f"model must take tokens (TransformerConfig input='tokens'), got input={cfg.input!r}")
    if cfg.vocab < task.V:
        raise ValueError(f"model's vocab = {cfg.vocab} is smaller than the task's alphabet V = {task.V}")
    if cfg.n_layers < 2:
        raise ValueError(f"model must have at least 2 layers (the attention output of the second block is read), "
                         f"got n_layers = {cfg.n_layers}")
    _check_tokens(tokens, task)
    seen: dict[str, Tensor] = {}

    def grab_input(name):
        def hook(module, args):
            seen[name] = args[0].detach()
        return hook

    def grab_output(module, args, output):
        seen["values_l0"] = output.detach()

    handles = [model.blocks[1].proj.register_forward_pre_hook(grab_input("attention_l1")),
               model.ln_f.register_forward_pre_hook(grab_input("residual_final")),
               model.blocks[0].v.register_forward_hook(grab_output)]
    try:
        with evaluating(model):
            model(tokens)
    finally:
        for h in handles:
            h.remove()
    pos = supervised_positions(task).to(tokens.device)
    return {name: seen[name][:, pos].clone() for name in REPRESENTATIONS}


# --------------------------------------------------------------------------- control targets


def value_match_entropy(tokens: Tensor, task: WindTunnel) -> Tensor:
    """The control target of the repeats variant, (B, L + 1) float64 bits: the posterior
    entropy's formula with the wrong match. At the value of pair i: 0 if the current key
    k_i equals one of the *values* v_0..v_{i-1} shown before, else log2(V - d_i), d_i the
    number of distinct values shown so far; after the query: 0 (as the real entropy).

    The real entropy is the same expression with the current key matched against the
    earlier *keys* (a key seen before makes its value certain). With keys drawn uniformly
    with replacement, independently of the bijection pi, k_i is uniform given the past,
    and the d_i distinct earlier keys and the d_i distinct earlier values are sets of the
    same size: P(match | past) = d_i / V for both, and the non-match value log2(V - d_i) is
    shared. So, given the position (and even given d_i), the control has exactly the real
    entropy's distribution: same marginal, same relation to position. It is a
    deterministic function of the same tokens, all visible to a causal model at that
    position, computed the same way (match the current token against a set of earlier
    tokens, count what was seen), but it has no bearing on the next token. On the repeats
    task with V = 8, L = 7 its correlation with the real entropy beyond position is about
    0.05 (R^2 about 0.003).

    Why this and not (only) the within-position permutation (:func:`permuted_control`):
    a permuted target is independent of every input, so no probe can predict it on
    held-out sequences, and R^2_control is merely the probe's overfitting floor (about
    -p/n). This control is learnable by a probe on any representation that carries
    generic token recurrence ("the current token appeared before, in any slot") or the
    count of distinct tokens: such a representation decodes both targets about equally
    and its selectivity is about 0, while the permutation would call it selective. A
    positive selectivity against this control says the representation carries the match
    that decides the Bayes posterior, keys against keys, not token recurrence at large:
    Hewitt and Liang's control task (a function of the input the representation has no
    reason to encode), not only a shuffled label. Only for ``task.repeats``: without
    repeats a key is never among the earlier keys and the two targets part ways."""
    _check_task(task)
    if not task.repeats:
        raise ValueError("value_match_entropy is the control of the repeats variant (WindTunnel(..., repeats=True)); "
                         "without repeats its distribution differs from the real entropy's")
    _check_tokens(tokens, task)
    B, V, L = tokens.shape[0], task.V, task.L
    rows = torch.arange(B, device=tokens.device)
    keys, vals = tokens[:, 0:2 * L:2], tokens[:, 1:2 * L:2]
    seen = torch.zeros(B, V, dtype=torch.bool, device=tokens.device)  # values shown so far
    out = torch.zeros(B, L + 1, dtype=torch.float64, device=tokens.device)
    for i in range(L):
        d = seen.sum(1).double()
        hit = seen[rows, keys[:, i]]
        out[:, i] = torch.where(hit, torch.zeros_like(d), torch.log2(V - d))
        seen[rows, vals[:, i]] = True
    return out


def _check_position(position, B: int, P: int) -> Tensor:
    if not isinstance(position, torch.Tensor):
        raise TypeError(f"position must be a torch.Tensor of integer position labels, got {type(position).__name__}")
    if position.dtype.is_floating_point or position.dtype.is_complex or position.dtype == torch.bool:
        raise TypeError(f"position must have an integer dtype (position labels), got {position.dtype}")
    if position.dim() == 1 and position.shape[0] == P:
        position = position[None].expand(B, P)
    if tuple(position.shape) != (B, P):
        raise ValueError(f"position must have shape ({P},) or ({B}, {P}) to match target (B, P) = ({B}, {P}), "
                         f"got {tuple(position.shape)}")
    return position.long()


def permuted_control(target: Tensor, position: Tensor, *, seed: int = 0) -> Tensor:
    """The generic control target: within each position label, the values of ``target``
    (B, P) permuted across sequences by a generator seeded ``seed``. Same marginal at
    every position, no relation to the input beyond position (up to the finite-sample
    dependence a permutation leaves). ``position``: (P,) or (B, P) integer labels."""
    check_tensor("target", target, ndim=2, nonempty=True)
    B, P = target.shape
    position = _check_position(position, B, P)
    seed = check_int("seed", seed, 0, 2**63 - 1)
    gen = torch.Generator().manual_seed(seed)
    flat_t, flat_p = target.reshape(-1), position.reshape(-1).cpu()
    out = flat_t.clone()
    for level in torch.unique(flat_p).tolist():
        idx = (flat_p == level).nonzero().squeeze(1)
        out[idx.to(out.device)] = flat_t[idx[torch.randperm(len(idx), generator=gen)].to(out.device)]
    return out.reshape(B, P)


# --------------------------------------------------------------------------- the probe


def _check_index(name: str, idx, B: int) -> Tensor:
    if isinstance(idx, np.ndarray):
        idx = torch.from_numpy(idx)
    elif isinstance(idx, (list, tuple, range)):
        idx = torch.tensor(list(idx), dtype=torch.long)
    if not isinstance(idx, torch.Tensor):
        raise TypeError(f"{name} must be a 1-D array of sequence indices (tensor, numpy array or list), "
                        f"got {type(idx).__name__}")
    if idx.dtype.is_floating_point or idx.dtype.is_complex or idx.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer sequence indices, got dtype {idx.dtype}")
    if idx.dim() != 1 or idx.numel() == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array of sequence indices, got shape {tuple(idx.shape)}")
    idx = idx.long().cpu()
    if int(idx.min()) < 0 or int(idx.max()) >= B:
        raise ValueError(f"{name} must hold sequence indices in [0, {B - 1}] (B = {B} sequences), "
                         f"got values in [{int(idx.min())}, {int(idx.max())}]")
    if torch.unique(idx).numel() != idx.numel():
        raise ValueError(f"{name} holds a sequence index more than once")
    return idx


def _group_means(y: Tensor, pos: Tensor, levels: Tensor) -> Tensor:
    """Mean of the rows of y (n, k) at each position level; (n_levels, k). A level with no
    row gets the mean of all rows."""
    idx = torch.searchsorted(levels, pos)
    sums = torch.zeros(len(levels), y.shape[1], dtype=y.dtype).index_add_(0, idx, y)
    counts = torch.zeros(len(levels), dtype=y.dtype).index_add_(0, idx, torch.ones_like(pos, dtype=y.dtype))
    means = sums / counts.clamp(min=1)[:, None]
    means[counts == 0] = y.mean(0)
    return means


class _Fit:
    """Position one-hot regression and standardization fitted on some rows; applied to any."""

    def __init__(self, X: Tensor, Y: Tensor, pos: Tensor, levels: Tensor):
        self.levels = levels
        self.mx, self.my = _group_means(X, pos, levels), _group_means(Y, pos, levels)
        Xr = X - self.mx[torch.searchsorted(levels, pos)]
        sd, raw = Xr.std(0, unbiased=False), X.std(0, unbiased=False)
        self.keep = sd > _DEAD * raw.clamp(min=torch.finfo(X.dtype).tiny)
        self.sd = sd[self.keep]

    def features(self, X: Tensor, pos: Tensor) -> Tensor:
        Xr = X - self.mx[torch.searchsorted(self.levels, pos)]
        return Xr[:, self.keep] / self.sd

    def targets(self, Y: Tensor, pos: Tensor) -> Tensor:
        return Y - self.my[torch.searchsorted(self.levels, pos)]


def _ridge_predict(Xtr: Tensor, ytr: Tensor, Xte: Tensor, grid: Tensor) -> Tensor:
    """Predictions on Xte (m, p) of the ridge fit argmin (1/n)||ytr - Xtr w||^2 + lam ||w||^2
    for every lam in grid and every column of ytr (n, k): (len(grid), m, k). Via one SVD."""
    n = Xtr.shape[0]
    if Xtr.shape[1] == 0:
        return torch.zeros(len(grid), Xte.shape[0], ytr.shape[1], dtype=Xte.dtype)
    U, s, Vh = torch.linalg.svd(Xtr, full_matrices=False)
    Uy = U.T @ ytr  # (r, k)
    shrink = s[None, :] / (s[None, :] ** 2 + n * grid[:, None])  # (G, r)
    XV = Xte @ Vh.T  # (m, r)
    return torch.einsum("mr,gr,rk->gmk", XV, shrink, Uy)


def _ss_tot(Y: Tensor, pos: Tensor) -> Tensor:
    """Squared deviations of Y (n, k) from its own mean at each position: (k,)."""
    levels = torch.unique(pos)
    return ((Y - _group_means(Y, pos, levels)[torch.searchsorted(levels, pos)]) ** 2).sum(0)


def _probe_arguments(features, target, position, train, test, ridge, control_target, folds, seed):
    """:func:`probe_selectivity`'s arguments checked, with messages that name them; the
    position labels, the sequence splits, the sorted ridge grid and the control target."""
    check_tensor("features", features, ndim=3, nonempty=True)
    check_tensor("target", target, ndim=2, nonempty=True)
    B, P, d = features.shape
    if tuple(target.shape) != (B, P):
        raise ValueError(f"target must have shape (B, P) = ({B}, {P}) to match features (B, P, d) = "
                         f"{tuple(features.shape)}, got {tuple(target.shape)}")
    position = _check_position(position, B, P).cpu()
    tr, te = _check_index("train", train, B), _check_index("test", test, B)
    overlap = set(tr.tolist()) & set(te.tolist())
    if overlap:
        raise ValueError(f"train and test must be disjoint sets of sequences; they share {len(overlap)} "
                         f"(e.g. {sorted(overlap)[:5]})")
    if isinstance(ridge, (np.ndarray, torch.Tensor)):
        ridge = ridge.tolist() if ridge.ndim == 1 else ridge
    if isinstance(ridge, (str, bytes)) or not isinstance(ridge, Sequence) or len(ridge) == 0:
        raise ValueError(f"ridge must be a non-empty list of penalties > 0 (the cross-validation grid), got {ridge!r}")
    grid = torch.tensor(sorted(check_float(f"ridge[{i}]", r, 0.0, None, low_open=True) for i, r in enumerate(ridge)),
                        dtype=torch.float64)
    folds = check_int("folds", folds, 2, None)
    if len(tr) < folds:
        raise ValueError(f"train must hold at least folds = {folds} sequences for the cross-validation, got {len(tr)}")
    seed = check_int("seed", seed, 0, 2**63 - 1)
    if control_target is None:
        control_target = permuted_control(target, position, seed=seed)
    else:
        check_tensor("control_target", control_target, ndim=2, nonempty=True)
        if tuple(control_target.shape) != (B, P):
            raise ValueError(f"control_target must have the shape of target, ({B}, {P}), "
                             f"got {tuple(control_target.shape)}")
    missing = sorted(set(torch.unique(position[te]).tolist()) - set(torch.unique(position[tr]).tolist()))
    if missing:
        raise ValueError(f"test holds position labels {missing[:5]} that no training sequence has; the position "
                         "regression fitted on train cannot remove them")

    return position, tr, te, grid, folds, seed, control_target


def _cross_validation(rows, tr: Tensor, folds: int, grid: Tensor, seed: int) -> tuple[Tensor, Tensor]:
    """Pooled residual (G, 2) and total (2,) sums of squares of the ridge fits over
    ``folds`` folds of the training sequences (a generator seeded ``seed`` draws them;
    the position regression and standardization are refitted in each fold)."""
    gen = torch.Generator().manual_seed(seed)
    order = tr[torch.randperm(len(tr), generator=gen)]
    cv_res = torch.zeros(len(grid), 2, dtype=torch.float64)
    cv_tot = torch.zeros(2, dtype=torch.float64)
    for part in torch.tensor_split(order, folds):
        fit_seqs = order[~torch.isin(order, part)]
        Xa, Ya, pa = rows(fit_seqs)
        Xb, Yb, pb = rows(part)
        f = _Fit(Xa, Ya, pa, torch.unique(pa))
        pred = _ridge_predict(f.features(Xa, pa), f.targets(Ya, pa), f.features(Xb, pb), grid)  # (G, m, 2)
        cv_res += ((f.targets(Yb, pb)[None] - pred) ** 2).sum(1)
        cv_tot += _ss_tot(Yb, pb)
    return cv_res, cv_tot


def probe_selectivity(features: Tensor, target: Tensor, position: Tensor, *, train, test,
                      ridge: Sequence[float] = RIDGE_GRID, control_target: Tensor | None = None,
                      folds: int = 5, seed: int = 0) -> dict:
    """A selective linear probe of ``target`` beyond position (Hewitt and Liang 2019).

    features: (B, P, d) float; target: (B, P) float; position: (P,) or (B, P) integer
    labels (the supervised position of each row); ``train`` and ``test``: disjoint 1-D
    arrays of *sequence* indices in [0, B - 1] (rows are split by sequence, never by
    position). Steps, everything fitted on the training sequences only:

    1. position regressed out of features and target: the training mean at each position
       (least squares on the position one-hot) subtracted, on training and test rows alike;
    2. features standardized by their training standard deviation; a feature that step 1
       leaves constant (a function of position) is dropped;
    3. ridge, w = argmin (1/n) ||y - X w||^2 + lambda ||w||^2, lambda chosen from the grid
       ``ridge`` (default :data:`RIDGE_GRID`) by ``folds``-fold cross-validation over the
       training sequences (folds drawn by a generator seeded ``seed``; steps 1-2 refitted in
       each fold; the largest pooled R^2 wins), then refitted on all training sequences;
    4. R^2 on the test rows: 1 - SS_res / SS_tot, SS_tot about the test target's own mean
       at each position (the variance beyond position), SS_res of the training positional
       mean plus the probe's output.

    The same probe, with its own lambda, runs on ``control_target`` (B, P): by default
    :func:`permuted_control` of ``target`` (seed ``seed``); for the wind tunnel
    :func:`value_match_entropy` is the sharper one. Returns 'r2', 'r2_control',
    'selectivity' = r2 - r2_control, 'ridge' and 'ridge_control' (the lambdas chosen),
    'cv_r2' and 'cv_r2_control' (their cross-validated R^2), 'n_train' and 'n_test'
    (sequences), 'n_features' (kept after step 2)."""
    position, tr, te, grid, folds, seed, control_target = _probe_arguments(
        features, target, position, train, test, ridge, control_target, folds, seed)
    d = features.shape[2]
    X = features.detach().double().cpu()
    Y = torch.stack([target.detach().double().cpu(), control_target.detach().double().cpu()], -1)  # (B, P, 2)

    def rows(seqs):
        return X[seqs].reshape(-1, d), Y[seqs].reshape(-1, 2), position[seqs].reshape(-1)

    Xtr, Ytr, ptr = rows(tr)
    Xte, Yte, pte = rows(te)
    names = ("target", "control_target")
    for Ys, ps, where in ((Ytr, ptr, "training"), (Yte, pte, "test")):
        tot = _ss_tot(Ys, ps)
        for k in range(2):
            if not float(tot[k]) > 1e-12 * max(float((Ys[:, k] ** 2).sum()), 1e-300):
                raise ValueError(f"{names[k]} is a function of position on the {where} sequences: nothing is left "
                                 "beyond position to probe (in the wind tunnel, use the repeats variant)")

    cv_res, cv_tot = _cross_validation(rows, tr, folds, grid, seed)
    cv_r2 = 1.0 - cv_res / cv_tot.clamp(min=1e-300)  # (G, 2)
    best = [int(torch.nonzero(cv_r2[:, k] == cv_r2[:, k].max())[-1]) for k in range(2)]  # ties: more penalty

    f = _Fit(Xtr, Ytr, ptr, torch.unique(position[tr]))
    pred = _ridge_predict(f.features(Xtr, ptr), f.targets(Ytr, ptr), f.features(Xte, pte), grid)
    ss_res = torch.stack([((f.targets(Yte, pte)[:, k] - pred[best[k], :, k]) ** 2).sum() for k in range(2)])
    r2 = 1.0 - ss_res / _ss_tot(Yte, pte)
    return {"r2": float(r2[0]), "r2_control": float(r2[1]), "selectivity": float(r2[0] - r2[1]),
            "ridge": float(grid[best[0]]), "ridge_control": float(grid[best[1]]),
            "cv_r2": float(cv_r2[best[0], 0]), "cv_r2_control": float(cv_r2[best[1], 1]),
            "n_train": len(tr), "n_test": len(te), "n_features": int(f.keep.sum())}


# --------------------------------------------------------------------------- the whole measurement


def entropy_selectivity(model: CausalTransformer, task: WindTunnel, ev: EvalSet, *, split_seed: int = 0,
                        train_share: float = 0.5, ridge: Sequence[float] = RIDGE_GRID, folds: int = 5,
                        control: str = "value_match") -> dict[str, dict]:
    """How selectively each of :func:`representations` encodes the exact posterior entropy
    beyond position, on an evaluation set ``ev`` of the repeats variant of ``task`` (in the
    plain task the entropy is a function of position: there is nothing beyond it).

    The sequences of ``ev`` are split at random (generator seeded ``split_seed``),
    ``train_share`` of them to fit the probe, the rest to score it; the target is
    ``ev.pos_bits`` (B, L + 1), the position the supervised index 0..L. ``control``:
    'value_match' (default, :func:`value_match_entropy`, the control task of this wind
    tunnel) or 'permutation' (:func:`permuted_control`). Returns, per representation name,
    the dict of :func:`probe_selectivity` (r2, r2_control, selectivity, n_train, n_test,
    ...) and, whatever ``control`` is, 'r2_permuted' and 'selectivity_permuted' against
    the permuted entropy, and 'control_rho': the correlation of the control target with
    the entropy beyond position on ``ev`` (what a perfect entropy code would let the
    probe read from the control: about rho^2)."""
    _check_task(task)
    if not task.repeats:
        raise ValueError("task must be the repeats variant (WindTunnel(V, L, repeats=True)): in the plain task the "
                         "posterior entropy is a function of position, so nothing is left beyond position to probe")
    if not isinstance(ev, EvalSet):
        raise TypeError(f"ev must be an EvalSet (tasks.bijection.eval_set), got {type(ev).__name__}")
    _check_tokens(ev.tokens, task)
    B = ev.tokens.shape[0]
    if tuple(ev.pos_bits.shape) != (B, task.L + 1):
        raise ValueError(f"ev.pos_bits must have shape ({B}, {task.L + 1}), got {tuple(ev.pos_bits.shape)}")
    split_seed = check_int("split_seed", split_seed, 0, 2**63 - 1)
    train_share = check_float("train_share", train_share, 0.0, 1.0, low_open=True, high_open=True)
    folds = check_int("folds", folds, 2, None)
    check_choice("control", control, ("value_match", "permutation"))
    n_train = int(round(train_share * B))
    if n_train < 2 * folds or B - n_train < 2:
        raise ValueError(f"train_share = {train_share} of {B} sequences leaves {n_train} to train and {B - n_train} "
                         f"to test; need at least {2 * folds} (2 x folds) to train and 2 to test")
    perm = torch.randperm(B, generator=torch.Generator().manual_seed(split_seed))
    train, test = perm[:n_train], perm[n_train:]
    target = ev.pos_bits.double()
    position = torch.arange(task.L + 1)
    permuted = permuted_control(target, position, seed=split_seed)
    ctrl = value_match_entropy(ev.tokens, task) if control == "value_match" else permuted
    centre = lambda y: y - y.mean(0)  # noqa: E731 (beyond position: every sequence has every position)
    a, b = centre(target), centre(ctrl)
    rho = float((a * b).sum() / (a.norm() * b.norm()).clamp(min=1e-300))
    feats = representations(model, ev.tokens, task)
    out = {}
    for name, X in feats.items():
        res = probe_selectivity(X, target, position, train=train, test=test, ridge=ridge, control_target=ctrl,
                                folds=folds, seed=split_seed)
        if control == "value_match":
            alt = probe_selectivity(X, target, position, train=train, test=test, ridge=ridge,
                                    control_target=permuted, folds=folds, seed=split_seed)
            res["r2_permuted"], res["selectivity_permuted"] = alt["r2_control"], alt["selectivity"]
        else:
            res["r2_permuted"], res["selectivity_permuted"] = res["r2_control"], res["selectivity"]
        res["control"], res["control_rho"] = control, rho
        out[name] = res
    return out
