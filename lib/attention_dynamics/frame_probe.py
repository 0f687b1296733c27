"""The key frame where it matters: the retrieval head(s) of a wind-tunnel model, and Paper
I's own measures of the frame, the query-key alignment and the value manifold (R8; chapter
*Geometry over training*).

The key-frame statistic of :mod:`attention_dynamics.geometry` groups the keys at every key
position by their own token, over every head. In a two-layer retrieval circuit the keys
that matter are the ones the query reads: those at the positions the retrieval head attends
to. This module measures that directly.

- :func:`frame_heads` and :func:`choose_frame_head`: each head's attention mass, at the
  query, on the pair(s) holding the query's key; the frame head is the argmax (chosen on a
  separate selection seed's model by the chapter, so that the head is not picked on the
  data it is judged on). :func:`frame_mass_chance` is uniform attention's mass there.
- :func:`matched_pair_dominance` (its arithmetic in :func:`score_dominance`): at the query
  of one head, do the scores q(query) . k(b) / sqrt(d_head) over the context positions b
  single out the matching pair, and by how many standard deviations of the other scores?
- Paper I's measures, with the definitions of the authors' repository
  (``vishalmisra/bayesian-wind-tunnel``), so that the book compares like with like:
  :func:`paper_key_orthogonality` (core :func:`symbol_key_frame`), :func:`qk_alignment`,
  :func:`value_manifold` (core :func:`manifold_dimensionality`).

Every statistic comes with its value for chance or for random vectors, computed (exactly
where a closed form exists, else by seeded Monte Carlo on the same configuration), so that a
number can be read against what no structure would give.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from .geometry import frame_mass, key_orthogonality, spearman
from .tasks.bijection import EvalSet, WindTunnel
from .transformer import CausalTransformer, evaluating
from .validation import check_choice, check_float, check_int, check_tensor

__all__ = [
    "frame_heads",
    "frame_mass_chance",
    "choose_frame_head",
    "query_scores",
    "score_dominance",
    "matched_pair_dominance",
    "random_abs_cosine",
    "symbol_key_frame",
    "paper_key_orthogonality",
    "qk_alignment",
    "manifold_dimensionality",
    "value_manifold",
]

_REPO = "vishalmisra/bayesian-wind-tunnel"


# ----------------------------------------------------------------------------- checks


def _check_task(task) -> WindTunnel:
    if not isinstance(task, WindTunnel):
        raise TypeError(f"task must be a WindTunnel (attention_dynamics.tasks.bijection), got {type(task).__name__}")
    return task


def _check_tokens(name: str, tokens, task: WindTunnel) -> Tensor:
    """(B, 2L + 1) token ids below V whose query key occurs among the context keys."""
    check_tensor(name, tokens, ndim=2, kind="int", nonempty=True)
    if tokens.shape[1] != task.length:
        raise ValueError(f"{name} must have {task.length} columns (2L + 1 for L = {task.L}), "
                         f"got shape {tuple(tokens.shape)}")
    if int(tokens.min()) < 0 or int(tokens.max()) >= task.V:
        raise ValueError(f"{name} must lie in [0, {task.V - 1}] (V = {task.V}), "
                         f"got values in [{int(tokens.min())}, {int(tokens.max())}]")
    L = task.L
    missing = ~(tokens[:, 0:2 * L:2] == tokens[:, 2 * L, None]).any(1)
    if bool(missing.any()):
        raise ValueError(f"{name}: the query key (last column) must occur among the context keys; it does not "
                         f"in {int(missing.sum())} sample(s), the first at row {int(missing.nonzero()[0])}")
    return tokens


def _check_setup(model, task, ev) -> tuple[CausalTransformer, WindTunnel, EvalSet]:
    if not isinstance(model, CausalTransformer):
        raise TypeError(f"model must be a CausalTransformer, got {type(model).__name__}")
    if model.cfg.input != "tokens":
        raise ValueError(f"model must read tokens (TransformerConfig.input = 'tokens'), got input = {model.cfg.input!r}")
    _check_task(task)
    if model.cfg.vocab < task.V:
        raise ValueError(f"model.cfg.vocab = {model.cfg.vocab} must be at least task.V = {task.V}")
    if model.cfg.max_len is not None and model.cfg.max_len < task.length:
        raise ValueError(f"model.cfg.max_len = {model.cfg.max_len} must be at least the sequence length "
                         f"2L + 1 = {task.length}")
    if not isinstance(ev, EvalSet):
        raise TypeError(f"ev must be an EvalSet (attention_dynamics.tasks.bijection.eval_set), got {type(ev).__name__}")
    _check_tokens("ev.tokens", ev.tokens, task)
    return model, task, ev


def _check_layer_head(model: CausalTransformer, layer, head, *, head_optional: bool = False) -> tuple[int, int | None]:
    layer = check_int("layer", layer, 0, model.cfg.n_layers - 1)
    if head is None and head_optional:
        return layer, None
    return layer, check_int("head", head, 0, model.cfg.n_heads - 1)


def _traces(model: CausalTransformer, tokens: Tensor):
    with evaluating(model):
        _, traces = model(tokens, inspect=True)
    return traces


def _match(tokens: Tensor, L: int) -> Tensor:
    """(B, L) bool: the pairs whose key is the query's key."""
    return tokens[:, 0:2 * L:2] == tokens[:, 2 * L, None]


