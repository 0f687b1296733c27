"""The profile of benchmarks/sticky_chain_speed.py --profile: how it names the products, and
that its recorder of a step's products sees every one the profiler counts and makes each
again exactly (the ceiling it prints rests on both)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from attention_dynamics.causal_head import blocked_causal_step, init_heads

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("sticky_chain_speed", ROOT / "benchmarks" / "sticky_chain_speed.py")
speed = importlib.util.module_from_spec(spec)
sys.modules["sticky_chain_speed"] = speed  # its dataclasses look their module up
spec.loader.exec_module(speed)

spec = importlib.util.spec_from_file_location("deep_variant_speed", ROOT / "benchmarks" / "deep_variant_speed.py")
deep = importlib.util.module_from_spec(spec)
sys.modules["deep_variant_speed"] = deep  # wind_tunnel_speed imports from it
spec.loader.exec_module(deep)

spec = importlib.util.spec_from_file_location("wind_tunnel_speed", ROOT / "benchmarks" / "wind_tunnel_speed.py")
wind = importlib.util.module_from_spec(spec)
spec.loader.exec_module(wind)

SIZES = dict(block=64, positions=1999, head=(20, 10, 15, 8, 9))


def test_sizes_are_named_by_what_they_are():
    name = lambda d: speed.size_label(d, **SIZES)
    assert [name(d) for d in (20, 10, 8, 9)] == ["20", "10", "8", "9"]
    assert name(64) == "n" and name(1999) == "T" and name(1024) == "b" and name(1984) == "b"
    assert name(1000) == "1000" and name(19990) == "19990"  # not a count of keys a block sees: printed
    assert name(15) == "15"  # the last block's 1999 % 64 = 15 rows are d_v's size: the head's name wins
    assert speed.label_clashes(**SIZES) == [15]
    assert speed.size_label(15, block=64, positions=1999) == "n"  # without the head's sizes: the last block
    assert speed.label_clashes(block=10, positions=2000, head=(20, 10, 15, 8, 9)) == [10]
    assert speed.label_clashes(block=64, positions=2000, head=(20, 10, 15, 8, 9)) == []
    assert speed.product_label([10, 64, 10], [10, 10, 1024], **SIZES) == "(n x 10) @ (10 x b)"
    assert speed.product_label([1999, 20], [20, 10], **SIZES) == "(T x 20) @ (20 x 10)"


def test_operators_are_summed_by_product_shape_and_sorted_longest_first():
    ev = lambda key, shapes, us, count: SimpleNamespace(key=key, input_shapes=shapes, self_cpu_time_total=us,
                                                        count=count)
    events = [ev("aten::bmm", [[10, 64, 10], [10, 10, 512]], 1000.0, 2),
              ev("aten::bmm", [[10, 64, 10], [10, 10, 896], [10, 64, 896]], 3000.0, 1),  # out= as a third
              ev("aten::addmm", [[10], [1999, 20], [20, 10]], 500.0, 1),  # the added term first
              ev("aten::exp_", [[10, 64, 512]], 2500.0, 3)]
    rows = speed.op_times(events, **SIZES)
    assert [(r.name, r.ms, r.calls) for r in rows] == [
        ("bmm (n x 10) @ (10 x b)", 4.0, 3), ("aten::exp_", 2.5, 3), ("addmm (T x 20) @ (20 x 10)", 0.5, 1)]


def _products():
    """A step of products by every way the recorder knows: @ broadcasting a 2-D right-hand
    side, torch.bmm into an out= view, addmm, baddbmm, and bmm of transposed (strided) views."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(3, 50, 7, generator=g), torch.randn(7, 5, generator=g)
    a, b = torch.randn(3, 6, 4, generator=g), torch.randn(3, 4, 50, generator=g)
    work = torch.empty(2, 3 * 6 * 50)
    bias, m1, m2 = torch.randn(5, generator=g), torch.randn(9, 4, generator=g), torch.randn(4, 5, generator=g)
    return lambda: [x @ w, torch.bmm(a, b, out=work[1].view(3, 6, 50)), torch.addmm(bias, m1, m2),
                    torch.baddbmm(torch.ones(3, 6, 50), a, b), torch.bmm(b.transpose(1, 2), a.transpose(1, 2))]


