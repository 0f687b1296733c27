"""Two sets of chapter records side by side: every recorded value that moved and by how
much, and every claim whose verdict changed or whose number moved beyond its tolerance.

    python -m attention_dynamics.book.compare results/paper my-rebuild
    python -m attention_dynamics.book.compare A B --values 20    # the 20 values that moved most

Used to compare a rebuild with the committed records (another machine, the kernels switched
off, a new commit), by the runner after a paper build, and by the tests. It exits with 1
when a claim's verdict changed or its number moved beyond the claim's tolerance, with 0
otherwise; values without a claim are reported, never judged. Timings (keys with seconds,
ms, time or a speed ratio, also as the name of a mapping: sticky_seconds.Adam) describe the
machine, not the science, and are listed apart; so is the provenance. The publishing workflow
(.github/workflows/book.yml) fails on this exit code.
"""
from __future__ import annotations

import argparse
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Moved", "ClaimChange", "Comparison", "compare", "compare_folders", "is_timing", "main"]

# seconds, ms or time as a word of the key: between its start or end, "_", and the "." or
# "[" of an entry (cluster_seconds.Adam, held_out_at_equal_time.SGD: a loss at equal wall time)
_TIMING = re.compile(r"(^|[_.])(seconds|ms|time|timing)([_.\[]|$)|speed_ratio")


def is_timing(key: str) -> bool:
    """Whether a record key holds a time or a speed, or a number read at a wall-clock time
    (of the machine, not of the science)."""
    return bool(_TIMING.search(key))


@dataclass(frozen=True)
class Moved:
    chapter: str
    key: str  # the record key, with [i] and .name for entries of lists and mappings
    old: object
    new: object

    @property
    def abs_diff(self) -> float | None:
        if _number(self.old) and _number(self.new):
            return abs(float(self.new) - float(self.old))
        return None

    @property
    def rel_diff(self) -> float | None:
        d = self.abs_diff
        if d is None:
            return None
        scale = max(abs(float(self.old)), abs(float(self.new)))
        return d / scale if scale > 0 else 0.0

    @property
    def timing(self) -> bool:
        return is_timing(self.key)


LOOSE = 10  # a widened tolerance this many times the stated one is reported as loose


@dataclass(frozen=True)
class ClaimChange:
    key: str
    chapter: str
    old: str  # as the scorecard prints it, with the verdict
    new: str
    delta: float | None  # |new - old| of the claim's number, where both are numbers
    tolerance: float | None  # the claim's, widened for a mean over seeds (see compare)
    verdict_changed: bool
    unreadable: str = ""  # why today's rule cannot read one of the two records
    lost_number: bool = False  # one side has a number and the other none (a run that diverged)
    stated_tolerance: float | None = None  # the claim's own, before the seeds' spread widened it

    @property
    def loose(self) -> bool:
        """Judged with more than LOOSE times the claim's stated tolerance: the committed
        seeds scatter so much that the comparison cannot see a smaller move."""
        return (self.tolerance is not None and self.stated_tolerance is not None
                and self.tolerance > LOOSE * self.stated_tolerance)

    @property
    def beyond_tolerance(self) -> bool:
        return self.delta is not None and self.tolerance is not None and self.delta > self.tolerance

    @property
    def fails(self) -> bool:
        return bool(self.unreadable) or self.verdict_changed or self.beyond_tolerance or self.lost_number


@dataclass
class Comparison:
    chapters: list[str]  # in both sets
    only_old: list[str]
    only_new: list[str]
    moved: list[Moved]
    claims: list[ClaimChange]  # every claim of the shared chapters, changed or not
    n_values: int  # values compared

    provenance: list[str] = field(default_factory=list)  # how the two sets were made, where it differs

    @property
    def failed(self) -> bool:
        return bool(self.only_old) or any(c.fails for c in self.claims)

    def lines(self, most: int = 10) -> list[str]:
        """The report: claims first (every one that changed verdict or moved beyond its
        tolerance, then a count of the rest), then the values that moved most."""
        out = [f"compared {len(self.chapters)} chapter(s), {self.n_values} recorded values, "
               f"{len(self.claims)} claims"]
        if self.only_old:
            out.append(f"MISSING from the new set: {', '.join(self.only_old)}")
        if self.only_new:
            out.append(f"only in the new set: {', '.join(self.only_new)}")
        out += [f"made differently: {line}" for line in self.provenance]
        bad = [c for c in self.claims if c.fails]
        for c in bad:
            why = (c.unreadable if c.unreadable else "verdict changed" if c.verdict_changed
                   else "a number on one side only" if c.lost_number
                   else f"moved {c.delta:.3g} > tolerance {c.tolerance:.3g}")
            out.append(f"CLAIM {c.key} ({c.chapter}): {c.old} -> {c.new}  [{why}]")
        within = [c for c in self.claims if not c.fails and c.old != c.new]
        out.append(f"claims with the same verdict and within tolerance: {len(self.claims) - len(bad)} "
                   f"({len(within)} of them with a different number)")
        for c in within:
            out.append(f"  {c.key}: {c.old} -> {c.new}" + (f" (|Δ| {c.delta:.3g} ≤ {c.tolerance:g})"
                                                          if c.delta is not None and c.tolerance is not None else ""))
        loose = [c for c in self.claims if c.loose]
        if loose:
            out.append(f"judged loosely (the committed seeds' spread allows over {LOOSE}x the stated tolerance): "
                       + ", ".join(f"{c.key} ±{c.tolerance:.3g} (stated {c.stated_tolerance:g})" for c in loose))
        values = [m for m in self.moved if not m.timing]
        timings = [m for m in self.moved if m.timing]
        out.append(f"values that differ: {len(values)} of {self.n_values} (and {len(timings)} timings)")
        # changes of kind first (a key gone, a string, None, a type): they are not rounding
        ranked = sorted(values, key=lambda m: (m.rel_diff is not None, -(m.rel_diff or 0.0)))
        for m in ranked[:most]:
            if m.rel_diff is None:
                out.append(f"  {m.chapter}.{m.key}: {_short(m.old)} -> {_short(m.new)}")
            else:
                out.append(f"  {m.chapter}.{m.key}: {m.old:.6g} -> {m.new:.6g} (relative {m.rel_diff:.2g})")
        if len(ranked) > most:
            out.append(f"  ... {len(ranked) - most} more")
        out.append("verdict: " + ("DIFFERENT (a claim changed, or a chapter is missing)" if self.failed
                                  else "the same claims"))
        return out


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _short(v) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _leaves(value, prefix: str) -> dict[str, object]:
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            out.update(_leaves(v, f"{prefix}.{k}"))
        return out
    if isinstance(value, list):
        out = {}
        for i, v in enumerate(value):
            out.update(_leaves(v, f"{prefix}[{i}]"))
        return out
    return {prefix: value}


