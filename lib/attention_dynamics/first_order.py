"""R4 on one head (chapter *Responsibility-weighted values and first-order descent*): the
loss change of a gradient step against its first-order prediction, whose remainder must
shrink as the step's square."""
from __future__ import annotations

import numpy as np
import torch

from .head import HeadParams, merge_heads
from .laws import loss_and_gradients
from .readout import cross_entropy_readout

__all__ = ["first_order_remainders"]


def first_order_remainders(params: HeadParams, x: torch.Tensor, y: torch.Tensor, etas, *, causal: bool = True
                           ) -> dict[str, dict[str, np.ndarray]]:
    """R4 on one head: the loss change of a gradient step of each size in ``etas``, its
    first-order prediction and the remainder r(eta) = change - prediction, for two steps:

    - 'scores and values': s <- s - eta dL/ds, v <- v - eta dL/dv with the closed forms of
      R1 and R2, predicted change -eta (||dL/ds||^2 + ||dL/dv||^2);
    - 'parameters': every weight matrix <- W - eta dL/dW (R1-R3), predicted -eta ||grad||^2.

    Returns {step: {"actual": (n,), "predicted": (n,), "remainder": (n,)}}."""
    etas = np.asarray(etas, dtype=float)
    loss0, grads, state, _, ag = loss_and_gradients(params, x, y, causal=causal)
    L0 = float(loss0)
    sq_sv = float((ag.scores**2).sum() + (ag.v**2).sum())
    sq_w = sum(float((t**2).sum()) for t in grads.values())
    actual = {"scores and values": [], "parameters": []}
    for eta in etas:
        s = state.attention.scores - eta * ag.scores
        g = torch.softmax(s, -1) @ (state.v - eta * ag.v)
        actual["scores and values"].append(float(cross_entropy_readout(merge_heads(g), params.W_O, y).loss) - L0)
        stepped = HeadParams(**{n: t - eta * grads[n] for n, t in params.as_dict().items()})
        actual["parameters"].append(float(loss_and_gradients(stepped, x, y, causal=causal)[0]) - L0)
    out = {}
    for name, sq in (("scores and values", sq_sv), ("parameters", sq_w)):
        a, pred = np.array(actual[name]), -etas * sq
        out[name] = {"actual": a, "predicted": pred, "remainder": a - pred}
    return out