# ----------------------------------------------------------------------------- frame heads


def frame_heads(model: CausalTransformer, task: WindTunnel, ev: EvalSet) -> np.ndarray:
    """Each head's attention mass, at the query position 2L, on the pair(s) holding the
    query's key (key and value positions; :func:`attention_dynamics.geometry.frame_mass`),
    averaged over the samples of ``ev``: an array (n_layers, n_heads) in [0, 1]. Uniform
    attention over the visible positions gives :func:`frame_mass_chance`. The model is
    run in evaluation mode without gradients; its mode is restored."""
    model, task, ev = _check_setup(model, task, ev)
    traces = _traces(model, ev.tokens)
    return torch.stack([frame_mass(tr.attention.weights, ev.tokens, task.L).double().mean(0)
                        for tr in traces]).numpy()


def frame_mass_chance(task: WindTunnel, tokens: Tensor) -> float:
    """The frame mass of uniform causal attention: at the query (position 2L, which sees
    2L + 1 positions, itself included), 2m / (2L + 1) for m pairs holding the query's key,
    averaged over the samples ``tokens`` (B, 2L + 1); m = 1 without repeated keys."""
    _check_task(task)
    _check_tokens("tokens", tokens, task)
    m = _match(tokens, task.L).sum(1).double()
    return float((2 * m / task.length).mean())


def choose_frame_head(masses) -> tuple[int, int]:
    """THE frame head: the (layer, head) of the largest entry of ``masses`` (n_layers,
    n_heads), as :func:`frame_heads` returns it (the first in row-major order on a tie).
    Choose it on a separate selection seed's model, then measure it on the others."""
    a = np.asarray(masses, dtype=float) if not isinstance(masses, Tensor) else masses.detach().double().numpy()
    if a.ndim != 2 or 0 in a.shape:
        raise ValueError(f"masses must be a non-empty (n_layers, n_heads) array, got shape {a.shape}")
    if not np.isfinite(a).all():
        raise ValueError("masses must be finite (an array from frame_heads)")
    layer, head = np.unravel_index(int(np.argmax(a)), a.shape)
    return int(layer), int(head)


# ----------------------------------------------------------------------------- matched-pair dominance


def query_scores(model: CausalTransformer, task: WindTunnel, ev: EvalSet, layer: int, head: int) -> Tensor:
    """The attention scores of one head at the query position 2L over the context
    positions b < 2L: q(2L) . k(b) / sqrt(d_head), from the layer's post-projection
    queries and keys (``HeadTrace.q``, ``.k``: the linear maps, biases included, of the
    block's LayerNorm output, split into heads along the feature axis); the scale is the
    one the model's attention applies (:func:`attention_dynamics.head.attend`'s default).
    Returns (B, 2L), float64."""
    model, task, ev = _check_setup(model, task, ev)
    layer, head = _check_layer_head(model, layer, head)
    tr = _traces(model, ev.tokens)[layer]
    L = task.L
    q = tr.q[:, head, 2 * L].double()  # (B, d_head)
    k = tr.k[:, head, :2 * L].double()  # (B, 2L, d_head)
    return torch.einsum("bd,bpd->bp", q, k) / math.sqrt(q.shape[-1])


