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
    with pytest.raises(speed.Unrecorded, match="GFLOP of products where the profiler counted"):
        speed.record_products(lambda: [v @ w, a @ b])  # a vector product: aten::dot, no product's GFLOP


def test_the_ceiling_takes_the_shorter_time_of_each_product():
    ms, ceiling = speed.products_ceiling(3.0, [1.0, 4.0, 2.0], [2.0, 1.0, 2.0])
    assert ms == 4.0 and ceiling == 750.0  # 3 GFLOP in 4 ms
    with pytest.raises(ValueError):
        speed.products_ceiling(3.0, [1.0], [1.0, 2.0])


def test_a_side_of_the_target_is_named_only_where_every_repeat_agrees():
    assert speed.side_of([0.30, 0.35, 0.39], 0.40) == "below"
    assert speed.side_of([0.40, 0.45], 0.40) == "at or above"
    assert speed.side_of([0.33, 0.43], 0.40) == "on both sides of"


def test_the_profile_prints_a_ceiling_only_where_the_recorder_agrees_with_the_profiler(capsys, monkeypatch):
    speed.profile_fast([0], 40, 2, 8, False, repeats=2)
    out = capsys.readouterr().out
    assert "repeat 2:" in out and "ceiling, in 2 repeats:" in out and "of the matmul peak" in out

    def disagree(fn):
        raise speed.Unrecorded("the recorder saw 1 products, the profiler 2, in another order")

    monkeypatch.setattr(speed, "record_products", disagree)
    speed.profile_fast([0], 40, 2, 8, False, repeats=2)
    out = capsys.readouterr().out
    assert "in another order: no ceiling" in out and "ceiling, in" not in out


@pytest.mark.parametrize("T, block", [(37, 8), (64, 64), (50, 7)])
def test_the_recorder_sees_every_product_of_the_pytorch_blocked_step(T, block):
    params = init_heads([0, 1])
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(2, T, 20, generator=g), torch.randint(0, 8, (2, T), generator=g)
    calls = speed.record_products(lambda: blocked_causal_step(params, x, y, block=block, native=False))
    assert len(calls) > 6 * (T // block) and all(c.step_ms > 0 for c in calls)
