"""The single causal head of the sticky-chain protocol (R7; chapters *The sticky Markov chain:
EM-style vs SGD* and *The sticky Markov chain: speed*): its initial weights, its schedules, the
reference trainer that runs it as the authors' script does, and the fast path: many runs
batched, the closed-form backward of R1-R3, and query rows processed in blocks so that the
T x T score matrix never exists in memory and the hidden (future) half is never computed.

For a block of queries I = [a, b) the keys it can see are 0..b-1. Everything a position
needs for the cross-entropy loss and for every gradient is computed inside the block:

    s = q_I K^T / sqrt(d_k) (future keys masked)   alpha = softmax(s)   g = alpha V
    z = g W_O   u = (p - e_y) W_O^T / n            (the read-out is per position)
    b = u V^T   ds = alpha (b - E_alpha[b])        (R1)
    dQ_I = ds K / sqrt(d_k)   dK += ds^T q_I / sqrt(d_k)   dV += alpha^T u   (R2, R3)

(computed through Zv = V W_O, see the code, which is the same arithmetic in fewer operations).

Shapes: R runs stacked on a leading axis; parameters W_Q, W_K: (R, d_x, d_k),
W_V: (R, d_x, d_v), W_O: (R, d_v, C).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import torch
from torch import Tensor

from .artifacts import load_or_make
from .native import causal_head_kernel, dispatch, in_threads, transposed_padded
from .tasks.sticky_chain import D_X, N_STATES, SEEDS, StickySequence, sample_sequences
from .training import HEAD_ROLES, SGD, History, StepOutput, em_style_rates, head_rates, train
from .validation import check_float, check_int, check_int_list, check_same_dtype_device, check_tensor

__all__ = ["BlockedStats", "BlockedStep", "ProtocolBatch", "protocol_batch", "blocked_causal_step", "causal_head_loss_fn", "dense_causal_forward", "D_K", "D_V",
           "PROTOCOL_SCHEDULES", "init_heads", "protocol_rates", "train_reference", "ProtocolConfig", "ProtocolRun", "run_protocol"]


@dataclass(frozen=True)
class BlockedStats:
    loss: Tensor  # (R,) mean cross-entropy, nats
    entropy: Tensor  # (R,) mean predictive entropy, nats
    accuracy: Tensor  # (R,) fraction of argmax hits
    attention_entropy: Tensor  # (R,) mean entropy of the attention rows, nats


@dataclass(frozen=True)
class BlockedStep:
    """What :func:`blocked_causal_step` computes: the loss (R,); with ``grads`` the gradients
    of the four matrices W_Q, W_K, W_V, W_O; with ``stats`` the statistics; with
    ``value_info`` R2's per-position value gradients ``dV`` (R, T, d_v) and each key's total
    responsibility ``N`` (R, T), N_j = sum_i alpha_ij. What was not asked for is None."""
    loss: Tensor
    grads: dict[str, Tensor] | None = None
    stats: BlockedStats | None = None
    dV: Tensor | None = None
    N: Tensor | None = None


def _check(params: dict[str, Tensor], x: Tensor, y: Tensor) -> None:
    check_tensor("x", x, ndim=3, nonempty=True)
    check_tensor("y", y, ndim=2, kind="int")
    for n in ("W_Q", "W_K", "W_V", "W_O"):
        if n not in params:
            raise KeyError(f"params lacks {n}")
        check_tensor(n, params[n], ndim=3)
    check_same_dtype_device(x=x, **{n: params[n] for n in ("W_Q", "W_K", "W_V", "W_O")})
    R, T, d_x = x.shape
    if y.shape != (R, T):
        raise ValueError(f"y must have shape (R, T) = {(R, T)}, got {tuple(y.shape)}")
    for n in ("W_Q", "W_K", "W_V"):
        if params[n].shape[:2] != (R, d_x):
            raise ValueError(f"{n} must have shape ({R}, {d_x}, d), got {tuple(params[n].shape)}")
    if params["W_K"].shape[2] != params["W_Q"].shape[2]:
        raise ValueError(f"W_Q and W_K must share d_k, got {params['W_Q'].shape[2]} and {params['W_K'].shape[2]}")
    if params["W_O"].shape[:2] != (R, params["W_V"].shape[2]):
        raise ValueError(f"W_O must have shape ({R}, d_v = {params['W_V'].shape[2]}, C), got {tuple(params['W_O'].shape)}")
    C = params["W_O"].shape[2]
    if int(y.min()) < 0 or int(y.max()) >= C:
        raise ValueError(f"y must hold class indices in [0, {C - 1}], got values in [{int(y.min())}, {int(y.max())}]")


def blocked_causal_step(params: dict[str, Tensor], x: Tensor, y: Tensor, *, block: int = 64,
                        grads: bool = True, stats: bool = False, value_info: bool = False,
                        native: bool | None = None) -> BlockedStep:
    """Loss (R,) and, with ``grads``, the closed-form gradients of all four matrices; with
    ``stats``, also predictive entropy, accuracy and attention entropy; with ``value_info``,
    R2's per-position value gradients and each key's total responsibility (a
    :class:`BlockedStep`).

    ``native``: use the compiled kernel (:mod:`attention_dynamics.native`, float32 only),
    which fuses each query's forward and backward pass; None (default): where it is the
    faster path measured on this processor (:func:`attention_dynamics.native.chooses`) and
    it builds; False never. Both compute the same closed forms (tested against each other
    and against autograd)."""
    _check(params, x, y)
    block = check_int("block", block, 1, None)
    d_k, C = params["W_Q"].shape[-1], params["W_O"].shape[-1]
    fits = x.dtype == torch.float32 and C & (C - 1) == 0 and 1 <= d_k <= 64  # what the kernel takes
    return dispatch("causal_head", native, fits,
                    lambda: _native_step(params, x, y, grads=grads, stats=stats, value_info=value_info),
                    lambda: _torch_step(params, x, y, block=block, grads=grads, stats=stats, value_info=value_info))


def _torch_step(params, x, y, *, block, grads, stats, value_info):
    W_Q, W_K, W_V, W_O = (params[n] for n in ("W_Q", "W_K", "W_V", "W_O"))
    R, T, _ = x.shape
    C = W_O.shape[-1]
    scale = 1.0 / math.sqrt(W_Q.shape[-1])
    Q, K, V = x @ W_Q, x @ W_K, x @ W_V
    # The read-out is linear, so each value enters only through Zv = V W_O (T x C, C = 8 <
    # d_v = 15): z_i = sum_j alpha_ij Zv_j and b_ij = u_i . v_j = dz_i . Zv_j with
    # u_i = W_O dz_i. Working with Zv saves a third of the arithmetic.
    Zv = V @ W_O  # (R, T, C)
    Kt, Zvt = K.transpose(1, 2).contiguous(), Zv.transpose(1, 2).contiguous()  # (R, d, T)
    Qs = Q * scale  # the 1/sqrt(d_k) folded into the small factors, not applied to the blocks
    Kts = Kt * scale
    # with a row of ones under Zv^T, one product gives b_ij - E_alpha[b]_i directly
    Zvt1 = torch.cat([Zvt, torch.ones(R, 1, T, dtype=x.dtype)], 1)
    loss = torch.zeros(R, dtype=x.dtype)
    sums = torch.zeros(3, R, dtype=x.dtype) if stats else None  # entropy, accuracy, attention entropy
    if grads:
        # accumulated transposed, (R, d, T): the products below are laid out so that the
        # large block is the right-hand operand, which is about twice as fast on CPU
        dQt, dKt = torch.zeros_like(Kt), torch.zeros_like(Kt)
        Mt = torch.zeros(R, C + int(value_info), T, dtype=x.dtype)  # (alpha^T dz)^T, and N_j as a last row
    future = torch.ones(block, block, dtype=torch.bool).triu(1)
    # Two block-sized work buffers reused for every block: allocating fresh multi-megabyte
    # tensors per block costs the kernel page faults (system time) on every step.
    work = torch.empty(2, R * min(block, T) * T, dtype=x.dtype)
    for a in range(0, T, block):
        b = min(a + block, T)
        n = b - a
        q = Qs[:, a:b]
        alpha = torch.bmm(q, Kt[:, :, :b], out=work[0, : R * n * b].view(R, n, b))  # scores, (R, n, b)
        alpha[:, :, a:b].masked_fill_(future[:n, :n], float("-inf"))
        # softmax in place: the scores become the attention weights
        alpha.sub_(alpha.amax(-1, keepdim=True)).exp_()
        alpha.div_(alpha.sum(-1, keepdim=True))
        z = torch.bmm(Zvt[:, :, :b], alpha.transpose(1, 2)).transpose(1, 2)  # logits (R, n, C)
        logp = torch.log_softmax(z, -1)
        yb = y[:, a:b]
        loss += -logp.gather(-1, yb[..., None]).squeeze(-1).sum(1) / T
        if stats:
            _add_block_stats(sums, logp, alpha, yb, T)
        if not grads:
            continue
        dz = logp.exp()
        dz.scatter_add_(-1, yb[..., None], torch.full((R, n, 1), -1.0, dtype=x.dtype)).div_(T)  # (p - e_y) / T
        mean = (dz * z).sum(-1, keepdim=True)  # E_alpha[b]_i = u_i . g_i = dz_i . z_i
        # advantage b_ij - E_alpha[b]_i, with b_ij = u_i . v_j = dz_i . Zv_j (R1)
        adv = torch.bmm(torch.cat([dz, -mean], -1), Zvt1[:, :, :b], out=work[1, : R * n * b].view(R, n, b))
        ds = adv.mul_(alpha)  # dL/ds = alpha (b - E_alpha[b]); hidden keys have alpha = 0
        dQt[:, :, a:b] = torch.bmm(Kts[:, :, :b], ds.transpose(1, 2))  # R3, queries
        dKt[:, :, :b] += torch.bmm(q.transpose(1, 2), ds)  # R3, keys (q already carries the scale)
        lhs = torch.cat([dz, torch.ones(R, n, 1, dtype=x.dtype)], -1) if value_info else dz
        Mt[:, :, :b] += torch.bmm(lhs.transpose(1, 2), alpha)  # R2: sum_i alpha_ij dz_i
    st = BlockedStats(loss, *sums) if stats else None
    if not grads:
        return BlockedStep(loss, stats=st)
    return _with_parameter_gradients(BlockedStep(loss, stats=st), x, V, W_O, dQt.transpose(1, 2),
                                     dKt.transpose(1, 2), Mt[:, :C].transpose(1, 2),
                                     Mt[:, C] if value_info else None)


def _with_parameter_gradients(step: BlockedStep, x: Tensor, V: Tensor, W_O: Tensor, dQ: Tensor, dK: Tensor,
                              M: Tensor, N: Tensor | None) -> BlockedStep:
    """``step`` with the four matrices' gradients, from dL/dQ and dL/dK of the queries
    Q = x W_Q and keys K = x W_K (R, T, d_k), M = sum_i alpha_ij dz_i (R, T, C) and, with
    ``value_info``, N (R, T), else None. The PyTorch path and the kernel both end here."""
    dV = M @ W_O.transpose(1, 2)  # dL/dv_j = sum_i alpha_ij u_i = (sum_i alpha_ij dz_i) W_O^T
    xt = x.transpose(1, 2)
    g_all = {"W_Q": torch.bmm(xt, dQ), "W_K": torch.bmm(xt, dK),
             "W_V": torch.bmm(xt, dV), "W_O": torch.bmm(V.transpose(1, 2), M)}
    if N is not None:
        return replace(step, grads=g_all, dV=dV, N=N)
    return replace(step, grads=g_all)


def _add_block_stats(sums: Tensor, logp: Tensor, alpha: Tensor, yb: Tensor, T: int) -> None:
    """Add one block of queries' share of the predictive entropy, the accuracy and the
    attention entropy (each a mean over the T positions) to the running sums (3, R), in place."""
    p = logp.exp()
    sums[0] += -(p * logp).sum((1, 2)) / T
    sums[1] += (logp.argmax(-1) == yb).to(logp.dtype).sum(1) / T
    la = torch.where(alpha > 0, alpha.log(), torch.zeros((), dtype=alpha.dtype))
    sums[2] += -(alpha * la).sum((1, 2)) / T


def _native_step(params, x, y, *, grads, stats, value_info):
    """:func:`blocked_causal_step` through the compiled kernel: the projections and the
    parameter gradients in PyTorch, the O(T^2) part in C, the runs split among torch's
    threads (the kernel runs without the GIL). The kernel reads keys and features as whole vectors: the
    key features are padded with zeros to a power of two, the positions to a multiple of 16."""
    W_Q, W_K, W_V, W_O = (params[n] for n in ("W_Q", "W_K", "W_V", "W_O"))
    R, T, _ = x.shape
    d_k, C = W_Q.shape[-1], W_O.shape[-1]
    lib = causal_head_kernel(d_k, C)
    scale = 1.0 / math.sqrt(d_k)
    KP, TP = 1 << (d_k - 1).bit_length(), -(-T // 16) * 16
    Q, K = torch.zeros(R, T, KP), torch.zeros(R, T, KP)
    Q[..., :d_k] = x @ W_Q * scale
    K[..., :d_k] = x @ W_K
    V = x @ W_V
    Zv = (V @ W_O).contiguous()  # (R, T, C)
    Kt, Zvt = transposed_padded(K[..., :d_k], TP), transposed_padded(Zv, TP)
    yl = y.to(torch.int64).contiguous()
    dQ, dK, M = torch.zeros(R, T, KP), torch.zeros(R, T, KP), torch.zeros(R, T, C)
    N = torch.zeros(R, T) if value_info else None
    sums = torch.zeros(R, 4, dtype=torch.float64)
    work = torch.empty(R, 2 * 8 * TP)  # two blocks of 8 query rows

    def run(a, b):
        for r in range(a, b):
            lib.causal_head_run(T, TP, Q[r].data_ptr(), K[r].data_ptr(), Kt[r].data_ptr(), Zv[r].data_ptr(),
                                Zvt[r].data_ptr(), yl[r].data_ptr(), dQ[r].data_ptr(), dK[r].data_ptr(),
                                M[r].data_ptr(), None if N is None else N[r].data_ptr(), sums[r].data_ptr(),
                                work[r].data_ptr(), int(grads))

    in_threads(run, R)
    per_position = (sums / T).to(x.dtype)
    loss = per_position[:, 0].contiguous()
    st = BlockedStats(loss, per_position[:, 1], per_position[:, 2], per_position[:, 3]) if stats else None
    if not grads:
        return BlockedStep(loss, stats=st)
    return _with_parameter_gradients(BlockedStep(loss, stats=st), x, V, W_O, dQ[..., :d_k] * scale,
                                     dK[..., :d_k], M, N)


def causal_head_loss_fn(x: Tensor, y: Tensor, *, block: int = 64, value_info: bool = False,
                        native: bool | None = None):
    """A loss function for :func:`attention_dynamics.training.train`; with ``value_info``
    the per-position value gradients and responsibilities travel in ``out.info``.
    ``native`` as in :func:`blocked_causal_step`."""

    def loss_fn(p: dict[str, Tensor]) -> StepOutput:
        step = blocked_causal_step(p, x, y, block=block, value_info=value_info, native=native)
        return StepOutput(step.loss, step.grads, {"dV": step.dV, "N": step.N} if value_info else {})

    return loss_fn


def dense_causal_forward(params: dict[str, Tensor], x: Tensor) -> tuple[Tensor, Tensor]:
    """Attention weights (R, T, T) and log-probabilities (R, T, C) of the full model, dense:
    for figures of what attention learned, on modest T."""
    check_tensor("x", x, ndim=3)
    _check(params, x, torch.zeros(x.shape[:2], dtype=torch.long))
    W_Q, W_K, W_V, W_O = (params[n] for n in ("W_Q", "W_K", "W_V", "W_O"))
    T = x.shape[1]
    s = (x @ W_Q) @ (x @ W_K).transpose(1, 2) / math.sqrt(W_Q.shape[-1])
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    alpha = torch.softmax(s, -1)
    return alpha, torch.log_softmax(alpha @ (x @ W_V) @ W_O, -1)


# --- the head of the sticky-chain protocol (R7): its initial weights, its two schedules and
# --- the reference trainer that runs it the way the authors' script does ---------------------

D_K, D_V = 10, 15  # the protocol's head: d_k = 10, d_v = 15
# The protocol's two schedules, as rates by role: SGD at 0.01 on everything; EM-style with the
# values at 0.1 (chapter *The sticky Markov chain*).
PROTOCOL_SCHEDULES = {"SGD": em_style_rates(0.01, 0.01), "EM-style": em_style_rates(0.01, 0.1)}


@dataclass(frozen=True)
class ProtocolBatch:
    """The protocol's runs side by side, one batch: SGD on every seed, then EM-style on the
    same seeds (``names``), each pair from the same initial head (``params``) on its seed's
    training sequence (``sequences``; ``x``, ``y`` repeat them for the two schedules)."""
    names: list[str]
    sequences: StickySequence
    x: Tensor
    y: Tensor
    params: dict[str, Tensor]


def protocol_batch(seeds, seq_len: int) -> ProtocolBatch:
    """The SGD and EM-style runs of the protocol on ``seeds``, as one batch of 2 len(seeds)
    runs (:class:`ProtocolBatch`)."""
    seeds = list(seeds)
    seq = sample_sequences(seeds, seq_len=seq_len)
    return ProtocolBatch(["SGD"] * len(seeds) + ["EM-style"] * len(seeds), seq, torch.cat([seq.x, seq.x]),
                         torch.cat([seq.y, seq.y]), init_heads(seeds + seeds))


def init_heads(seeds, *, std: float = 0.1, d_x: int = D_X, d_k: int = D_K, d_v: int = D_V,
               n_classes: int = N_STATES, dtype=torch.float32) -> dict[str, Tensor]:
    """W_Q, W_K, W_V, W_O ~ N(0, std^2) for each seed, stacked on a leading run axis, drawn
    as the authors' script draws them after ``torch.manual_seed(seed)``: from a generator
    seeded ``seed``, in that order, in float32, each scaled by ``std``; given in ``dtype``
    (so float32 and float64 runs start from the same point)."""
    out = {"W_Q": [], "W_K": [], "W_V": [], "W_O": []}
    std = check_float("std", std, 0.0, None, low_open=True)
    for s in check_int_list("seeds", list(seeds), 0, None):
        g = torch.Generator().manual_seed(s)
        for name, shape in (("W_Q", (d_x, d_k)), ("W_K", (d_x, d_k)), ("W_V", (d_x, d_v)), ("W_O", (d_v, n_classes))):
            out[name].append(torch.randn(*shape, generator=g, dtype=torch.float32) * std)
    return {n: torch.stack(v).to(dtype) for n, v in out.items()}


def protocol_rates(schedules: list[str], dtype=torch.float32) -> dict[str, Tensor]:
    """Per-run learning rates (one entry per run) for ``SGD(...)`` from schedule names
    (keys of :data:`PROTOCOL_SCHEDULES`), by the head's parameter names."""
    for s in schedules:
        if s not in PROTOCOL_SCHEDULES:
            raise ValueError(f"schedule must be one of {list(PROTOCOL_SCHEDULES)}, got {s!r}")
    by_name = [head_rates(PROTOCOL_SCHEDULES[s]) for s in schedules]
    return {n: torch.tensor([r[n] for r in by_name], dtype=dtype) for n in HEAD_ROLES}