def _margins(scores: Tensor, target: Tensor) -> Tensor:
    """Per sample: (best target score - mean of the others) / sd of the others (ddof 1);
    +-inf when the others do not vary, NaN with fewer than two others."""
    other = ~target
    n_o = other.sum(1).double()
    best = torch.where(target, scores, torch.full_like(scores, -math.inf)).max(1).values
    mean_o = torch.where(other, scores, torch.zeros_like(scores)).sum(1) / n_o.clamp_min(1)
    var_o = torch.where(other, (scores - mean_o[:, None]) ** 2, torch.zeros_like(scores)).sum(1) / (n_o - 1).clamp_min(1)
    sd = var_o.sqrt()
    diff = best - mean_o
    m = torch.where(sd > 0, diff / torch.where(sd > 0, sd, torch.ones_like(sd)), diff.sign() * math.inf)
    return torch.where(n_o >= 2, m, torch.full_like(m, math.nan))


def score_dominance(scores: Tensor, tokens: Tensor, task: WindTunnel, *, draws: int = 20, seed: int = 0) -> dict:
    """Whether a query's scores single out the pair holding its key: the arithmetic of
    :func:`matched_pair_dominance` on given scores (B, 2L) over the context positions
    (keys at even, values at odd positions) and the samples' ``tokens`` (B, 2L + 1).

    For three targets, the matching 'pair' (key and value positions of every pair holding
    the query's key), its 'key' positions alone and its 'value' positions alone, returns
    (no prefix for the pair, ``key_`` and ``value_`` for the others):

    - ``top_is_match``: share of samples whose highest-scoring context position is a target;
    - ``chance_top``: the same share for a position drawn uniformly, mean of |target| / 2L
      over the samples (exact, repeated keys counted); ``chance_top_sd``: its binomial sd
      over the samples, sqrt(sum p (1 - p)) / B, and ``top_z`` = (top_is_match -
      chance_top) / chance_top_sd;
    - ``margin_sd``: mean over samples of (best target score - mean score of the other
      context positions) / sd of those others (ddof 1; +inf for a sample whose others are
      all equal, samples with fewer than two others left out);
    - ``chance_margin_sd``: the same for scores drawn independent standard normal on the
      same targets (``draws`` x B seeded draws): the value with no structure, which is
      above 0 when a target has several positions (the best of two is above the mean).

    Also ``n``, the number of samples."""
    task = _check_task(task)
    check_tensor("scores", scores, ndim=2, nonempty=True)
    _check_tokens("tokens", tokens, task)
    L = task.L
    if tuple(scores.shape) != (tokens.shape[0], 2 * L):
        raise ValueError(f"scores must have shape (B, 2L) = ({tokens.shape[0]}, {2 * L}) to match tokens, "
                         f"got {tuple(scores.shape)}")
    draws = check_int("draws", draws, 1, 10_000)
    seed = check_int("seed", seed, 0, 2**63 - 1)
    s = scores.double()
    B = s.shape[0]
    pair = _match(tokens, L).repeat_interleave(2, dim=1)  # (B, 2L)
    even = torch.zeros(2 * L, dtype=torch.bool)
    even[0::2] = True
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(draws, B, 2 * L, generator=gen, dtype=torch.float64)
    out: dict = {"n": B}
    top = s.argmax(1)
    for prefix, target in (("", pair), ("key_", pair & even), ("value_", pair & ~even)):
        hit = target.gather(1, top[:, None])[:, 0].double()
        p = target.sum(1).double() / (2 * L)
        sd = float((p * (1 - p)).sum().sqrt() / B)
        m = _margins(s, target)
        null = _margins(noise.reshape(-1, 2 * L), target.repeat(draws, 1))
        out[prefix + "top_is_match"] = float(hit.mean())
        out[prefix + "chance_top"] = float(p.mean())
        out[prefix + "chance_top_sd"] = sd
        out[prefix + "top_z"] = (out[prefix + "top_is_match"] - out[prefix + "chance_top"]) / sd if sd > 0 else math.nan
        out[prefix + "margin_sd"] = float(m[~m.isnan()].mean()) if bool((~m.isnan()).any()) else math.nan
        out[prefix + "chance_margin_sd"] = float(null[~null.isnan()].mean()) if bool((~null.isnan()).any()) else math.nan
    return out


