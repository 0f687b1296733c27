"""benchmarks/rebuild_cost.py against the keys themselves: the chapters it calls stale are
those whose cache key (book.cache.cache_key) moves when a file's code changes, the models
those whose stored key's library digest moves; and its schedule on a case solved by hand."""
from __future__ import annotations

import functools
import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

from attention_dynamics import sources
from attention_dynamics.book.cache import cache_key
from attention_dynamics.book.jobs import RESULTS, make_jobs

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("rebuild_cost", ROOT / "benchmarks" / "rebuild_cost.py")
rc = importlib.util.module_from_spec(spec)
sys.modules["rebuild_cost"] = rc  # its dataclasses look their module up
spec.loader.exec_module(rc)
LIB = ROOT / "lib" / "attention_dynamics"
JOBS = make_jobs(ROOT, "paper")


def _code_changed(monkeypatch, edited: Path) -> None:
    """The keys as if ``edited`` held other code: its bytes as the digests read them gain a
    statement (a Python file, through the digest's reading without prose) or a line (C)."""
    edited = edited.resolve()
    read_code, read_bytes = sources._code_without_prose, Path.read_bytes
    monkeypatch.setattr(sources, "_code_without_prose",
                        lambda p: read_code(p) + (b"probe = 1" if Path(p).resolve() == edited else b""))
    monkeypatch.setattr(Path, "read_bytes",
                        lambda p: read_bytes(p) + (b"\n/* probe */" if p.resolve() == edited else b""))


# Who stored the committed records' models, read from the library by hand: the oracle's own
# map, apart from the script's reading of the load_or_make calls. The wind tunnel's CPU runs
# are stored by windtunnel (devices stores the CUDA runs of the gpu profile, which no paper
# record uses).
STORED_BY = {"cluster_trial": "tuned_trials", "tuning_trial": "tuned_trials", "deep-variant": "deep_variant",
             "primitives": "primitive_models", "sticky-protocol": "causal_head", "windtunnel": "windtunnel",
             "windtunnel_ablation": "windtunnel_ablation", "windtunnel_rates": "windtunnel_rates"}


@functools.cache
def _recorded() -> frozenset[str]:
    return frozenset(m["file"] for j in JOBS for m in rc.recorded_models(
        json.loads((ROOT / RESULTS / f"{j.name}.json").read_text())["provenance"]["models"]))


def _keys() -> tuple[dict[str, str], dict[str, str]]:
    """The chapters' cache keys and the storing modules' library digests, as the runner's and
    the store's own functions compute them."""
    return ({j.name: cache_key(j) for j in JOBS},
            {m: sources.module_digest(sources.module_closure([f"attention_dynamics.{m}"]))
             for m in set(STORED_BY.values())})


_unedited = functools.cache(_keys)


@functools.cache
def _key_moved(edited: Path) -> tuple[frozenset[str], frozenset[str]]:
    """The oracle: the chapters whose cache key and the model kinds whose stored key's
    library digest change when ``edited``'s code does (the runner's and the store's own
    functions, through STORED_BY, not the script's closure test nor its map)."""
    before = _unedited()
    with pytest.MonkeyPatch.context() as m:
        _code_changed(m, edited)
        after = _keys()
    chapters = frozenset(n for n in before[0] if before[0][n] != after[0][n])
    return chapters, frozenset(k for k, m in STORED_BY.items() if before[1][m] != after[1][m])


def test_the_script_finds_who_stores_each_recorded_kind():
    found = rc.storing_modules()
    kinds = {rc.model_kind(f) for f in _recorded()}
    assert kinds == set(STORED_BY)
    assert {k: found[k] for k in kinds} == {k: {f"attention_dynamics.{m}"} | (
        {"attention_dynamics.devices"} if k == "windtunnel" else set()) for k, m in STORED_BY.items()}


@pytest.mark.parametrize("edited", ["native/causal_head.c", "native/vectors.h", "causal_head.py", "windtunnel.py",
                                    "devices.py", "tuned_trials.py", "plotting.py", "book/dispatch.py"])
def test_the_stale_chapters_and_models_are_those_whose_keys_move(edited):
    """Chapters exactly; models: every one whose key moves, and beyond them only models of a
    kind that two modules store (the script cannot tell which stored a file, so it counts
    either: devices.py's edit reaches the wind tunnel's kind, not its CPU runs' keys)."""
    cost = rc.rebuild_cost([LIB / edited], ROOT / RESULTS)
    chapters, kinds = _key_moved(LIB / edited)
    assert {c.name for c in cost.chapters} == chapters
    moved = {f for f in _recorded() if rc.model_kind(f) in kinds}
    assert moved <= set(cost.stale_models)
    shared = {k for k, ms in rc.storing_modules().items() if len(ms) > 1}
    assert {rc.model_kind(f) for f in set(cost.stale_models) - moved} <= shared
    if edited == "devices.py":  # the one over-count, named in the script's docstring
        assert not moved and {rc.model_kind(f) for f in cost.stale_models} == {"windtunnel"}


