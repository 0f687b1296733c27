"""The compiled kernels as citizens of a process: they leave the floating-point mode alone
(subnormals survive loading every one of them, in the loading thread and in the kernels'
worker threads), they carry NaN and overflow to the same errors as the PyTorch paths, a
compiler that rejects -march=native gets a portable build, and the choice between each
kernel and its PyTorch path follows the committed measurements."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap

import pytest
import torch

import attention_dynamics.native as native

HAS_CC = bool(os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc"))
needs_cc = pytest.mark.skipif(not HAS_CC, reason="no C compiler here: the PyTorch paths run instead")

# Run in a fresh interpreter: a library linked with -ffast-math sets the mode at load, for
# good, so a check in this (already used) process could be masked or polluted.
SUBNORMAL_PROBE = textwrap.dedent("""
    import json, sys, threading
    import numpy as np, torch
    import attention_dynamics.native as native
    from attention_dynamics.native import causal_attention_kernel, causal_head_kernel, in_threads, selective_scan_kernel

    def survives():
        # x * 1.0 of a subnormal is the subnormal itself unless flush-to-zero or
        # denormals-are-zero is on in this thread
        return {"numpy float64": bool(np.float64(1e-310) * np.float64(1.0) != 0.0),
                "numpy float32": bool(np.float32(1e-40) * np.float32(1.0) != 0.0),
                "torch float64": bool(float(torch.tensor([1e-310], dtype=torch.float64) * 1.0) != 0.0),
                "torch float32": bool(float(torch.tensor([1e-40]) * 1.0) != 0.0)}

    out = {"before": survives()}
    causal_attention_kernel(16); causal_head_kernel(10, 8); selective_scan_kernel(8)
    out["after loading, this thread"] = survives()
    torch.set_num_threads(2)
    seen, both = {}, threading.Barrier(2, timeout=60)  # each slice held until both threads have one
    def work(a, b):
        both.wait()
        seen[threading.current_thread().name] = survives()
    in_threads(work, 2)
    out["after loading, the kernels' worker threads"] = seen
    out["new thread"] = {}
    t = threading.Thread(target=lambda: out["new thread"].update(survives())); t.start(); t.join()
    print(json.dumps(out))
