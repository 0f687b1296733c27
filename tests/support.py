"""Helpers shared by the test modules: a tiny repository with one notebook, and the
commands of an executed chapter's provenance footer."""
from __future__ import annotations

import functools
import os
import shlex
from contextlib import contextmanager
from pathlib import Path

import nbformat

TINY_CELLS = [
    ("code", 'x = 1\noffset = 0\nfail = False\nrecord_path = ""\nprofile = "paper"', ["parameters"]),
    ("code", "from attention_dynamics.book.records import Record\nrec = Record(record_path)", []),
    ("code", "if fail:\n    raise ValueError('x is broken')", []),
    ("code", "rec['double'] = 2 * x + offset\nrec.save()", []),
]
TINY_PROFILES = "tiny:\n  quick: {x: 3}\n  paper: {x: 5}\n"


def loading(cells) -> list:
    """The cells with an import of a library the runner's kernel loads first, after the
    parameters: their kernel is forked from a template (book.templates), where one serves."""
    return [cells[0], ("code", "import numpy", []), *cells[1:]]


def forked_kernels(monkeypatch) -> list:
    """The pids of the kernels forked from a template from now on, in order (a spy)."""
    from attention_dynamics.book import templates

    pids: list = []
    real = templates.fork_kernel

    def spy(*args, **kwargs):
        pids.append(real(*args, **kwargs))
        return pids[-1]

    monkeypatch.setattr(templates, "fork_kernel", spy)
    return pids


def make_root(tmp_path: Path, cells=TINY_CELLS, name: str = "tiny", profiles: str | None = None) -> Path:
    """A repository root holding notebooks/NAME.ipynb and its profiles (quick: x = 3, paper: x = 5)."""
    nb = nbformat.v4.new_notebook()
    for _, src, tags in cells:
        c = nbformat.v4.new_code_cell(src)
        c.metadata["tags"] = tags
        nb.cells.append(c)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    (tmp_path / "notebooks").mkdir()
    nbformat.write(nb, tmp_path / "notebooks" / f"{name}.ipynb")
    text = profiles if profiles is not None else TINY_PROFILES.replace("tiny", name)
    (tmp_path / "notebooks" / "profiles.yml").write_text(text)
    return tmp_path


def footer_commands(notebook: Path) -> tuple[list[str], list[str]]:
    """The runner and papermill commands of an executed notebook's provenance footer, as
    argument lists (shell-split as a shell would)."""
    nb = nbformat.read(notebook, as_version=4)
    (cell,) = [c for c in nb.cells if "provenance" in c.metadata.get("tags", [])]
    blocks = cell.source.split("```bash\n")[1:]
    commands = [shlex.split(b.split("\n```")[0]) for b in blocks]
    (run_cmd,) = [c for c in commands if "attention_dynamics.book" in c]
    (pm_cmd,) = [c for c in commands if c[0].endswith("papermill")]
    return run_cmd, pm_cmd


def papermill_parameters(argv: list[str], monkeypatch) -> dict:
    """The parameters papermill's own command line reads from ``argv`` (nothing executed)."""
    import papermill.cli

    seen: dict = {}
    monkeypatch.setattr(papermill.cli, "execute_notebook", lambda *a, **kw: seen.update(kw["parameters"]))
    papermill.cli.papermill.main(args=argv[1:], standalone_mode=False)
    return seen


# Tolerances of float32 computations, from the arithmetic: one rounding has relative error
# at most U32, and a sum or dot product of n terms computed in any order has error at most
# gamma(n) times the sum of its terms' magnitudes (Higham, Accuracy and Stability of
# Numerical Algorithms, section 3.1): the terms', not the result's, so a sum that cancels to
# zero keeps the error of its terms.
U32 = 2.0 ** -24


def gamma(n: int, u: float = U32) -> float:
    return n * u / (1 - n * u)


