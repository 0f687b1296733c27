"""Each chapter's parameters, declared once with their ranges (``parameters.yml`` beside
this module, so that a notebook opened with the library installed from a wheel finds them),
and checked from that declaration: by the notebook when it runs (:func:`check_declared`,
in place on its namespace) and by the runner before it starts a chapter
(:func:`check_values`, on a profile or ``--set``), with messages that name the parameter and
its allowed range.

A declaration is a mapping with ``type`` (``int``, ``float``, ``ints``, ``floats``,
``choice``, ``settings``: a mapping of a config's settings, which the config checks),
optionally ``min`` and ``max`` (a number; or the name of a parameter declared before it; or
the name of a quantity the notebook sets before it calls :func:`check_declared`, such as the
wind tunnel's ``n_steps`` read from its settings, which only the notebook can apply: the
runner, which does not run the notebook, leaves such a bound open; tests/test_parameters.py
checks that every named bound is one of the two),
``open`` (``low``, ``high`` or ``both``: which bounds are excluded), ``min_len`` (lists),
``of`` (the choices) and ``sorted: descending`` (a list the chapter reads largest first).
Relations that are not a bound (two seed lists that must not share a seed) stay in the
notebook beside their reason.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import yaml

from ..validation import check_choice, check_float, check_float_list, check_int, check_int_list

__all__ = ["declarations", "declared_chapters", "declaration_problems", "check_declared", "check_values"]

DECLARATIONS = Path(__file__).with_name("parameters.yml")
TYPES = ("int", "float", "ints", "floats", "choice", "settings")


KEYS = ("type", "min", "max", "open", "min_len", "of", "sorted")


def declaration_problems(chapter: str, specs: dict, set_by_notebook: set[str] | None = None) -> list[str]:
    """What is wrong with one chapter's declarations: an unknown type, key or value (a typo
    would silently loosen a check), and a bound naming something neither declared before it
    nor in ``set_by_notebook`` (that bound would be left open everywhere). Only the notebook
    knows what it sets before its check, so :func:`_load` passes None, which skips that last
    test; tests/test_parameters.py runs it with each notebook's names."""
    problems, declared = [], []
    for name, spec in specs.items():
        where = f"{chapter}.{name}"
        kind = spec.get("type")
        if kind not in TYPES:
            problems.append(f"{where} has type {kind!r}, not one of {list(TYPES)}")
        problems += [f"{where}: unknown key {k!r}" for k in sorted(set(spec) - set(KEYS))]
        if "open" in spec and (spec["open"] not in ("low", "high", "both") or kind not in ("float", "floats")):
            problems.append(f"{where}: open {spec['open']!r} on a {kind}")
        if kind == "floats" and spec.get("open") in ("high", "both"):
            problems.append(f"{where}: a list's upper bound is closed")
        if "sorted" in spec and (spec["sorted"] != "descending" or kind != "floats"):
            problems.append(f"{where}: sorted {spec['sorted']!r} on a {kind}")
        for bound in ("min", "max"):
            ref = spec.get(bound)
            named = isinstance(ref, str) and set_by_notebook is not None
            if named and ref not in declared and ref not in set_by_notebook:
                problems.append(f"{where}: {bound} names {ref!r}, neither declared before it nor set by the notebook")
        declared.append(name)
    return problems


@lru_cache(maxsize=None)
def _load() -> dict:
    data = yaml.safe_load(DECLARATIONS.read_text(encoding="utf-8"))
    problems = [p for chapter, specs in data.items() for p in declaration_problems(chapter, specs)]
    if problems:
        raise ValueError(f"{DECLARATIONS.name}: " + "; ".join(problems))
    return data


def declared_chapters() -> list[str]:
    """The chapters the declarations name, in book order."""
    return list(_load())


def declarations(chapter: str) -> dict[str, dict]:
    """The declared parameters of ``chapter``, in order."""
    data = _load()
    if chapter not in data:
        raise KeyError(f"no chapter '{chapter}' in {DECLARATIONS.name}; it declares {sorted(data)}")
    return data[chapter]


def _bound(value, known: dict):
    if isinstance(value, str):
        return known.get(value)  # None (unbounded) where the named parameter is not known
    return value


def _check(name: str, value, spec: dict, known: dict):
    kind = spec["type"]
    low, high = _bound(spec.get("min"), known), _bound(spec.get("max"), known)
    opened = spec.get("open", "")
    bounds = dict(low_open=opened in ("low", "both"), high_open=opened in ("high", "both"))
    if kind == "int":
        return check_int(name, value, low, high)
    if kind == "float":
        return check_float(name, value, low, high, **bounds)
    if kind == "ints":
        return check_int_list(name, value, low, high, min_len=spec.get("min_len", 1))
    if kind == "floats":
        out = check_float_list(name, value, low, high, min_len=spec.get("min_len", 1), low_open=bounds["low_open"])
        return sorted(out, reverse=True) if spec.get("sorted") == "descending" else out
    if kind == "choice":
        return check_choice(name, value, tuple(spec["of"]))
    if not isinstance(value, dict):  # settings: the config that reads them checks each
        raise TypeError(f"{name} must be a mapping of settings, got {value!r}")
    return value


def check_values(chapter: str, values: dict, known: dict | None = None) -> dict:
    """``values`` (some of the chapter's parameters) checked against the declaration, in its
    order. A bound naming another parameter reads it from the values checked before it, or
    else from ``known`` (default ``values``); where it is in neither, that bound is left
    open. Returns the checked values."""
    known = dict(values if known is None else known)
    out = {}
    for name, spec in declarations(chapter).items():
        if name in values:
            out[name] = _check(name, values[name], spec, {**known, **out})
    return out


def check_declared(chapter: str, namespace: dict) -> None:
    """Check every declared parameter of ``chapter`` in ``namespace`` (a notebook's
    ``globals()``) and put back the checked value (lists of floats, floats for ints, a
    list sorted as declared). A declared parameter missing from the namespace is an error."""
    missing = [n for n in declarations(chapter) if n not in namespace]
    if missing:
        raise NameError(f"chapter '{chapter}' declares {missing}, which its parameters cell does not set")
    namespace.update(check_values(chapter, {n: namespace[n] for n in declarations(chapter)}, namespace))