def train_reference(seed: int, x: Tensor, y: Tensor, schedule: str, n_steps: int) -> list[float]:
    """The protocol run the way the authors' script runs it, for one seed: autograd through
    the full T x T masked softmax; SGD with ``torch.optim.SGD`` at 0.01 on every matrix;
    EM-style with the script's in-place updates W <- W - lr * dL/dW (0.1 on W_V, 0.01 on
    the rest). Returns the loss before each update and after the last (n_steps + 1 values):
    the script's loss curve followed by its final evaluation. The fast path's reference and
    the benchmark's baseline (chapter *The sticky Markov chain: speed*)."""
    if schedule not in PROTOCOL_SCHEDULES:
        raise ValueError(f"schedule must be one of {list(PROTOCOL_SCHEDULES)}, got {schedule!r}")
    n_steps = check_int("n_steps", n_steps, 0, None)
    w = {n: t[0].clone().requires_grad_(True) for n, t in init_heads([seed], dtype=x.dtype).items()}
    rates = head_rates(PROTOCOL_SCHEDULES[schedule])
    opt = torch.optim.SGD(list(w.values()), lr=rates["W_Q"]) if schedule == "SGD" else None
    T = x.shape[0]
    future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    losses = []
    for step in range(n_steps + 1):
        Q, K, V = x @ w["W_Q"], x @ w["W_K"], x @ w["W_V"]
        S = (Q @ K.T / math.sqrt(Q.shape[-1])).masked_fill(future, float("-inf"))
        logits = (torch.softmax(S, dim=-1) @ V) @ w["W_O"]
        loss = torch.nn.functional.cross_entropy(logits, y)
        losses.append(loss.item())
        if step == n_steps:
            break
        loss.backward()
        with torch.no_grad():
            if opt is not None:
                opt.step()
            else:
                for name in ("W_V", "W_Q", "W_K", "W_O"):
                    w[name] -= rates[name] * w[name].grad
        for t in w.values():
            t.grad = None
    return losses