def test_the_oracle_sees_an_edit_and_a_file_outside_every_key_moves_nothing():
    """Controls of the comparison above: an edit of causal_head.py moves some keys and not
    others (the oracle can tell both), one of the store's plumbing moves none."""
    chapters, kinds = _key_moved(LIB / "causal_head.py")
    assert "sticky_chain" in chapters and "value_law" not in chapters and "sticky-protocol" in kinds
    assert "windtunnel" not in kinds
    assert _key_moved(LIB / "store.py") == (set(), set())


def test_a_notebook_makes_its_chapter_stale_and_nothing_else():
    cost = rc.rebuild_cost([ROOT / "notebooks" / "routing_law.ipynb"], ROOT / RESULTS)
    assert [c.name for c in cost.chapters] == ["routing_law"] and cost.stale_models == {}


def test_what_it_cannot_answer_for_is_refused(tmp_path):
    for given, why in ((LIB / "causal_head.c", "no such file"), (LIB / "native" / "speed.json", "computation paths"),
                       (LIB / "book" / "parameters.yml", "not a library source"),
                       (ROOT / "notebooks" / "profiles.yml", "profiles.yml"),
                       (ROOT / "README.md", "neither a file of")):
        with pytest.raises(ValueError, match=why):
            rc.rebuild_cost([given], ROOT / RESULTS)
    with pytest.raises(ValueError, match="not the name of a stored model"):
        rc.model_kind("deep-variant.pt")
    records = tmp_path / "records"
    shutil.copytree(ROOT / RESULTS, records)
    path = records / "routing_law.json"
    rec = json.loads(path.read_text())
    rec["provenance"]["models"] = [{"file": "nobody-" + "0" * rc.KEY_DIGITS + ".pt", "seconds": 1.0, "loaded": False}]
    path.write_text(json.dumps(rec))
    with pytest.raises(ValueError, match="no library module stores models of kind 'nobody'"):
        rc.rebuild_cost([LIB / "plotting.py"], records)
    package = tmp_path / "attention_dynamics"
    package.mkdir()
    for code, why in (("def f():\n    return load_or_make('odd', {}, f, modules=['x'])\n", "modules are not"),
                      ("def f(k):\n    return load_or_make(k, {}, f, modules=[__name__])\n"
                       "def g(k):\n    return f(k)\n", "not all string constants"),
                      ("K = 'a'\ndef f():\n    return load_or_make(K, {}, f, modules=[__name__])\n", "neither a string")):
        (package / "odd.py").write_text(code)
        with pytest.raises(ValueError, match=why):
            rc.storing_modules.__wrapped__(package)
    (package / "odd.py").write_text("def f(kind):\n    return load_or_make(kind, {}, f, modules=[__name__])\n"
                                    "def g():\n    return f('odd-kind'), 'not-a-kind'\n")
    assert rc.storing_modules.__wrapped__(package) == {"odd-kind": {"attention_dynamics.odd"}}


def test_with_the_records_store_only_stale_models_are_made_again():
    # A uses m (stale, 100 s) and n (kept, 50 s); B uses n and is stale too. From an empty
    # store on 2 workers m and n start together, B after n (50 + 20), A after m (100 + 10);
    # with the store only m is made, then A, and B runs beside it. n is counted once.
    a = rc.book_schedule.Chapter("A", 10.0, {"m": 100.0, "n": 50.0})
    b = rc.book_schedule.Chapter("B", 20.0, {"n": 50.0})
    cost = rc.Cost([a, b], {"m": 100.0}, records=2, models=2, cpus=set())
    assert rc.totals(cost) == (30.0, 130.0, 180.0)
    ((w, keep_wall, keep_bound, empty_wall, empty_bound),) = rc.schedules(cost, [2])
    assert (w, keep_wall, keep_bound, empty_wall, empty_bound) == (2, 110.0, 110.0, 110.0, 110.0)
    ((_, keep_wall, _, empty_wall, empty_bound),) = rc.schedules(cost, [1])
    assert keep_wall == 130.0 and empty_wall == 180.0 == empty_bound
    none = rc.Cost([], {}, records=2, models=2, cpus=set())
    assert rc.schedules(none, [2]) == [(2, 0.0, 0.0, 0.0, 0.0)] and rc.totals(none) == (0.0, 0.0, 0.0)