def matched_pair_dominance(model: CausalTransformer, task: WindTunnel, ev: EvalSet, layer: int, head: int, *,
                           draws: int = 20, seed: int = 0) -> dict:
    """Does head ``head`` of layer ``layer`` route the query to the pair holding its key by
    its scores? At the query position 2L, the scores q(2L) . k(b) / sqrt(d_head) over the
    context positions b < 2L (:func:`query_scores`) are read by :func:`score_dominance`:
    ``top_is_match`` (share of samples whose top-scoring position lies in the matching
    pair), ``margin_sd`` (the best matching score above the mean of the others, in sd of
    the others), their chance values ``chance_top`` (exact, from the samples; 2 / 2L per
    sample with one matching pair), ``chance_top_sd``, ``top_z`` and ``chance_margin_sd``,
    and the same with the key position alone (``key_``) and the value position alone
    (``value_``). Unlike the token-grouped key frame, this reads the keys at the positions
    the retrieval head attends to, in that head alone."""
    scores = query_scores(model, task, ev, layer, head)
    return score_dominance(scores, ev.tokens, task, draws=draws, seed=seed) | {"layer": int(layer), "head": int(head)}


# ----------------------------------------------------------------------------- Paper I: key orthogonality


def random_abs_cosine(d: int) -> float:
    """E|cos| between two independent isotropic random vectors in R^d, exactly:
    Gamma(d/2) / (sqrt(pi) Gamma((d + 1) / 2)) (the first absolute moment of one coordinate
    of a uniform point on the sphere S^(d-1)); about sqrt(2 / (pi d)) for large d."""
    d = check_int("d", d, 1, None)
    if d == 1:
        return 1.0
    return math.exp(math.lgamma(d / 2) - math.lgamma((d + 1) / 2)) / math.sqrt(math.pi)


def _offdiag(c: Tensor) -> Tensor:
    k = c.shape[-1]
    return c[..., ~torch.eye(k, dtype=torch.bool)]


def symbol_key_frame(keys: Tensor) -> dict:
    """Three readings of how a set of symbols' keys (..., V, d), one key per symbol, fill
    their space; each a tensor over the leading dimensions:

    - ``abs_cos``: mean |cos| over the ordered pairs of different symbols, the keys
      uncentred: ``measure_key_orthogonality`` of ``src/utils/geometry.py`` in
      vishalmisra/bayesian-wind-tunnel (0 for orthonormal keys);
    - ``signed_cos``: the mean cos itself, uncentred, as ``cmd_orthogonality`` of
      ``experiments/paper1_bijection/figures/qkv_analysis.py`` there reports it (column
      ``offdiag_mean``: no absolute value);
    - ``centred_abs_cos``: mean |cos| after subtracting the mean key (this library's
      :func:`attention_dynamics.geometry.key_orthogonality`: a component shared by every key
      shifts all of a query's scores alike and cannot route); 1 / (V - 1) for a regular
      simplex, the most spread-out centred frame, and for orthonormal keys once centred."""
    check_tensor("keys", keys, min_ndim=2)
    if keys.shape[-2] < 2 or keys.shape[-1] < 1:
        raise ValueError(f"keys must hold at least 2 symbols' keys of at least 1 dimension (..., V, d), "
                         f"got shape {tuple(keys.shape)}")
    k = keys.double()
    u = k / k.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    c = _offdiag(u @ u.transpose(-1, -2))
    kc = k - k.mean(-2, keepdim=True)
    uc = kc / kc.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    cc = _offdiag(uc @ uc.transpose(-1, -2))
    return {"abs_cos": c.abs().mean(-1), "signed_cos": c.mean(-1), "centred_abs_cos": cc.abs().mean(-1)}