def test_the_recorder_sees_every_product_the_profiler_counts_and_makes_each_again_exactly():
    fn = _products()
    calls = speed.record_products(fn)
    assert [c.name for c in calls] == ["matmul", "bmm", "addmm", "baddbmm", "bmm"]
    flop = [2 * 3 * 50 * 7 * 5, 2 * 3 * 6 * 4 * 50, 2 * 9 * 4 * 5, 2 * 3 * 6 * 4 * 50, 2 * 3 * 50 * 4 * 6]
    assert [round(c.gflop * 1e9) for c in calls] == flop
    assert all(c.step_ms > 0 for c in calls)
    assert calls[4].args[0].stride() == (200, 1, 50)  # a transposed view stays one: the same memory walk
    for c, want in zip(calls, fn()):
        assert torch.equal(c.func(*c.args, **c.kwargs), want)
    assert len(speed.replay_ms(calls, repeats=2)) == len(calls)


def test_a_product_the_recorder_cannot_see_is_named():
    a, b = torch.randn(3, 6, 4), torch.randn(3, 4, 50)
    with pytest.raises(speed.Unrecorded, match="the recorder saw 1 products, the profiler 2"):
        speed.record_products(lambda: [torch.einsum("rik,rkj->rij", a, b), a @ b])  # einsum's bmm


def test_a_product_the_profiler_does_not_count_is_named():
    v, w, a, b = torch.randn(50), torch.randn(50), torch.randn(3, 6, 4), torch.randn(3, 4, 50)
    with pytest.raises(speed.Unrecorded, match=r"product 1 of 2 \(matmul\): the recorder counted 100 FLOP where "
                                               r"the profiler counted 0"):
        speed.record_products(lambda: [v @ w, a @ b])  # a vector product: aten::dot, no product's GFLOP


def _second_run_differs(first, second):
    """A step whose second run (the recorder's) makes other products than its first (the profiler's)."""
    runs = iter([first, second])
    return lambda: next(runs)()


def test_products_that_differ_one_by_one_are_named_where_their_totals_agree():
    a, b, c = torch.randn(3, 6, 4), torch.randn(3, 4, 50), torch.randn(3, 50, 2)
    with pytest.raises(speed.Unrecorded, match="product 1 of 2 is bmm to the recorder, aten::matmul to the profiler"):
        speed.record_products(_second_run_differs(lambda: [a @ b, b @ c], lambda: [torch.bmm(a, b), b @ c]))
    with pytest.raises(speed.Unrecorded, match=r"product 1 of 2 \(matmul\): the recorder counted 2400 FLOP where "
                                               r"the profiler counted 7200"):  # the same 9600 FLOP in all
        speed.record_products(_second_run_differs(lambda: [a @ b, b @ c], lambda: [b @ c, a @ b]))


def test_the_ceiling_takes_the_shorter_time_of_each_product():
    ms, ceiling = speed.products_ceiling(3.0, [1.0, 4.0, 2.0], [2.0, 1.0, 2.0])
    assert ms == 4.0 and ceiling == 750.0  # 3 GFLOP in 4 ms
    with pytest.raises(ValueError):
        speed.products_ceiling(3.0, [1.0], [1.0, 2.0])


def test_a_verdict_is_named_only_where_at_least_two_repeats_agree():
    assert speed.side_of([0.30, 0.35, 0.39], 0.40) == "rule out"
    assert speed.side_of([0.40, 0.45], 0.40) == "do not rule out"
    assert speed.side_of([0.33, 0.43], 0.40) == "do not settle"
    assert speed.side_of([0.30], 0.40) == "do not settle"  # one measurement: nothing agreed with
    assert speed.side_of([], 0.40) == "do not settle"  # every repeat disturbed


def test_a_products_time_includes_the_product_it_calls():
    # matmul dispatches to mm or bmm: its self time is near zero, and the shorter-time rule
    # would take it and make the product look free
    assert speed.event_ms(SimpleNamespace(cpu_time_total=5000.0, self_cpu_time_total=10.0)) == 5.0