@dataclass
class ProtocolRun:
    """The sticky-chain protocol, run: one SGD and one EM-style run per seed, batched in
    that order (``names[i]`` is run i's schedule, ``seeds[i % k]`` its seed)."""

    seeds: list[int]
    names: list[str]
    sequences: StickySequence  # one training sequence per seed
    x: Tensor  # (2k, T, d_x): the sequences, once for each schedule
    y: Tensor  # (2k, T)
    params: dict[str, Tensor]  # the final weights of every run
    history: History  # losses (n_steps + 1, 2k) and checkpoints
    seconds: float  # wall time of the training
    provenance: dict  # of the stored run (attention_dynamics.artifacts): where, when, loaded or not


@dataclass(frozen=True)
class ProtocolConfig:
    """The settings of the sticky-chain protocol (R7), validated by name: distinct ``seeds``
    (one training sequence and one initialization each), ``n_steps`` full-batch steps,
    ``seq_len`` states per sequence (seq_len - 1 positions), ``block`` query rows per block of
    the fast path; ``checkpoint_every`` steps between recorded statistics and the first
    ``attention_window`` positions whose attention is kept."""

    seeds: tuple[int, ...] = SEEDS
    n_steps: int = 1000
    seq_len: int = 2000
    block: int = 64
    checkpoint_every: int = 25
    attention_window: int = 40

    def __post_init__(self):
        seeds = check_int_list("seeds", list(self.seeds), 0, 2**31 - 1, min_len=1)
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"seeds must be distinct, got {seeds}")
        object.__setattr__(self, "seeds", tuple(seeds))
        check_int("n_steps", self.n_steps, 1, 1_000_000)
        check_int("seq_len", self.seq_len, 3, 100_000)
        check_int("block", self.block, 1, 4096)
        check_int("checkpoint_every", self.checkpoint_every, 1, self.n_steps)
        check_int("attention_window", self.attention_window, 1, self.seq_len - 1)


