"""Bad input gets an error that names the argument."""
from __future__ import annotations

import pytest
import torch

from attention_dynamics.validation import check_float, check_int
from attention_dynamics.head import HeadParams, attend, init_head
from attention_dynamics.head import head_forward
from attention_dynamics.laws import attention_backward, loss_and_gradients
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
    with pytest.raises(TypeError, match="^q must have dtype float32 or float64, got torch.int64"):
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


# --- faults inside computations, edge shapes and the public functions probed one by one ---

def _tiny_head_problem(dtype=F64):
    g = torch.Generator().manual_seed(0)
    params = init_head(5, 3, 3, 4, generator=g, dtype=dtype)
    x = torch.randn(1, 6, 5, generator=g, dtype=dtype)
    y = torch.randint(0, 4, (1, 6), generator=g)
    return params, x, y


def test_divergence_without_max_loss_stops_with_step_and_cause():
    from attention_dynamics.training import SGD, StepOutput, TrainingDiverged, train

    params, x, y = _tiny_head_problem()

    def loss_fn(p):
        loss, grads, *_ = loss_and_gradients(HeadParams(**p), x, y, causal=True)
        return StepOutput(loss, grads)

    with pytest.raises(TrainingDiverged, match=r"^training diverged at step [1-9]\d*: ") as e:
        train(params.as_dict(), loss_fn, SGD(1e6), 200)
    assert e.value.step > 0 and ("overflow" in e.value.cause or "non-finite" in e.value.cause)


def test_bad_input_at_step_zero_is_not_called_divergence():
    from attention_dynamics.validation import NonFiniteError
    from attention_dynamics.training import SGD, StepOutput, train

    params, x, y = _tiny_head_problem()
    x = x.clone()
    x[0, 0, 0] = float("nan")

    def loss_fn(p):
        loss, grads, *_ = loss_and_gradients(HeadParams(**p), x, y, causal=True)
        return StepOutput(loss, grads)

    with pytest.raises(NonFiniteError, match="^x contains NaN"):
        train(params.as_dict(), loss_fn, SGD(0.1), 5)


def test_a_loss_function_must_return_a_step_output():
    from attention_dynamics.training import SGD, train

    with pytest.raises(TypeError, match="loss_fn must return a StepOutput, got NoneType"):
        train({}, lambda p: None, SGD(0.1), 3)


def test_finite_inputs_that_overflow_the_scores_raise_a_named_error():
    from attention_dynamics.validation import NonFiniteError

    q, k, v = qkv(dtype=torch.float32)
    with pytest.raises(NonFiniteError, match="attention scores overflow torch.float32"):
        attend(q * 1e20, k * 1e20, v)
    attend(q.double() * 1e20, k.double() * 1e20, v.double())  # float64 holds them


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_is_refused_as_the_message_says(dtype):
    q, k, v = qkv()
    with pytest.raises(TypeError, match=rf"^q must have dtype float32 or float64, got {dtype}"):
        attend(q.to(dtype), k.to(dtype), v.to(dtype))


@pytest.mark.parametrize("shapes, message", [
    (((2, 0, 3), (2, 4, 3), (2, 4, 2)), "q has no queries"),
    (((2, 4, 3), (2, 0, 3), (2, 0, 2)), "k has no keys .* each query needs at least one visible key"),
    (((0, 4, 3), (0, 4, 3), (0, 4, 2)), "q must have no empty dimension"),
    (((2, 4, 0), (2, 4, 0), (2, 4, 2)), "q must have no empty dimension"),
])
def test_empty_shapes_are_refused_by_name(shapes, message):
    q, k, v = (torch.zeros(s, dtype=F64) for s in shapes)
    with pytest.raises(ValueError, match=message):
        attend(q, k, v)


@pytest.mark.parametrize("x_shape, message", [((1, 0, 5), "x must have no empty dimension"),
                                              ((0, 6, 5), "x must have no empty dimension")])
def test_empty_batches_and_sequences_in_the_loss(x_shape, message):
    params, _, _ = _tiny_head_problem()
    with pytest.raises(ValueError, match=message):
        loss_and_gradients(params, torch.zeros(x_shape, dtype=F64), torch.zeros(x_shape[:2], dtype=torch.long))
    with pytest.raises(ValueError, match="y has no positions"):
        cross_entropy_readout(torch.zeros(1, 0, 3, dtype=F64), torch.zeros(3, 4, dtype=F64),
                              torch.zeros(1, 0, dtype=torch.long))


def test_zero_width_heads_are_refused():
    with pytest.raises(ValueError, match="d_k must be an integer >= 1, got 0"):
        init_head(3, 0, 2, 2)
    with pytest.raises(ValueError, match="W_Q must have no empty dimension"):
        HeadParams(torch.zeros(1, 3, 0, dtype=F64), torch.zeros(1, 3, 0, dtype=F64), torch.zeros(1, 3, 2, dtype=F64),
                   torch.zeros(2, 2, dtype=F64))