def kernel_or_skip(build) -> None:
    """Build a compiled kernel, or skip the test where this machine's compiler cannot build
    C of the kind the kernels are (GNU C11 with vector extensions, our flags): a probe
    program tells a compiler's limits (skip: the PyTorch path serves there) from a fault
    in our sources (fail)."""
    import os
    import shutil
    import subprocess
    import tempfile

    import pytest

    from attention_dynamics import native

    try:
        build()
        return
    except native.NativeUnavailable as e:
        reason = str(e)
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip(f"no C compiler here: the PyTorch path runs instead ({reason})")
    probe = ("typedef float v8 __attribute__((vector_size(32)));\\n"
             "void twice(float *p) { v8 v; __builtin_memcpy(&v, p, sizeof v); v += v; __builtin_memcpy(p, &v, sizeof v); }\\n")
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as f:
            f.write(probe)
        ok = any(subprocess.run([cc, *native.COMMON_FLAGS, *flags, src, "-o", os.path.join(tmp, "probe.so")],
                                capture_output=True).returncode == 0 for flags in native.TARGETS.values())
    if ok:
        raise AssertionError(f"the compiler {cc} builds C of this kind, but not our kernel: {reason}")
    pytest.skip(f"the compiler {cc} cannot build the kernels' kind of C: the PyTorch path runs instead ({reason})")


class _Made:
    def __init__(self, provenance: dict):
        self.provenance = provenance


def make_probe_model(x: int, fail: bool = False) -> _Made:
    """A stored 'model' as a plan task makes it (book.plans.ModelTask): the same key as the
    notebook of :data:`MODEL_CELLS` asks for at parameter ``x``."""
    from attention_dynamics.artifacts import load_or_make

    if fail:
        raise RuntimeError("this model cannot be made")
    return _Made(load_or_make("probe", {"x": x}, lambda: {"x": x}, modules=["attention_dynamics.stats"])[1])


MODEL_CELLS = [
    ("code", 'x = 0\nrecord_path = ""\nprofile = "paper"', ["parameters"]),
    ("code", "from attention_dynamics.artifacts import load_or_make\n"
             "from attention_dynamics.book.records import Record\n"
             "rec = Record(record_path)\n"
             "rec['x'] = load_or_make('probe', {'x': x}, lambda: {'x': x},\n"
             "                        modules=['attention_dynamics.stats'])[0]['x']\n"
             "rec.save()", []),
]


def follow_probe(x: int) -> list:
    """A follow-up (book.plans.FOLLOW_UPS): the next model's settings read from the stored
    first one (x -> 10 x), as the fair comparison's test runs follow from its tuning."""
    import functools

    from attention_dynamics.artifacts import load_or_make
    from attention_dynamics.book.plans import ModelTask

    first = load_or_make("probe", {"x": x}, lambda: {"x": x}, modules=["attention_dynamics.stats"])[0]["x"]
    return [ModelTask(f"probe {10 * first}", functools.partial(make_probe_model, 10 * first))]


FOLLOW_CELLS = [MODEL_CELLS[0], ("code", MODEL_CELLS[1][1].replace(
    "rec.save()", "rec['y'] = load_or_make('probe', {'x': 10 * x}, lambda: {'x': 10 * x},\n"
                  "                        modules=['attention_dynamics.stats'])[0]['x']\nrec.save()"), [])]


@contextmanager
def environ_restored():
    """The process environment as it was on entry, on exit: a LocalCluster's nanny writes its
    pre-spawn variables (MALLOC_TRIM_THRESHOLD_, OMP_NUM_THREADS=1) into the process that
    starts it and leaves them there, for every later kernel to inherit. Only what changed is
    put back, so the rest (PATH, HOME) is never missing meanwhile."""
    before = dict(os.environ)
    try:
        yield
    finally:
        for k in set(os.environ) - set(before):
            del os.environ[k]
        for k, v in before.items():
            if os.environ.get(k) != v:
                os.environ[k] = v


@functools.cache
def proposed_kernels():
    """benchmarks/proposed_kernel.py (kernels proposed as patches, not the library's yet),
    loaded by its path, once per session."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "proposed_kernel.py"
    spec = importlib.util.spec_from_file_location("proposed_kernel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def planted_patches(folder: Path, kernel: str, line: str, bug: str) -> Path:
    """The proposed patches in ``folder`` (created), with the one line ``line`` of the patch
    of ``kernel``'s source (exactly one, so that the bug goes where it is meant to) replaced
    by ``bug``."""
    folder.mkdir(parents=True)
    found = 0
    for f in proposed_kernels().PATCHES.glob("*.patch"):
        text = f.read_text()
        if f"+++ b/{kernel}.c" in text:
            found += text.count(line)
            text = text.replace(line, bug)
        (folder / f.name).write_text(text)
    assert found == 1, f"{line!r} is in the proposed patch of {kernel}.c {found} times"
    return folder