def paper_key_orthogonality(model: CausalTransformer, layer: int = 0, *, n_symbols: int | None = None) -> dict:
    """Key orthogonality as Paper I's code measures it: each symbol's key built from its
    token embedding through the key map of layer ``layer``, head by head, K_h = E W_K,h^T
    (V, d_head), no LayerNorm, no position, no bias (``cmd_orthogonality`` of
    ``experiments/paper1_bijection/figures/qkv_analysis.py``, whose model has no key bias);
    read by :func:`symbol_key_frame`. Meaningful for layer 0, whose input is the embedding
    (plus position); the script reports every layer the same way.

    Returns per head (arrays (n_heads,)): ``abs_cos`` (uncentred mean |cos|,
    ``measure_key_orthogonality`` of ``src/utils/geometry.py``), ``signed_cos`` (the
    script's ``offdiag_mean``), ``centred_abs_cos`` (this library's centred version, through
    :func:`attention_dynamics.geometry.key_orthogonality`); and the references, computed:
    ``random_abs_cos`` (E|cos| of random directions in d_head dimensions, exact,
    :func:`random_abs_cosine`), ``random_signed_cos`` (0) and ``random_signed_cos_sd`` (the
    sd of the mean over the V (V - 1) / 2 distinct pairs for random keys, exact: pairwise
    cosines of independent isotropic keys are uncorrelated with variance 1 / d_head),
    ``random_centred_abs_cos`` (:func:`attention_dynamics.geometry.random_frame_abs_cosine`)
    and ``simplex_abs_cos`` (1 / (V - 1)). ``n_symbols``: the first V symbols of the
    vocabulary (default all of it)."""
    if not isinstance(model, CausalTransformer):
        raise TypeError(f"model must be a CausalTransformer, got {type(model).__name__}")
    if model.cfg.input != "tokens":
        raise ValueError(f"model must read tokens (TransformerConfig.input = 'tokens'), got input = {model.cfg.input!r}")
    layer = check_int("layer", layer, 0, model.cfg.n_layers - 1)
    V = model.cfg.vocab if n_symbols is None else check_int("n_symbols", n_symbols, 2, model.cfg.vocab)
    if V < 2:
        raise ValueError(f"the model's vocabulary must hold at least 2 symbols, got vocab = {V}")
    H, D = model.cfg.n_heads, model.cfg.d_model
    dh = D // H
    with torch.no_grad():
        E = model.inp.weight[:V].double()  # (V, D)
        Wk = model.blocks[layer].k.weight.double().view(H, dh, D)  # rows of head h: h dh ... (h + 1) dh
        K = torch.einsum("vd,hed->hve", E, Wk)  # (H, V, dh)
    stats = symbol_key_frame(K)
    symbols = torch.arange(V)
    centred = [key_orthogonality(K[h], symbols, V) for h in range(H)]
    npairs = V * (V - 1) / 2
    return {"layer": layer, "abs_cos": stats["abs_cos"].numpy(), "signed_cos": stats["signed_cos"].numpy(),
            "centred_abs_cos": np.array([c[0] for c in centred]),
            "random_abs_cos": random_abs_cosine(dh), "random_signed_cos": 0.0,
            "random_signed_cos_sd": math.sqrt(1.0 / dh / npairs),
            "random_centred_abs_cos": centred[0][1],
            "simplex_abs_cos": 1.0 / (V - 1)}


# ----------------------------------------------------------------------------- Paper I: query-key alignment