def _same(a, b) -> bool:
    """Equal and of the same type (True is not 1), None (a non-finite number) equal to None."""
    return type(a) is type(b) and a == b


def _reading(claim, values: dict):
    """(Reading, None), or (None, why today's rule cannot read these values)."""
    try:
        return claim.read(values), None
    except KeyError as e:
        return None, f"records no {e}"


def _text(claim, r) -> str:
    from ..claims import format_reading

    return f"{format_reading(claim, r)} ({r.verdict})"


def compare(old: dict[str, dict], new: dict[str, dict]) -> Comparison:
    """Compare two record sets (chapter -> record with 'values'), chapter by chapter and key
    by key, and judge every claim of the chapters both hold by today's rules. A claim's
    number may move by its tolerance; for a mean over seeds, by two standard errors of the
    difference of two means where that is wider (two reruns of the same seeds on different
    processors are two draws), each with the committed record's standard error: the spread
    of the new run earns it no wider allowance. A claim whose number is present on one side
    and absent on the other fails."""
    from ..claims import CLAIMS

    shared = sorted(set(old) & set(new))
    moved, n, made = [], 0, []
    for ch in shared:
        a, b = old[ch].get("values", {}), new[ch].get("values", {})
        for key in sorted(set(a) | set(b)):
            la = _leaves(a.get(key, "<absent>"), key)
            lb = _leaves(b.get(key, "<absent>"), key)
            for leaf in sorted(set(la) | set(lb)):
                n += 1
                va, vb = la.get(leaf, "<absent>"), lb.get(leaf, "<absent>")
                if not _same(va, vb):
                    moved.append(Moved(ch, leaf, va, vb))
        pa, pb = old[ch].get("provenance", {}), new[ch].get("provenance", {})
        for f in ("profile", "parameters", "paths"):
            if pa.get(f) != pb.get(f):
                made.append(f"{ch} {f}: {_short(pa.get(f))} -> {_short(pb.get(f))}")
    claims = []
    for c in CLAIMS:
        if c.chapter not in shared:
            continue
        (o, why_o), (w, why_w) = _reading(c, old[c.chapter].get("values", {})), \
            _reading(c, new[c.chapter].get("values", {}))
        if o is None or w is None:
            claims.append(ClaimChange(c.key, c.chapter, _text(c, o) if o else "unreadable",
                                      _text(c, w) if w else "unreadable", None, c.tolerance, False,
                                      unreadable=f"today's rule cannot read the {'old' if o is None else 'new'} "
                                                 f"record: it {why_o or why_w}"))
            continue
        delta = abs(float(w.value) - float(o.value)) if _number(o.value) and _number(w.value) else None
        tolerance = c.tolerance
        if tolerance is not None and (o.n or 0) > 1 and o.se is not None:
            tolerance = max(tolerance, 2 * math.sqrt(2) * o.se)  # 2 se of a difference of two such means
        claims.append(ClaimChange(c.key, c.chapter, _text(c, o), _text(c, w), delta, tolerance,
                                  o.verdict != w.verdict, lost_number=_number(o.value) != _number(w.value),
                                  stated_tolerance=c.tolerance))
    return Comparison(shared, sorted(set(old) - set(new)), sorted(set(new) - set(old)), moved, claims, n, made)


def compare_folders(old: Path, new: Path) -> Comparison:
    from .scorecard import read_records

    for folder in (old, new):
        if not Path(folder).is_dir():
            raise ValueError(f"{folder} is not a folder of records")
    return compare(read_records(Path(old)), read_records(Path(new)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m attention_dynamics.book.compare", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old", type=Path, help="a folder of records (chapter.json), e.g. results/paper")
    ap.add_argument("new", type=Path, help="another folder of records")
    ap.add_argument("--values", type=int, default=10, help="how many of the values that moved to list (default 10)")
    args = ap.parse_args(argv)
    if args.values < 0:
        ap.error(f"--values must be >= 0, got {args.values}")
    try:
        result = compare_folders(args.old, args.new)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("\n".join(result.lines(args.values)))
    return 1 if result.failed else 0


if __name__ == "__main__":
    sys.exit(main())
