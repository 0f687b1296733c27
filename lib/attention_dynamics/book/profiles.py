"""Chapter parameters: the profiles file, the notebooks' parameter cells, and the YAML in
which a value is read from the command line and written into a footer.

``notebooks/profiles.yml`` lists, for every chapter in book order, its ``quick`` and
``paper`` parameters, and for some its ``gpu`` ones (a run at a larger size where an
accelerator is present; nothing else depends on one). Every value a user writes (``--set eta_min=1e-05``) or the book prints
(the provenance footer) is read and written here, so that each round-trips exactly.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import yaml

from .parameters import check_values, declarations, declared_chapters

__all__ = ["PROFILES", "EXTRA_PROFILES", "ALL_PROFILES", "RUNNER_PARAMETERS", "find_root", "parse_value", "format_value", "load_profiles",
           "check_parameters"]

PROFILES = ("quick", "paper")  # every chapter has these
EXTRA_PROFILES = ("gpu",)  # a chapter may have these: Paper I's size, run where an accelerator is present
ALL_PROFILES = PROFILES + EXTRA_PROFILES
PACKAGE_DIR = Path(__file__).resolve().parent.parent


def find_root(start: Path | None = None) -> Path:
    """The repository root: the first folder upward holding notebooks/profiles.yml."""
    for base in [Path(start or Path.cwd()).resolve(), PACKAGE_DIR]:
        for d in [base, *base.parents]:
            if (d / "notebooks" / "profiles.yml").is_file():
                return d
    raise FileNotFoundError("no notebooks/profiles.yml found above the current folder or the package")



class _ValueLoader(yaml.SafeLoader):
    """YAML as PyYAML reads it, plus the floats YAML 1.2 allows and YAML 1.1 does not
    (1e-05, 2E3, 1.5e3): without this, a value such as 1e-05 comes back as a string."""


_ValueLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def parse_value(text: str, where: str = "value"):
    """A parameter value written as YAML (numbers, strings, true/false, null, [lists],
    {mappings}); ``where`` names it in the one-line error a malformed value gets."""
    try:
        return yaml.load(text, Loader=_ValueLoader)
    except yaml.YAMLError as e:
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ValueError(f"{where}: cannot read {text!r} as a YAML value ({problem})") from None


def format_value(v) -> str:
    """The inverse of :func:`parse_value`, in YAML flow style that plain ``yaml.safe_load``
    (papermill's ``-y``) reads back to the same value too: floats always carry a dot
    before their exponent (1.0e-05), strings are double-quoted."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return ".nan"
        if math.isinf(v):
            return ".inf" if v > 0 else "-.inf"
        r = repr(v)
        if "e" in r:
            mantissa, exponent = r.split("e")
            r = (mantissa if "." in mantissa else mantissa + ".0") + "e" + exponent
        return r
    if isinstance(v, str):
        # a JSON string is a YAML double-quoted one, except that YAML spells a character
        # beyond the BMP as one \UXXXXXXXX escape where JSON writes a surrogate pair
        return re.sub(r"\\u(d[89ab][0-9a-f]{2})\\u(d[c-f][0-9a-f]{2})",
                      lambda m: "\\U%08x" % (0x10000 + ((int(m[1], 16) - 0xD800) << 10) + int(m[2], 16) - 0xDC00),
                      json.dumps(v))
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(format_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{format_value(str(k))}: {format_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write a parameter of type {type(v).__name__}: {v!r}")


def load_profiles(root: Path) -> dict[str, dict[str, dict]]:
    """notebooks/profiles.yml: chapter -> {"quick": {...}, "paper": {...}}, in book order.
    Malformed files fail with one line naming the file and the entry."""
    path = root / "notebooks" / "profiles.yml"
    where = "notebooks/profiles.yml"
    try:
        profiles = yaml.load(path.read_text(encoding="utf-8"), Loader=_ValueLoader)
    except UnicodeDecodeError:
        raise ValueError(f"{where} is not UTF-8 text") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ValueError(f"{where} is not valid YAML{at}: {getattr(e, 'problem', None) or e}") from None
    if profiles is None:
        raise ValueError(f"{where} is empty; it must map chapter names to their profiles")
    if not isinstance(profiles, dict):
        raise ValueError(f"{where} must map chapter names to their profiles, got a {type(profiles).__name__}")
    for name, entry in profiles.items():
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: chapter '{name}' must map the profiles {list(PROFILES)} to parameters, "
                             f"got {format_value(entry) if entry is None else type(entry).__name__}")
        missing = [p for p in PROFILES if p not in entry]
        if missing:
            raise ValueError(f"{where}: chapter '{name}' lacks the profile(s) {missing}")
        unknown = [p for p in entry if p not in ALL_PROFILES]
        if unknown:
            raise ValueError(f"{where}: chapter '{name}' has the unknown profile(s) {unknown}; "
                             f"the profiles are {list(ALL_PROFILES)}")
        for prof in [p for p in ALL_PROFILES if p in entry]:
            params = entry[prof]
            if not isinstance(params, dict) or not all(isinstance(k, str) for k in params):
                raise ValueError(f"{where}: profile '{prof}' of chapter '{name}' must map parameter names to values "
                                 f"(write {{}} for none), got {format_value(params) if params is None else type(params).__name__}")
        if not (root / "notebooks" / f"{name}.ipynb").is_file():
            raise FileNotFoundError(f"{where} names '{name}' but notebooks/{name}.ipynb does not exist")
    return profiles


RUNNER_PARAMETERS = ("record_path", "profile")


def check_parameters(name: str, notebook: Path, params: dict) -> None:
    """Every parameter must exist in the notebook's parameters cell (papermill would only
    warn), every parameter of that cell must be declared, and every value must lie in its
    declared range (:mod:`attention_dynamics.book.parameters`), so that a bad profile or
    ``--set`` fails before the chapter starts, as far as the runner can tell without running
    the notebook: a bound on a quantity the notebook derives (the wind tunnel's ``n_steps``)
    and the relations between parameters (``larger_V > V``, a window shorter than the
    sequence) are checked by the notebook when it starts. A chapter the declarations do not name (a
    book of one's own) is checked by its notebook alone; the book's own chapters are all
    declared (``tests/test_parameters.py``)."""
    import papermill as pm

    known = set(pm.inspect_notebook(str(notebook)))
    missing_runner = [p for p in RUNNER_PARAMETERS if p not in known]
    if missing_runner:
        raise ValueError(f"notebook '{name}' must declare {missing_runner} in its parameters cell")
    unknown = sorted(set(params) - known)
    if unknown:
        allowed = sorted(known - set(RUNNER_PARAMETERS))
        raise ValueError(f"chapter '{name}' has no parameter(s) {unknown}; its parameters are {allowed}")
    reserved = sorted(set(params) & set(RUNNER_PARAMETERS))
    if reserved:
        raise ValueError(f"{reserved} are set by the runner, not by profiles or --set")
    if name not in declared_chapters():  # a book of one's own (the tests' small ones)
        return
    undeclared = sorted(known - set(RUNNER_PARAMETERS) - set(declarations(name)))
    if undeclared:
        raise ValueError(f"notebook '{name}' has parameter(s) {undeclared} that book/parameters.yml does not declare")
    try:
        check_values(name, params)
    except (TypeError, ValueError) as e:
        raise ValueError(f"chapter '{name}': {e}") from None