def qk_alignment(model: CausalTransformer, task: WindTunnel, ev: EvalSet, layer: int, head: int | None = None) -> dict:
    """Query-key alignment as Paper I's code measures it (``cmd_qk_align`` of
    ``experiments/paper1_bijection/figures/qkv_analysis.py`` in
    vishalmisra/bayesian-wind-tunnel): the cosine between the query of the last position
    of a prefix [k1, v1, ..., k_t] and the keys of the prior key positions (the even
    positions before it), per head, then averaged over the heads (``head=None``, theirs)
    or of one head (``head``: the frame head). Queries and keys are the layer's
    post-projection q, k of the block's normalized input, as in their script.

    The model is causal, so one pass over the full sequences gives every prefix. Their
    script reads a single sequence (its generator reseeds on every call); here the cosines
    are averaged over the samples of ``ev``. Returns:

    - ``grid`` (L + 1, L): row r the query at key position 2r (r < L: a fresh key, their
      grid; r = L: the task's query at 2L), column i the key at 2i; NaN for i >= r;
    - at the query 2L: ``match_cos`` (mean over samples of the cosine with the key(s)
      matching the query), ``other_cos`` (with the other keys), ``match_minus_other`` and
      its standard error over the samples ``match_minus_other_se``;
    - references for random directions in d_head dimensions, computed: ``random_cos`` (0,
      by symmetry), ``random_cos_sd`` (1 / sqrt(d_head), exact) and ``random_abs_cos``
      (:func:`random_abs_cosine`)."""
    model, task, ev = _check_setup(model, task, ev)
    layer, head = _check_layer_head(model, layer, head, head_optional=True)
    tr = _traces(model, ev.tokens)[layer]
    L = task.L
    q = torch.nn.functional.normalize(tr.q[:, :, 0::2].double(), dim=-1)  # (B, H, L + 1, dh): key positions and 2L
    k = torch.nn.functional.normalize(tr.k[:, :, 0:2 * L:2].double(), dim=-1)  # (B, H, L, dh)
    cos = torch.einsum("bhrd,bhid->bhri", q, k)  # (B, H, L + 1, L)
    cos = cos.mean(1) if head is None else cos[:, head]  # (B, L + 1, L)
    prior = torch.arange(L)[None, :] < torch.arange(L + 1)[:, None]  # column i before row r
    grid = torch.where(prior, cos.mean(0), torch.full((L + 1, L), math.nan, dtype=torch.float64))
    match = _match(ev.tokens, L)  # (B, L)
    last = cos[:, L]  # (B, L)
    m = (last * match).sum(1) / match.sum(1)
    n_other = (~match).sum(1)
    o = (last * ~match).sum(1) / n_other.clamp_min(1)
    keep = n_other > 0
    diff = (m - o)[keep]
    dh = tr.q.shape[-1]
    return {"layer": layer, "head": head, "grid": grid.numpy(), "match_cos": float(m.mean()),
            "other_cos": float(o[keep].mean()) if bool(keep.any()) else math.nan,
            "match_minus_other": float(diff.mean()) if diff.numel() else math.nan,
            "match_minus_other_se": float(diff.std() / math.sqrt(diff.numel())) if diff.numel() > 1 else math.nan,
            "random_cos": 0.0, "random_cos_sd": 1.0 / math.sqrt(dh), "random_abs_cos": random_abs_cosine(dh)}


# ----------------------------------------------------------------------------- Paper I: value manifold


def _pca_shares(X: Tensor) -> Tensor:
    """Explained-variance ratios of the principal components of the rows of X (centred)."""
    Xc = X - X.mean(0)
    s2 = torch.linalg.svdvals(Xc) ** 2
    return s2 / s2.sum()


def _pc1(X: Tensor) -> Tensor:
    Xc = X - X.mean(0)
    U, S, _ = torch.linalg.svd(Xc, full_matrices=False)
    return U[:, 0] * S[0]


def _dims(shares: Tensor, threshold: float) -> int:
    cum = shares.cumsum(0).numpy()
    return int(min(np.searchsorted(cum, threshold) + 1, len(cum)))


def _standardize(X: Tensor) -> Tensor:
    """Each column to mean 0 and sd 1 (ddof 0); a constant column is only centred."""
    sd = X.std(0, unbiased=False)
    return (X - X.mean(0)) / torch.where(sd > 0, sd, torch.ones_like(sd))


def _pearson(a: Tensor, b: Tensor) -> float:
    a, b = a - a.mean(), b - b.mean()
    den = float(a.norm() * b.norm())
    return float((a @ b) / den) if den > 0 else math.nan


def _manifold_stats(X: Tensor, entropies: np.ndarray, threshold: float) -> dict:
    Z = _standardize(X)
    sz, sx = _pca_shares(Z), _pca_shares(X)
    rho = spearman(_pc1(Z).numpy(), entropies) if np.ptp(entropies) > 0 else math.nan
    r = _pearson(_pc1(X), torch.as_tensor(entropies, dtype=torch.float64)) if np.ptp(entropies) > 0 else math.nan
    return {"dims_std": _dims(sz, threshold), "pc1_share_std": float(sz[0]),
            "pc12_share_std": float(sz[:2].sum()), "pc1_spearman_std": abs(rho),
            "dims_90": _dims(sx, 0.90), "dims_95": _dims(sx, 0.95), "pc1_share": float(sx[0]),
            "pc1_abs_pearson": abs(r)}