def test_the_profile_prints_a_ceiling_only_where_the_recorder_agrees_with_the_profiler(capsys, monkeypatch):
    peaks = [1.0]  # a rate measured before, lower than any matmul here: the profile's own must win
    # a whole step too long for any repeat to be called disturbed: this test's products are timed
    # for real, and a loaded machine must not change what it checks
    monkeypatch.setattr(speed, "whole_step_ms", lambda *a: 1e9)
    result = speed.profile_fast([0], 40, 2, 8, False, repeats=2, peaks=peaks)
    out = capsys.readouterr().out
    assert "repeat 2:" in out and "ceiling, in 2 repeats (2 undisturbed):" in out and "DISTURBED" not in out
    assert "the path itself, its fastest whole step here:" in out
    assert len(peaks) == 3 and result["peaks"] is peaks and result["disturbed"] == []
    assert max(peaks) > 1.0 and result["shares"] == [c / max(peaks) for c in result["ceilings"]]
    assert len(result["shares"]) == 2 and all(x > 0 for x in result["shares"])

    def disagree(fn):
        raise speed.Unrecorded("the recorder saw 1 products, the profiler 2")

    monkeypatch.setattr(speed, "record_products", disagree)
    result = speed.profile_fast([0], 40, 2, 8, False, repeats=2)
    out = capsys.readouterr().out
    assert "the profiler 2: no ceiling" in out and "ceiling, in" not in out and result["shares"] == []


def _timed_products(monkeypatch, step_total_ms, step_ms=10.0):
    """profile_fast with stubbed times: every whole step ``step_ms``, the products in the step
    summing to ``step_total_ms`` and slower on their own (so the step's times are taken)."""
    monkeypatch.setattr(speed, "whole_step_ms", lambda *a: step_ms)
    record = speed.record_products

    def timed(fn):
        calls = record(fn)
        for c in calls:
            c.step_ms = step_total_ms / len(calls)
        return calls

    monkeypatch.setattr(speed, "record_products", timed)
    monkeypatch.setattr(speed, "replay_ms", lambda calls: [1e6 for _ in calls])


@pytest.mark.parametrize("over, disturbed", [(1.01, [1, 2]), (0.99, [])])
def test_products_slower_than_a_whole_step_give_no_ceiling(over, disturbed, capsys, monkeypatch):
    # a step's products cannot take longer than the step: where they did, the machine was busy
    _timed_products(monkeypatch, over * 10.0)
    result = speed.profile_fast([0], 40, 2, 8, False, repeats=2)
    out = capsys.readouterr().out
    assert result["disturbed"] == disturbed and len(result["shares"]) == 2 - len(disturbed)
    assert out.count("DISTURBED: longer than the fastest whole step (10.0 ms)") == len(disturbed)
    if disturbed:
        assert "(0 undisturbed): none" in out and "this run does not settle whether" in out


def test_every_ceiling_is_the_counted_work_over_the_products_time_as_a_share_of_the_highest_peak(
        capsys, monkeypatch):
    _timed_products(monkeypatch, 5.0)
    rates = iter([100.0, 50.0, 50.0])  # the first repeat's is the highest: a share of 50 would be doubled
    monkeypatch.setattr(speed, "matmul_gflops", lambda threads: next(rates))
    result = speed.profile_fast([0], 40, 2, 8, False, repeats=3)
    runs = len(speed.protocol_batch([0], 40).names)
    counted = speed.flop_per_run_step(39, 20, 10, 15, 8) * runs / 1e9  # not the GFLOP the products make
    assert result["ceilings"] == pytest.approx([counted / 0.005] * 3, rel=1e-12)
    assert result["shares"] == pytest.approx([counted / 0.005 / 100.0] * 3, rel=1e-12)
    out = capsys.readouterr().out
    assert f"{100 * counted / 0.010 / 100.0:.1f}% of the peak" in out  # the path's own: 10 ms a step


@pytest.mark.parametrize("chosen", [True, False])
@pytest.mark.parametrize("other", [True, False])
def test_other_path_profiles_the_path_not_chosen_too(chosen, other, capsys, monkeypatch):
    # where the kernel is chosen, --other-path is the one way to see the PyTorch path's ceiling
    profiled = []
    monkeypatch.setattr(speed, "causal_head_kernel", lambda *a: None)  # the kernel "builds"
    monkeypatch.setattr(speed, "chooses", lambda name: chosen)
    monkeypatch.setattr(speed, "choice_reason", lambda name: (chosen, "stubbed"))
    real = speed.time_fast  # both timed on the PyTorch path: no compiler needed
    monkeypatch.setattr(speed, "time_fast", lambda s, L, n, b, native: real(s, L, n, b, False))
    monkeypatch.setattr(speed, "matmul_gflops", lambda threads: 1.0)
    monkeypatch.setattr(speed, "profile_fast", lambda *a, **kw: profiled.append(a[4]))
    monkeypatch.setattr(sys, "argv", ["sticky_chain_speed.py", "--steps", "1", "--seeds", "0", "--seq-len", "12",
                                      "--profile"] + (["--other-path"] if other else []))
    assert speed.main() == 0
    assert profiled == ([chosen, not chosen] if other else [chosen])
    capsys.readouterr()