def run_protocol(config: ProtocolConfig, *, progress: bool = True) -> ProtocolRun:
    """The protocol of R7 (chapter *The sticky Markov chain*): a training sequence per seed,
    the head initialized per seed, SGD and EM-style from the same start, full-batch closed-form
    steps on the fast path. Every ``checkpoint_every`` steps it records each run's predictive
    entropy, accuracy and mean attention entropy (nats), and at the first and last step the
    attention weights of the first ``attention_window`` positions."""
    import time

    seeds, n_steps, block = list(config.seeds), config.n_steps, config.block
    batch = protocol_batch(seeds, config.seq_len)
    seq, names, x, y, params = batch.sequences, batch.names, batch.x, batch.y, batch.params
    window_x = x[:, :config.attention_window]

    def checkpoint(step, p, out):
        with torch.no_grad():
            st = blocked_causal_step(p, x, y, block=block, grads=False, stats=True).stats
            alpha, _ = dense_causal_forward(p, window_x)
        return {"entropy": st.entropy.clone(), "accuracy": st.accuracy.clone(),
                "attention_entropy": st.attention_entropy.clone(), "alpha": alpha if step in (0, n_steps) else None}

    def make() -> dict:
        start = time.perf_counter()
        hist = train(params, causal_head_loss_fn(x, y, block=block), SGD(protocol_rates(names)), n_steps,
                     callback=checkpoint, every=config.checkpoint_every, progress=progress, desc="protocol")
        return {"loss": torch.as_tensor(hist.loss), "checkpoints": hist.checkpoints, "params": params,
                "seconds": time.perf_counter() - start}

    # the chapters on the protocol share one run: trained once, stored
    settings = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(config).items()}
    saved, prov = load_or_make("sticky-protocol", settings, make, modules=[__name__])
    history = History(saved["loss"].numpy(), [tuple(c) for c in saved["checkpoints"]])
    return ProtocolRun(seeds, names, seq, x, y, saved["params"], history, saved["seconds"], prov)