def _probe_cases():
    from attention_dynamics import causal_head, em, geometry, specialization, stats
    from attention_dynamics.head import merge_heads, project, split_heads
    from attention_dynamics.tasks import bijection as bj
    from attention_dynamics.tasks import sticky_chain as sc
    from attention_dynamics.transformer import CausalTransformer, TransformerConfig

    x2, mu = torch.randn(10, 2, dtype=F64), torch.randn(3, 2, dtype=F64)
    lin = CausalTransformer(TransformerConfig(n_out=3, d_in=4))
    w1 = causal_head.init_heads([1])
    return [
        (lambda: project(torch.randn(2, 3, dtype=F64), torch.randn(1, 3, 2, dtype=F64)), ValueError, "x must have 3 dimensions"),
        (lambda: project(torch.randn(2, 4, 3, dtype=F64), torch.randn(1, 2, 2, dtype=F64)), ValueError, "x has width 3 but W reads width 2"),
        (lambda: merge_heads(torch.randn(2, 3, dtype=F64)), ValueError, "g must have 4 dimensions"),
        (lambda: split_heads(torch.randn(2, 3, 5, dtype=F64), 2), ValueError, "not a multiple of heads = 2"),
        (lambda: init_head(3, 2, 2, 2, dtype=torch.int64), TypeError, "dtype must be torch.float32 or torch.float64"),
        (lambda: em.em_step(x2, mu[:0], 1.0), ValueError, "means must have no empty dimension"),
        (lambda: em.head_value_step(torch.rand(10, 4, dtype=F64), mu, x2), ValueError, "alpha has 4 columns"),
        (lambda: em.squared_error_value_gradient(torch.rand(10, 3, dtype=F64), mu, x2[:5]), ValueError, "targets must have shape"),
        (lambda: specialization.cluster_usage(torch.rand(10, 3, dtype=F64), torch.arange(10) % 3, 2), ValueError, "cluster must hold indices in \\[0, 1\\]"),
        (lambda: specialization.advantage_sign_agreement(torch.rand(4, 3, dtype=F64), torch.rand(4, 2, dtype=F64),
                                                         torch.rand(4, 3, dtype=F64)), ValueError, "b_t must have the shape of alpha_t"),
        (lambda: stats.mean_std([]), ValueError, "mean_std needs at least one value"),
        (lambda: geometry.pc_shares(torch.randn(1, 3, dtype=F64), 1), ValueError, "at least two rows"),
        (lambda: geometry.pc_shares(torch.randn(5, 3, dtype=F64), 10), ValueError, "k must be an integer in \\[1, 3\\]"),
        (lambda: geometry.spearman([1, 2, 3], [1, 2]), ValueError, "spearman needs two 1-D sequences of the same length"),
        (lambda: geometry.calibration_errors(torch.randn(2, 3, 4, dtype=F64), torch.zeros(2, dtype=F64)), ValueError,
         "bayes_bits must give one entropy per position"),
        (lambda: sc.sample_sequences([]), TypeError, "seeds must be a list of at least 1 integers"),
        (lambda: causal_head.init_heads([]), TypeError, "seeds must be a list of at least 1 integers"),
        (lambda: sc.forward_filter(torch.randn(5, 3, dtype=F64), sc.transition_matrix(), sc.symbol_means()), ValueError,
         "x has width 3 but the symbol means have width 20"),
        (lambda: sc.forward_filter(torch.randn(0, 20, dtype=F64), sc.transition_matrix(), sc.symbol_means()), ValueError,
         "x must have no empty dimension"),
        (lambda: sc.cross_entropy_of(torch.randn(5, 8, dtype=F64), torch.zeros(4, dtype=torch.long)), ValueError, "y must have shape \\(5,\\)"),
        (lambda: causal_head.train_reference(0, torch.randn(5, 20), torch.zeros(5, dtype=torch.long), "SGD", -1), ValueError, "n_steps must be an integer >= 0"),
        (lambda: bj.posterior(torch.zeros(2, 3, dtype=torch.long), bj.WindTunnel(4, 3)), ValueError, "tokens must have 7 columns"),
        (lambda: bj.sample_batch(bj.WindTunnel(4, 3), 2, None), TypeError, "generator must be a torch.Generator"),
        (lambda: causal_head.blocked_causal_step(w1, torch.randn(1, 5, 20), torch.full((1, 5), 9, dtype=torch.long)), ValueError,
         "y must hold class indices in \\[0, 7\\]"),
        (lambda: causal_head.blocked_causal_step(w1, torch.randn(1, 0, 20), torch.zeros(1, 0, dtype=torch.long)), ValueError,
         "x must have no empty dimension"),
        (lambda: causal_head.dense_causal_forward(w1, torch.randn(5, 20)), ValueError, "x must have 3 dimensions"),
        (lambda: lin(torch.randn(1, 3, 4, dtype=F64)), TypeError, "x has dtype torch.float64 but the model's weights are torch.float32"),
        (lambda: lin(torch.full((1, 3, 4), float("nan"))), ValueError, "x contains NaN"),
        (lambda: lin(torch.randn(1, 0, 4)), ValueError, "x must have no empty dimension"),
    ]


@pytest.mark.parametrize("case", range(len(_probe_cases())))
def test_public_functions_name_what_is_wrong(case):
    fn, exc, message = _probe_cases()[case]
    with pytest.raises(exc, match=message):
        fn()