def _blocked_step(T, block):
    params = init_heads([0, 1])
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(2, T, 20, generator=g), torch.randint(0, 8, (2, T), generator=g)
    return lambda: blocked_causal_step(params, x, y, block=block, native=False)


class _RecordOutputs(speed.RecordProducts):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        n = len(self.calls)
        out = super().__torch_function__(func, types, args, kwargs)
        if len(self.calls) > n:
            self.calls[-1].out = out.clone()
        return out


@pytest.mark.parametrize("T, block", [(37, 8), (64, 64), (50, 7), (12, 1)])
def test_the_recorder_sees_every_product_of_the_pytorch_blocked_step_and_makes_each_again(T, block):
    step = _blocked_step(T, block)
    calls = speed.record_products(step)
    # four products before the blocks (Q, K, V, Zv), six in each block of queries, five after (dV and
    # the four weights' gradients)
    assert len(calls) == 4 + 6 * -(-T // block) + 5 and all(c.step_ms > 0 for c in calls)
    with _RecordOutputs() as rec:
        step()
    eps = torch.finfo(torch.float32).eps / 2  # float32's unit roundoff
    for c in rec.calls:
        again = c.func(*c.args, **c.kwargs)
        a, b = (c.args[1], c.args[2]) if c.name in ("addmm", "baddbmm") else (c.args[0], c.args[1])
        # a sum of k products in another order (another kernel, another alignment) moves by at most
        # about k ulps of the sum of the terms' sizes, twice for the two sums compared
        bound = 2 * a.shape[-1] * eps * (a.abs() @ b.abs())
        assert again.shape == c.out.shape and bool(((again - c.out).abs() <= bound + 1e-30).all()), c.name
    assert all(t > 0 for t in speed.replay_ms(calls, repeats=2))


@pytest.mark.parametrize("T", [1, 12, 37])
def test_the_counted_work_is_the_blocked_steps_products_where_no_pair_is_masked(T):
    # at block 1 each query row sees exactly the keys up to it: the path's products are the count,
    # plus the row of ones its advantage product carries (2 FLOP per pair) and nothing else
    calls = speed.record_products(_blocked_step(T, 1))
    made = sum(c.gflop for c in calls) * 1e9
    counted = 2 * speed.flop_per_run_step(T, 20, 10, 15, 8)  # two runs
    assert made == pytest.approx(counted + 2 * T * (T + 1), rel=1e-12)
    assert speed.flop_per_run_step(1999, 20, 10, 15, 8) == pytest.approx(223.0e6, rel=5e-4)  # the printed 223 MFLOP


_SMALL = dict(n_out=3, dropout=0.0, input="linear", d_in=5)


@pytest.mark.parametrize("T, cfg", [
    (9, dict(_SMALL, d_model=8, n_layers=2, n_heads=2, d_ff=17)),
    (16, dict(_SMALL, d_model=12, n_layers=1, n_heads=3, d_ff=25)),
    (5, dict(_SMALL, d_model=4, n_layers=3, n_heads=1, d_ff=9)),
    (40, "the benchmark's"),  # its own model, at a short sequence: T enters only as T and T (T + 1) / 2
], ids=["small-a", "small-b", "small-c", "benchmark"])
def test_the_deep_variants_counted_work_is_pytorchs_count_with_each_visible_pair_once(T, cfg):
    """deep_variant_speed.flop_parts against PyTorch's flop counter over one step's forward
    and backward passes, attention written as plain products: the same products, except that
    those count every (query, key) pair, the T (T - 1) / 2 masked ones too."""
    from unittest import mock

    from torch.utils.flop_counter import FlopCounterMode

    import attention_dynamics.transformer as tr

    cfg = deep.CFG if cfg == "the benchmark's" else tr.TransformerConfig(**cfg)
    torch.manual_seed(0)
    model = tr.CausalTransformer(cfg)
    x, y = torch.randn(1, T, cfg.d_in), torch.randint(0, cfg.n_out, (1, T))
    with mock.patch.object(tr, "causal_attention", deep.attention_in_plain_products), \
            FlopCounterMode(display=False) as counter:
        torch.nn.functional.cross_entropy(model(x)[0].reshape(-1, cfg.n_out), y.reshape(-1)).backward()
    counts = {str(op): v for op, v in counter.get_flop_counts()["Global"].items()}
    attention = counts.pop("aten.bmm")  # the scores and the read-out, forward and backward
    assert set(counts) == {"aten.addmm", "aten.mm"}, counts
    parts = deep.flop_parts(cfg, T)
    assert parts["attention"] == pytest.approx(attention * (T + 1) / (2 * T), rel=1e-12)
    assert parts["dense"] == pytest.approx(sum(counts.values()), rel=1e-12)
    assert deep.flop_per_seed_step(cfg, T) == sum(parts.values())


@pytest.mark.parametrize("settings", [dict(V=4, L=3, d_model=8, n_layers=2, n_heads=2, batch=3),
                                      dict(V=5, L=5, d_model=12, n_layers=1, n_heads=3, batch=2),
                                      "the benchmark's"], ids=["small-a", "small-b", "the benchmark's"])
def test_the_wind_tunnels_counted_work_is_its_products_with_each_visible_pair_once(settings):
    """wind_tunnel_speed.counted_flop, PyTorch's count over the training loop itself, per
    gradient: the scores and the read-out (2 x 2 d_model FLOP per visible pair per layer and
    sequence) and the linear maps (q, k, v and the output projection, the feed-forward pair,
    the output map at every position; the tokens' embedding is no product), each three times
    over for the backward pass."""
    import dataclasses

    from attention_dynamics.windtunnel import WindTunnelConfig

    cfg = (dataclasses.replace(wind.paper_settings(), n_steps=10) if settings == "the benchmark's"
           else WindTunnelConfig(n_steps=10, **settings))
    B, T, d = cfg.batch, cfg.task.length, cfg.d_model
    parts = wind.counted_flop(cfg)
    layer = 2 * B * T * d * 4 * d + 2 * 2 * B * T * d * 4 * d  # q, k, v, proj; the feed-forward (4 d wide)
    assert parts["attention"] == pytest.approx(3 * cfg.n_layers * 2 * 2 * B * T * (T + 1) / 2 * d, rel=1e-12)
    assert parts["dense"] == pytest.approx(3 * (cfg.n_layers * layer + 2 * B * T * d * cfg.V), rel=1e-12)


_TINY_WIND = dict(V=4, L=3, d_model=8, n_layers=1, n_heads=2, batch=2, n_steps=10)


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "pytorch"])
def test_the_wind_tunnel_benchmark_times_the_path_it_names(compiled):
    """Each of wind_tunnel_speed's timed runs goes through the attention it is printed as,
    whatever the choice for this processor."""
    from unittest import mock

    import torch.nn.functional as F

    import attention_dynamics.transformer as tr
    from attention_dynamics.windtunnel import WindTunnelConfig

    kernel_apply = tr._CompiledCausalAttention.apply
    with mock.patch.object(tr._CompiledCausalAttention, "apply", wraps=kernel_apply) as kernel, \
            mock.patch.object(F, "scaled_dot_product_attention", wraps=F.scaled_dot_product_attention) as fused:
        ms = wind.ms_per_step(WindTunnelConfig(**_TINY_WIND), 10, compiled)
    assert ms > 0
    assert (kernel.call_count > 0, fused.call_count > 0) == (compiled, not compiled)


def test_the_wind_tunnel_profile_shares_every_group_and_add_up_to_the_whole():
    """wind_tunnel_speed.where_the_time_goes: every named group took time (the fused
    attention and AdamW among them: a renamed event would move their time into the rest
    unseen, and the profile refuses it), none is negative, and the shares add up to 1."""
    from attention_dynamics.windtunnel import WindTunnelConfig

    shares, ms = wind.where_the_time_goes(WindTunnelConfig(**_TINY_WIND), 10)
    assert set(shares) == {*wind.GROUPS, "AdamW", "the rest"} and ms > 0
    assert all(v > 0 for v in shares.values()), shares
    assert sum(shares.values()) == pytest.approx(1.0, rel=1e-9)