def manifold_dimensionality(X: Tensor, entropies, *, threshold: float = 0.95, draws: int = 5, seed: int = 0) -> dict:
    """Paper I's value-manifold readings of representations X (n, d) with the Bayes entropy
    of each row (``entropies``, n):

    - ``dims_std``: principal components needed to reach ``threshold`` of the variance of
      the standardized X (each feature to mean 0 and sd 1): ``measure_manifold_dimensionality``
      of ``src/utils/geometry.py`` in vishalmisra/bayesian-wind-tunnel (first k with
      cumulative share >= threshold);
    - ``pc1_share_std``, ``pc12_share_std`` and ``pc1_spearman_std`` (|Spearman| of the first
      PC coordinate with the entropy; their sign flip makes it positive):
      ``analyze_value_manifold`` of the same file;
    - ``dims_90``, ``dims_95``, ``pc1_share`` of the unstandardized X and
      ``pc1_abs_pearson`` (|Pearson r| of PC1 with the entropy): ``analyze_manifold`` of
      ``experiments/paper1_bijection/figures/geometric_analysis.py`` (and the PC1 |r| of
      ``manifold_visualization.py``).

    ``random``: the same readings, averaged over ``draws`` seeded draws of isotropic
    Gaussian X of the same shape with the same entropies: what no structure gives.
    Correlations are NaN when the entropy does not vary."""
    check_tensor("X", X, ndim=2)
    n, d = X.shape
    if n < 3 or d < 1:
        raise ValueError(f"X must have at least 3 rows and 1 column (n, d), got shape {tuple(X.shape)}")
    e = np.asarray(entropies, dtype=float)
    if e.shape != (n,):
        raise ValueError(f"entropies must have one entry per row of X, shape ({n},), got shape {e.shape}")
    if not np.isfinite(e).all():
        raise ValueError("entropies must be finite")
    threshold = check_float("threshold", threshold, 0.0, 1.0, low_open=True)
    draws = check_int("draws", draws, 1, 1000)
    seed = check_int("seed", seed, 0, 2**63 - 1)
    out = _manifold_stats(X.double(), e, threshold)
    gen = torch.Generator().manual_seed(seed)
    rand = [_manifold_stats(torch.randn(n, d, generator=gen, dtype=torch.float64), e, threshold) for _ in range(draws)]
    out["random"] = {key: float(np.mean([r[key] for r in rand])) for key in rand[0]}
    out["n"], out["d"], out["threshold"] = n, d, threshold
    return out


def value_manifold(model: CausalTransformer, task: WindTunnel, ev: EvalSet, *, positions: str = "keys",
                   threshold: float = 0.95, draws: int = 5, seed: int = 0) -> dict:
    """The value manifold as Paper I's code reads it: the model's final representation
    (after the final LayerNorm, the input of the read-out) at ``positions`` of every
    sample of ``ev``, with the Bayes entropy of each, read by
    :func:`manifold_dimensionality` (random baseline included).

    ``positions="keys"``: the key positions 0, 2, ..., 2L - 2, where the model predicts the
    pair's value, with that prediction's exact posterior entropy (``ev.pos_bits``;
    log2(V - i) at pair i without repeats): the last position of each prefix
    [k1, v1, ..., k_t] as ``cmd_value_manifold`` of
    ``experiments/paper1_bijection/figures/qkv_analysis.py`` takes it. ``"values"``: the
    value positions 1, 3, ..., 2L - 1 with the same entropy per pair (the values seen before
    it), as ``extract_all_positions`` of ``geometric_analysis.py`` takes them. Their script
    draws 100 identical sequences (its generator reseeds on every call); here the samples of
    ``ev`` differ."""
    model, task, ev = _check_setup(model, task, ev)
    positions = check_choice("positions", positions, ("keys", "values"))
    L = task.L
    got = {}
    hook = model.ln_f.register_forward_hook(lambda mod, inp, out: got.__setitem__("h", out))
    try:
        with evaluating(model):
            model(ev.tokens)
    finally:
        hook.remove()
    pos = torch.arange(0, 2 * L, 2) + (1 if positions == "values" else 0)
    X = got["h"][:, pos].double().reshape(-1, got["h"].shape[-1])  # (B L, d_model), sample-major
    e = ev.pos_bits[:, :L].double().reshape(-1).numpy()
    return manifold_dimensionality(X, e, threshold=threshold, draws=draws, seed=seed) | {"positions": positions}