""")


@needs_cc
def test_subnormals_survive_loading_every_kernel(tmp_path):
    """The kernels are linked without -ffast-math: on GCC before 13 it links crtfastmath.o,
    which turns on flush-to-zero and denormals-are-zero for the whole process at load (with
    the old flags every 'after' entry here was False)."""
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))  # a fresh build of this checkout's flags
    done = subprocess.run([sys.executable, "-c", SUBNORMAL_PROBE], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert all(out["before"].values()), out["before"]  # the probe itself can say yes
    assert all(out["after loading, this thread"].values()), out
    workers = out["after loading, the kernels' worker threads"]
    assert len(workers) == 2 and all(all(v.values()) for v in workers.values()), workers
    assert all(out["new thread"].values()), out


def test_the_flags_hold_nothing_that_changes_the_floating_point_mode_or_drops_nan():
    flags = set(native.COMMON_FLAGS) | {f for t in native.TARGETS.values() for f in t}
    assert not flags & {"-ffast-math", "-Ofast", "-funsafe-math-optimizations", "-ffinite-math-only"}


def test_the_subnormal_probe_can_say_no(tmp_path):
    """Negative control: a library linked with -ffast-math (GCC < 13, as here) flushes
    subnormals in the process that loads it, and the probe sees it."""
    cc = shutil.which("gcc")
    if cc is None:
        pytest.skip("no gcc")
    version = subprocess.run([cc, "-dumpversion"], capture_output=True, text=True).stdout.strip()
    if not version or int(version.split(".")[0]) >= 13:
        pytest.skip(f"gcc {version} no longer links crtfastmath.o into shared libraries")
    src = tmp_path / "empty.c"
    src.write_text("int nothing(void) { return 0; }\n")
    lib = tmp_path / "libfast.so"
    subprocess.run([cc, "-O2", "-ffast-math", "-shared", "-fPIC", str(src), "-o", str(lib)], check=True)
    probe = (f"import ctypes, numpy as np; ctypes.CDLL({str(lib)!r}); "
             "print(np.float64(1e-310) * np.float64(1.0) != 0.0)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def _outcome(fn) -> tuple[str, str]:
    try:
        fn()
    except Exception as e:  # the type and the cause, without the numbers that differ in the last digits
        return type(e).__name__, str(e).split(" (")[0].split(":")[0]
    return "no error", ""


def _both_ways(monkeypatch, fn) -> tuple[tuple[str, str], tuple[str, str]]:
    monkeypatch.setenv("ATTENTION_DYNAMICS_NATIVE", "1")
    kernel = _outcome(fn)
    monkeypatch.setenv("ATTENTION_DYNAMICS_NATIVE", "0")
    return kernel, _outcome(fn)


def _transformer_training(poison: str):
    from attention_dynamics.transformer import CausalTransformer, TransformerConfig, fit

    torch.manual_seed(0)
    model = CausalTransformer(TransformerConfig(n_out=5, d_model=32, n_layers=1, n_heads=2, input="tokens", vocab=5,
                                                max_len=12))
    with torch.no_grad():
        if poison == "nan":
            model.blocks[0].k.weight[0, 0] = float("nan")
        else:  # scores beyond float32's range
            model.blocks[0].q.weight.mul_(1e30)
            model.blocks[0].k.weight.mul_(1e30)
    g = torch.Generator().manual_seed(1)
    batches = lambda: (torch.randint(0, 5, (4, 12), generator=g), torch.randint(0, 5, (4, 12), generator=g))
    return lambda: fit(model, batches, 3, lr=1e-3)


def _head_training(poison: str):
    from attention_dynamics.causal_head import causal_head_loss_fn, init_heads
    from attention_dynamics.tasks import sticky_chain as sc
    from attention_dynamics.training import SGD, train

    seq = sc.sample_sequences([3, 4], seq_len=40)
    p = init_heads([3, 4])
    if poison == "nan":
        p["W_K"][1, 0, 0] = float("nan")
    else:
        p["W_Q"] *= 1e30
        p["W_K"] *= 1e30
    return lambda: train(p, causal_head_loss_fn(seq.x, seq.y), SGD(0.01), 3)


def _ssm_training(poison: str):
    from attention_dynamics.ssm import SSMConfig, SSMModel
    from attention_dynamics.transformer import fit

    torch.manual_seed(0)
    model = SSMModel(SSMConfig(n_out=5, d_model=16, n_layers=1, input="tokens", vocab=5))
    with torch.no_grad():
        scan_inputs = model.blocks[0].x_proj.weight  # delta, B and C of the scan
        if poison == "nan":
            scan_inputs[0, 0] = float("nan")
        else:
            scan_inputs.mul_(1e30)
    g = torch.Generator().manual_seed(1)
    batches = lambda: (torch.randint(0, 5, (4, 12), generator=g), torch.randint(0, 5, (4, 12), generator=g))
    return lambda: fit(model, batches, 3, lr=1e-3)


@needs_cc
@pytest.mark.parametrize("make", [_transformer_training, _head_training, _ssm_training],
                         ids=["causal_attention", "causal_head", "selective_scan"])
@pytest.mark.parametrize("poison", ["nan", "overflow"])
def test_nan_and_overflow_end_in_the_same_error_through_a_kernel_as_through_pytorch(monkeypatch, make, poison):
    kernel, torch_path = _both_ways(monkeypatch, make(poison))
    assert torch_path[0] in ("TrainingDiverged", "NonFiniteError"), torch_path  # the reference stops
    assert kernel == torch_path


@needs_cc
@pytest.mark.parametrize("where", [(0, 1, 5, 3), (1, 0, 0, 7)])
def test_a_nan_reaches_the_same_outputs_through_the_attention_kernel(where):
    from attention_dynamics.transformer import causal_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 19, 16, generator=g) for _ in range(3))
    k[where] = float("nan")
    a, b = causal_attention(q, k, v, compiled=True), causal_attention(q, k, v, compiled=False)
    assert torch.equal(torch.isfinite(a), torch.isfinite(b)) and not torch.isfinite(a).all()


def _rejecting_compiler(tmp_path, reject: str) -> str:
    real = shutil.which("gcc") or shutil.which("cc")
    script = tmp_path / "cc"
    script.write_text(f"#!/bin/sh\nfor a in \"$@\"; do\n  case \"$a\" in {reject}) echo \"error: unrecognized "
                      f"command-line option '$a'\" >&2; exit 1;; esac\ndone\nexec {real} \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


@pytest.fixture
def fresh_kernels(monkeypatch, tmp_path):
    """No kernel loaded yet and an empty build cache, for this test only."""
    monkeypatch.setattr(native, "_loaded", {})
    monkeypatch.setattr(native, "_targets", {})
    monkeypatch.setattr(native, "_taken", {})
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path


@needs_cc
def test_a_compiler_that_rejects_march_native_gets_a_portable_build(monkeypatch, fresh_kernels):
    from attention_dynamics.transformer import causal_attention

    monkeypatch.setenv("CC", _rejecting_compiler(fresh_kernels, "-march=native"))
    monkeypatch.setenv("ATTENTION_DYNAMICS_NATIVE", "1")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 9, 8, generator=g) for _ in range(3))
    torch.testing.assert_close(causal_attention(q, k, v), causal_attention(q, k, v, compiled=False))
    assert native.paths_taken() == {"causal_attention": "kernel (portable)"}


@needs_cc
def test_a_compiler_that_builds_nothing_leaves_the_pytorch_path(monkeypatch, fresh_kernels):
    from attention_dynamics.transformer import causal_attention

    monkeypatch.setenv("CC", _rejecting_compiler(fresh_kernels, "-O3"))
    monkeypatch.setenv("ATTENTION_DYNAMICS_NATIVE", "1")
    q = torch.randn(1, 2, 9, 8)
    with pytest.raises(native.NativeUnavailable, match=r"failed to build causal_attention.c \(native: .*; portable: "):
        causal_attention(q, q, q, compiled=True)
    torch.testing.assert_close(causal_attention(q, q, q), causal_attention(q, q, q, compiled=False))
    assert native.paths_taken() == {"causal_attention": "torch"}


def test_the_choice_follows_the_measurements(monkeypatch, tmp_path):
    table = {"causal_attention": {"A": {"ratio": 1.5}, "B": {"ratio": 0.8}},
             "causal_head": {"A": {"ratio": 1.3}, "B": {"ratio": 1.2}},
             "selective_scan": {"A": {"ratio": 1.05}}}
    path = tmp_path / "speed.json"
    path.write_text(json.dumps(table))
    monkeypatch.setattr(native, "SPEED_FILE", path)
    monkeypatch.delenv("ATTENTION_DYNAMICS_NATIVE", raising=False)
    assert native.choice_reason("causal_attention", "A")[0] is True  # measured faster here
    assert native.choice_reason("causal_attention", "B")[0] is False  # measured slower here
    assert native.choice_reason("causal_attention", "C")[0] is False  # unmeasured; lost somewhere
    assert native.choice_reason("causal_head", "C")[0] is True  # unmeasured; won everywhere measured
    assert native.choice_reason("selective_scan", "A")[0] is False  # faster, but within the margin
    monkeypatch.setenv("ATTENTION_DYNAMICS_NATIVE", "1")
    assert native.choice_reason("causal_attention", "B")[0] is True
    monkeypatch.setenv("ATTENTION_DYNAMICS_NATIVE", "0")
    assert native.choice_reason("causal_head", "A")[0] is False
    assert native.planned_paths() == dict.fromkeys(native.KERNELS, "torch")
    monkeypatch.setenv("ATTENTION_DYNAMICS_NATIVE", "yes")
    with pytest.raises(ValueError, match="ATTENTION_DYNAMICS_NATIVE must be 0 .* or unset"):
        native.chooses("causal_head")
    with pytest.raises(ValueError, match="name must be one of causal_head, causal_attention, selective_scan"):
        native.choice_reason("attention")


def test_the_committed_measurements_name_this_libraries_kernels():
    table = native.measurements()
    assert set(table) == set(native.KERNELS)
    for name, per_processor in table.items():
        for processor, m in per_processor.items():
            assert m["ratio"] > 0 and m["cpu"] and m["command"], (name, processor)


@needs_cc
def test_records_and_artifacts_say_which_path_ran(monkeypatch, fresh_kernels):
    """The default path is noted (explicit requests are the caller's, not the machine's)
    and lands in a record; the artifact key changes with the planned paths."""
    from attention_dynamics.book.records import Record
    from attention_dynamics.transformer import causal_attention

    q = torch.randn(1, 2, 9, 8)
    monkeypatch.setenv("ATTENTION_DYNAMICS_NATIVE", "0")
    causal_attention(q, q, q)
    monkeypatch.setenv("ATTENTION_DYNAMICS_NATIVE", "1")
    causal_attention(q, q, q, compiled=True)  # explicit: not noted
    rec = Record(fresh_kernels / "r.json")
    rec.save()
    assert json.loads((fresh_kernels / "r.json").read_text())["paths"] == {"causal_attention": "torch"}
    causal_attention(q, q, q)
    assert native.paths_taken()["causal_attention"] == "mixed"


@needs_cc
def test_an_artifact_made_through_one_path_is_not_loaded_for_the_other(monkeypatch, tmp_path):
    from attention_dynamics.artifacts import load_or_make

    monkeypatch.setenv("ATTENTION_DYNAMICS_ARTIFACTS", str(tmp_path))
    made = []

    def make():
        made.append(1)
        return {"w": torch.zeros(2)}

    def get():
        return load_or_make("probe", {"size": 2}, make, modules=["attention_dynamics.artifacts"])[1]

    monkeypatch.setenv("ATTENTION_DYNAMICS_NATIVE", "0")
    first, again = get(), get()
    monkeypatch.setenv("ATTENTION_DYNAMICS_NATIVE", "1")
    other = get()
    assert len(made) == 2 and again["loaded"] and not other["loaded"] and first["key"] != other["key"]
    assert first["paths"] == dict.fromkeys(native.KERNELS, "torch")


@needs_cc
def test_an_artifact_made_through_an_unplanned_path_is_not_stored(monkeypatch, fresh_kernels):
    """A kernel planned but not built (here a compiler that builds nothing) leaves the run
    to PyTorch: the result is returned but not stored under the kernel's key."""
    from attention_dynamics.artifacts import load_or_make
    from attention_dynamics.transformer import causal_attention

    monkeypatch.setenv("ATTENTION_DYNAMICS_ARTIFACTS", str(fresh_kernels / "store"))
    monkeypatch.setenv("CC", _rejecting_compiler(fresh_kernels, "-O3"))
    monkeypatch.setenv("ATTENTION_DYNAMICS_NATIVE", "1")
    q = torch.randn(1, 2, 9, 8)
    payload, prov = load_or_make("probe", {"n": 1}, lambda: {"o": causal_attention(q, q, q)},
                           modules=["attention_dynamics.artifacts"])
    assert prov["paths"]["causal_attention"] == "kernel" and prov["paths_taken"] == {"causal_attention": "torch"}
    assert prov["path"] is None and not list((fresh_kernels / "store").glob("probe-*.pt"))
    assert native.paths_taken() == {"causal_attention": "torch"}  # the process still knows


def test_a_compiler_named_in_cc_that_is_not_there_counts_as_none(monkeypatch, fresh_kernels):
    monkeypatch.setenv("CC", str(fresh_kernels / "no-such-cc"))
    monkeypatch.setenv("ATTENTION_DYNAMICS_NATIVE", "1")
    assert native.planned_paths() == dict.fromkeys(native.KERNELS, "torch")
    with pytest.raises(native.NativeUnavailable, match=r"\$CC = .*no-such-cc.* is not a program here"):
        native.causal_attention_kernel(8)
