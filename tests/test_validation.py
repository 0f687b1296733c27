"""Bad input gets an error that names the argument."""
from __future__ import annotations

import pytest
import torch

from attention_dynamics.checks import check_float, check_int
from attention_dynamics.head import HeadParams, attend, init_head
from attention_dynamics.laws import attention_backward, head_forward, loss_and_gradients
from attention_dynamics.readout import cross_entropy_readout
from attention_dynamics.stats import loglog_slope

F64 = torch.float64


def qkv(T=4, S=4, d=3, dv=2, dtype=F64):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(2, T, d, generator=g, dtype=dtype), torch.randn(2, S, d, generator=g, dtype=dtype),
            torch.randn(2, S, dv, generator=g, dtype=dtype))


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_non_finite_inputs_are_named(which):
    args = dict(zip("qkv", qkv()))
    args[which] = args[which].clone()
    args[which][0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match=rf"^{which} contains NaN"):
        attend(**args)


def test_integer_dtype_rejected():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="^q must have a floating dtype"):
        attend(q.long(), k, v)


def test_mixed_dtypes_rejected():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="k has dtype torch.float32"):
        attend(q, k.float(), v)


def test_shape_mismatches_are_named():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="q and k must share d_k"):
        attend(q, k[..., :2], v)
    with pytest.raises(ValueError, match="k and v must have the same number of keys"):
        attend(q, k, v[:, :3])
    with pytest.raises(ValueError, match="batch shape"):
        attend(q, k[:1], v[:1])
    with pytest.raises(ValueError, match="causal attention needs as many queries as keys"):
        attend(*qkv(T=3, S=4), causal=True)


def test_mask_that_hides_every_key_is_refused():
    q, k, v = qkv()
    km = torch.tensor([[True, True, False, False], [False, False, False, False]])
    with pytest.raises(ValueError, match="key_mask hide every key"):
        attend(q, k, v, key_mask=km)
    left_padded = torch.tensor([[False, True, True, True], [True, True, True, True]])
    with pytest.raises(ValueError, match="causal and key_mask hide every key"):
        attend(q, k, v, causal=True, key_mask=left_padded)


def test_key_mask_type_and_shape():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="key_mask must have dtype torch.bool"):
        attend(q, k, v, key_mask=torch.ones(2, 4))
    with pytest.raises(ValueError, match="key_mask must end in the number of keys"):
        attend(q, k, v, key_mask=torch.ones(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="key_mask has batch shape"):
        attend(q, k, v, key_mask=torch.ones(3, 4, dtype=torch.bool))


def test_upstream_gradient_shape():
    q, k, v = qkv()
    att = attend(q, k, v)
    with pytest.raises(ValueError, match="u must have the shape"):
        attention_backward(att, q, k, v, torch.zeros(2, 4, 3, dtype=F64))


def test_head_params_validated():
    with pytest.raises(ValueError, match="W_K must have shape \\(1, d_m, 2\\)"):
        HeadParams(torch.zeros(1, 3, 2, dtype=F64), torch.zeros(1, 3, 4, dtype=F64),
                   torch.zeros(1, 3, 2, dtype=F64), torch.zeros(2, 5, dtype=F64))
    with pytest.raises(ValueError, match="W_O must have H \\* d_v = 4 rows"):
        HeadParams(*(torch.zeros(2, 3, 2, dtype=F64),) * 3, torch.zeros(3, 5, dtype=F64))
    with pytest.raises(ValueError, match="d_k must be an integer >= 1, got 0"):
        init_head(3, 0, 2, 4)
    p = init_head(3, 2, 2, 4)
    with pytest.raises(ValueError, match="x has width 5 but the head expects d_x = 3"):
        head_forward(p, torch.zeros(1, 4, 5, dtype=F64))
    with pytest.raises(ValueError, match="key_mask must have shape \\(B, S\\)"):
        head_forward(p, torch.zeros(1, 4, 3, dtype=F64), key_mask=torch.ones(1, 5, dtype=torch.bool))


def test_readout_targets_validated():
    g = torch.zeros(2, 3, 4, dtype=F64)
    W = torch.zeros(4, 5, dtype=F64)
    with pytest.raises(ValueError, match=r"y must hold class indices in \[0, 4\]"):
        cross_entropy_readout(g, W, torch.full((2, 3), 5))
    with pytest.raises(ValueError, match="y must have shape"):
        cross_entropy_readout(g, W, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(TypeError, match="y must have an integer dtype"):
        cross_entropy_readout(g, W, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="mask hides every position"):
        cross_entropy_readout(g, W, torch.zeros(2, 3, dtype=torch.long), mask=torch.zeros(2, 3, dtype=torch.bool))


def test_scalar_checks_name_parameter_and_range():
    with pytest.raises(ValueError, match=r"^n_steps must be an integer in \[1, 10\], got 0$"):
        check_int("n_steps", 0, 1, 10)
    with pytest.raises(TypeError, match="n_steps must be an integer"):
        check_int("n_steps", 2.5, 1, 10)
    with pytest.raises(TypeError, match="flag"):
        check_int("flag", True, 0, 1)
    with pytest.raises(ValueError, match=r"^lr must be a finite number in \(0, 1\], got nan$"):
        check_float("lr", float("nan"), 0.0, 1.0, low_open=True)
    with pytest.raises(ValueError, match=r"lr must be a finite number in \(0, 1\]"):
        check_float("lr", 0.0, 0.0, 1.0, low_open=True)
    assert check_float("lr", 1, 0.0, 1.0, low_open=True) == 1.0


def test_loglog_slope_refuses_zeros_and_recovers_a_power():
    x = [1e-3, 1e-2, 1e-1]
    with pytest.raises(ValueError):
        loglog_slope(x, [0.0, 1.0, 2.0])
    slope, _, se = loglog_slope(x, [3 * v**2 for v in x])
    assert slope == pytest.approx(2.0, abs=1e-12) and se < 1e-10


def test_loss_and_gradients_rejects_bad_targets():
    p = init_head(3, 2, 2, 4)
    with pytest.raises(ValueError, match="y must hold class indices"):
        loss_and_gradients(p, torch.zeros(1, 4, 3, dtype=F64), torch.full((1, 4), -1))
