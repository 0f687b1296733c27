"""The claims scorecard page: every claim of the paper (:mod:`attention_dynamics.claims`)
judged on the records of the chapters of this build, one row each, rebuilt with every book
build (:func:`write_scorecard`), never typed by hand."""
from __future__ import annotations

import json
from pathlib import Path

from ..claims import evaluate
from ..rules import (BEYOND, FAILS, HOLDS, IDENTITY, INCONCLUSIVE, OBSERVED, PAPER, PARTLY, UNMEASURED,
                     VERDICTS)
from .render import cell

__all__ = ["render", "write_scorecard", "read_records"]


ICON = {HOLDS: "✓ **holds**", PARTLY: "~ **holds partly**", FAILS: "✗ **does not hold**",
        INCONCLUSIVE: "? **inconclusive**", UNMEASURED: "— not measured", OBSERVED: "· observation only"}


def _counts(rows) -> str:
    n = {k: sum(r["verdict"] == k for r in rows) for k in VERDICTS}
    return (f"{n[HOLDS]} hold, {n[PARTLY]} hold partly, {n[FAILS]} do not hold, {n[INCONCLUSIVE]} inconclusive, "
            f"{n[UNMEASURED]} not measured" + (f", {n[OBSERVED]} observations only" if n[OBSERVED] else ""))


PARTS = (
    (IDENTITY, "Identities checked",
     "Exact by construction: a closed form against autograd, or an algebraic fact. Each checks our code and the "
     "algebra and holds for any weights, trained or not; none is evidence for what training does."),
    (PAPER, "The paper's claims",
     "Each claim tested empirically. *Control*: the instrument's positive control on the same record, a case where "
     "the claim is true by construction and the instrument must say so (— where the instrument has none on record "
     "yet)."),
    (BEYOND, "Beyond the paper", "The book's own extensions."),
)


def render(rows: list[dict], profiles: dict[str, str]) -> str:
    prof = sorted(set(profiles.values()))
    lines = [
        "# Claims scorecard",
        "",
        "Which of the paper's claims hold in our runs. Every row is computed, at each build of the book, "
        "from the numbers the chapters record; the verdict follows the rule stated in the row. "
        f"This build used the profile(s) {', '.join(f'`{p}`' for p in prof) or '(none)'}; "
        "at the `quick` profile the runs are short and the verdicts describe short runs.",
    ]
    for kind, title, about in PARTS:
        part = [r for r in rows if r["kind"] == kind]
        lines += ["", f"## {title}", "", about, ""]
        if not part:
            lines.append("None yet.")
            continue
        lines += [f"**{_counts(part)}.**", ""]
        control = kind == PAPER
        lines += ["| | Quantity | Paper | Ours | Verdict (rule) |" + (" Control |" if control else "") + " Chapter |",
                  "|---|---|---|---|---|" + ("---|" if control else "") + "---|"]
        for r in part:
            link = f"{{doc}}`chapters/{r['chapter']}`" if r["chapter"] else "—"
            why = f"; {r['why']}" if r.get("why") else ""
            cells = [r["result"], cell(r["quantity"]), cell(r["paper"]), cell(r["ours"]),
                     f"{ICON[r['verdict']]} ({cell(r['rule'] + why)})"]
            if control:
                cells.append(cell(r.get("control") or "—"))
            lines.append("| " + " | ".join(cells + [link]) + " |")
    lines += ["", "*Ours*: a single measurement, or the mean over seeds ± its standard error (n seeds)."]
    return "\n".join(lines) + "\n"


def read_records(folder: Path) -> dict[str, dict]:
    """Every NAME.json in ``folder`` (grid points, NAME--..., are not chapters)."""
    records = {}
    for p in sorted(Path(folder).glob("*.json")):
        if "--" not in p.stem:
            with open(p, encoding="utf-8") as f:
                records[p.stem] = json.load(f)
    return records


def write_scorecard(chapters_dir: Path, out: Path) -> list[dict]:
    """Read every NAME.json in chapters_dir, write the page, return the rows."""
    from ..files import write_text_atomic

    records = read_records(chapters_dir)
    rows = evaluate(records)
    profiles = {k: r.get("provenance", {}).get("profile", "?") for k, r in records.items()}
    write_text_atomic(out, render(rows, profiles))
    return rows
