"""The claims scorecard: one row per measured claim of the paper, built from the numbers the
chapters record, with a verdict computed by a stated rule. Rebuilt with every book build
(:func:`write_scorecard`), never typed by hand."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

__all__ = ["Claim", "CLAIMS", "evaluate", "render", "write_scorecard", "HOLDS", "PARTLY", "FAILS", "UNMEASURED"]

HOLDS, PARTLY, FAILS, UNMEASURED = "holds", "holds partly", "does not hold", "not measured"


@dataclass(frozen=True)
class Claim:
    result: str  # "R1" ... "R9"
    quantity: str  # what we measure
    paper: str  # the paper's statement or number
    chapter: str  # the chapter whose record holds the numbers ("" for none)
    value: Callable[[dict], float | bool | None]  # from the chapter's recorded values
    rule: str  # the verdict rule, in words
    judge: Callable[[dict], str]  # the verdict rule, in code
    spread: Callable[[dict], float | None] = lambda v: None  # uncertainty (sd over seeds), if any
    fmt: str = "{:.3g}"


def at_most(limit: float):
    return lambda x: HOLDS if x <= limit else FAILS


def ladder(holds: float, partly: float, *, higher_is_better: bool = True):
    def judge(x):
        s = 1 if higher_is_better else -1
        return HOLDS if s * x >= s * holds else PARTLY if s * x >= s * partly else FAILS
    return judge


def consistent(mean: float, sd: float):
    """Ours and the paper's agree within 2 combined standard deviations (holds) or 4 (partly)."""
    def judge(x, our_sd):
        z = abs(x - mean) / math.sqrt(sd**2 + (our_sd or 0.0) ** 2)
        return HOLDS if z <= 2 else PARTLY if z <= 4 else FAILS
    return judge


def _v(key):
    return lambda v: v[key]


def _sd(key):
    return lambda v: v.get(key)


def _keys_judge(v):
    cos, rnd, simplex = v["key_cos_end_min"], v["key_cos_random"], v["key_cos_simplex"]
    return HOLDS if cos <= simplex + 0.25 * (rnd - simplex) else PARTLY if cos < rnd else FAILS


def _ablation_judge(v):
    hurt = [v[f"mae_{k}"] >= 2 * v["mae_baseline"] for k in ("values_frozen", "routing_frozen")]
    return HOLDS if all(hurt) else PARTLY if any(hurt) else FAILS


CLAIMS: list[Claim] = [
    Claim("R1", "dL/ds: closed form vs autograd, max relative error (float64)", "an exact identity", "routing_law",
          _v("max_rel_error_scores"), "holds if ≤ 1e-12", lambda v: at_most(1e-12)(v["max_rel_error_scores"]), fmt="{:.1e}"),
    Claim("R1", "sign of Δα vs −sign(advantage) in a trained head, while it specializes", "queries route more to values better than average",
          "specialization", _v("agreement_during"), "holds if ≥ 0.9, partly if ≥ 0.6 (chance: 0.5)",
          lambda v: ladder(0.9, 0.6)(v["agreement_during"]), fmt="{:.2f}"),
    Claim("R1", "the same inside the wind-tunnel transformer (AdamW steps)", "the routing law drives attention",
          "wt_laws", _v("adamw_sign_agreement"), "holds if ≥ 0.9, partly if ≥ 0.6 (chance: 0.5)",
          lambda v: ladder(0.9, 0.6)(v["adamw_sign_agreement"]), fmt="{:.2f}"),
    Claim("R2", "dL/dv = Σ α u: closed form vs autograd, max abs. error", "an exact identity", "value_law",
          _v("r2_example_error"), "holds if ≤ 1e-12", lambda v: at_most(1e-12)(v["r2_example_error"]), fmt="{:.1e}"),
    Claim("R2", "value change vs −Σ α u inside the transformer (cosine, plain gradient step)",
          "values move along their users' error signals", "wt_laws", _v("sgd_value_alignment"),
          "holds if ≥ 0.9, partly if ≥ 0.1", lambda v: ladder(0.9, 0.1)(v["sgd_value_alignment"]), fmt="{:.2f}"),
    Claim("R3", "dL/dq, dL/dk and all parameter gradients vs autograd, max relative error", "an exact identity",
          "routing_law", _v("max_rel_error_other"), "holds if ≤ 1e-12",
          lambda v: at_most(1e-12)(v["max_rel_error_other"]), fmt="{:.1e}"),
    Claim("R4", "log-log slope of the first-order remainder", "O(η²): slope 2", "value_law", _v("slope_sv_mean"),
          "holds if within 0.1 of 2, partly if within 0.3", lambda v: HOLDS if abs(v["slope_sv_mean"] - 2) <= 0.1
          else PARTLY if abs(v["slope_sv_mean"] - 2) <= 0.3 else FAILS, spread=_sd("slope_sv_std"), fmt="{:.3f}"),
    Claim("R5", "fall of the mean attention entropy over training (nats)", "attention sharpens", "specialization",
          lambda v: v["entropy_start"] - v["entropy_end"], "holds if ≥ 0.3, partly if > 0",
          lambda v: ladder(0.3, 1e-9)(v["entropy_start"] - v["entropy_end"]), fmt="{:.3f}"),
    Claim("R5", "rise of the specialization index (0: shared, 1: one cluster per value)",
          "routing and content specialize together", "specialization", lambda v: v["si_end"] - v["si_start"],
          "holds if ≥ 0.5, partly if ≥ 0.2", lambda v: ladder(0.5, 0.2)(v["si_end"] - v["si_start"]), fmt="{:.3f}"),
    Claim("R5", "steps to break a symmetric start, per decade of smaller asymmetry",
          "a positive feedback loop amplifies small differences", "specialization", _v("steps_per_decade"),
          "holds if every run specializes and the time grows like log(1/ε) (slope > 0)",
          lambda v: HOLDS if v["n_specialized"] == v["n_symmetric_runs"] and v["steps_per_decade"] > 0 else FAILS, fmt="{:.0f}"),
    Claim("R6", "attention weights vs EM responsibilities, max abs. difference", "attention is the E-step",
          "two_timescale_em", _v("e_step_error"), "holds if ≤ 1e-12", lambda v: at_most(1e-12)(v["e_step_error"]), fmt="{:.1e}"),
    Claim("R6", "hard attention: head vs hard EM, max gap along the trajectory",
          "a 1/N_j value step is exactly the M-step", "two_timescale_em", _v("hard_max_gap"), "holds if ≤ 1e-10",
          lambda v: at_most(1e-10)(v["hard_max_gap"]), fmt="{:.1e}"),
    Claim("R6", "soft attention: distance between the head's and EM's fixed points (σ), overlapping components",
          "the head runs EM", "two_timescale_em", _v("fixed_point_distance_overlapping"),
          "holds if ≤ 1e-3; partly if it is ≤ 1e-6 for well-separated components only",
          lambda v: HOLDS if v["fixed_point_distance_overlapping"] <= 1e-3
          else PARTLY if v["fixed_point_distance_well_separated"] <= 1e-6 else FAILS, fmt="{:.3g}"),
    Claim("R6", "fewer steps with faster values: best ratio vs ratio 1 (speedup)", "values on a faster timescale help",
          "two_timescale_em", _v("speedup_best_vs_1"), "holds if ≥ 1.5, partly if > 1",
          lambda v: ladder(1.5, 1.0 + 1e-9)(v["speedup_best_vs_1"]), fmt="{:.1f}×"),
    Claim("R7", "SGD final loss (nats)", "2.031 ± 0.021 (authors' script)", "sticky_chain", _v("sgd_final_mean"),
          "agrees within 2 combined sd (holds), 4 (partly)",
          lambda v: consistent(2.031, 0.021)(v["sgd_final_mean"], v["sgd_final_std"]), spread=_sd("sgd_final_std"), fmt="{:.3f}"),
    Claim("R7", "EM-style final loss (nats)", "1.932 ± 0.026 (authors' script)", "sticky_chain", _v("em_final_mean"),
          "agrees within 2 combined sd (holds), 4 (partly)",
          lambda v: consistent(1.932, 0.026)(v["em_final_mean"], v["em_final_std"]), spread=_sd("em_final_std"), fmt="{:.3f}"),
    Claim("R7", "steps for EM-style to reach SGD's final loss", "458 ± 164 (authors' script)", "sticky_chain",
          _v("reach_steps_mean"), "agrees within 2 combined sd (holds), 4 (partly)",
          lambda v: consistent(458, 164)(v["reach_steps_mean"], v["reach_steps_std"]), spread=_sd("reach_steps_std"), fmt="{:.0f}"),
    Claim("R7", "speedup of EM-style over SGD", "about 2.3× (paper), 2.2× (script)", "sticky_chain", _v("speedup"),
          "holds if within 20% of 2.3, partly if > 1", lambda v: HOLDS if abs(v["speedup"] / 2.3 - 1) <= 0.2
          else PARTLY if v["speedup"] > 1 else FAILS, fmt="{:.2f}×"),
    Claim("R7", "accuracy, EM-style minus SGD", "0.26 − 0.20 = 0.06 (script)", "sticky_chain",
          lambda v: v["em_acc_mean"] - v["sgd_acc_mean"], "holds if within 0.03 of 0.06, partly if > 0",
          lambda v: HOLDS if abs(v["em_acc_mean"] - v["sgd_acc_mean"] - 0.06) <= 0.03
          else PARTLY if v["em_acc_mean"] > v["sgd_acc_mean"] else FAILS, fmt="{:.3f}"),
    Claim("R8", "predictive entropy vs exact posterior, mean |error| (bits), V = 8 on CPU",
          "< 0.01 bits (Paper I, V = 20, GPU)", "wt_calibration", _v("mae_bits"),
          "holds if ≤ 0.01, partly if ≤ 0.02 (the book's CPU target)",
          lambda v: ladder(0.01, 0.02, higher_is_better=False)(v["mae_bits"]), fmt="{:.4f}"),
    Claim("R8", "key frame: mean |cos| between symbols' keys (lowest layer value)", "keys become near-orthogonal",
          "wt_geometry", _v("key_cos_end_min"),
          "holds if within a quarter of the way from a perfect simplex to random vectors, partly if below random",
          _keys_judge, fmt="{:.3f}"),
    Claim("R8", "|ρ| between the leading value coordinate and posterior entropy (best layer)",
          "values lie on a manifold ordered by posterior entropy", "wt_geometry", _v("rho_max_end"),
          "holds if ≥ 0.8, partly if ≥ 0.5", lambda v: ladder(0.8, 0.5)(v["rho_max_end"]), fmt="{:.2f}"),
    Claim("R8", "attention entropy falls in every layer", "attention focuses", "wt_geometry",
          lambda v: all(e < s for e, s in zip(v["attention_bits_end"], v["attention_bits_start"])),
          "holds if it falls in every layer",
          lambda v: HOLDS if all(e < s for e, s in zip(v["attention_bits_end"], v["attention_bits_start"])) else FAILS,
          fmt="{}"),
    Claim("R8", "attention maps settle before calibration does (steps)", "frame before precision", "wt_geometry",
          lambda v: f"{v['frame_settled_step']} vs {v['precision_settled_step']}", "holds if the frame settles first",
          lambda v: HOLDS if v["frame_before_precision"] else FAILS, fmt="{}"),
    Claim("R8", "freezing values or routing at least doubles the calibration error",
          "the geometry and function come through the two laws", "wt_laws",
          lambda v: f"{v['mae_values_frozen'] / v['mae_baseline']:.1f}× / {v['mae_routing_frozen'] / v['mae_baseline']:.1f}×",
          "holds if both ablations double the error, partly if one does", _ablation_judge, fmt="{}"),
    Claim("R9", "belief accumulation, transport and binding as inference primitives", "sketched in v3", "",
          lambda v: None, "not tested by this book", lambda v: UNMEASURED),
]


def _fmt(claim: Claim, x) -> str:
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, str):
        return x
    return claim.fmt.format(x)


def evaluate(records: dict[str, dict]) -> list[dict]:
    """Rows of the scorecard from the chapters' records (chapter -> {'values': ...})."""
    rows = []
    for c in CLAIMS:
        row = {"result": c.result, "quantity": c.quantity, "paper": c.paper, "chapter": c.chapter, "rule": c.rule}
        values = records.get(c.chapter, {}).get("values") if c.chapter else {}
        if values is None:
            row.update(ours="not run", verdict=UNMEASURED)
        else:
            try:
                x = c.value(values)
                sd = c.spread(values)
                row["ours"] = "—" if x is None else _fmt(c, x) + (f" ± {_fmt(c, sd)}" if sd is not None else "")
                row["verdict"] = c.judge(values)
            except KeyError as e:
                raise KeyError(f"scorecard: chapter '{c.chapter}' records no {e} (needed for {c.result}: {c.quantity})") from None
        rows.append(row)
    return rows


ICON = {HOLDS: "✓ **holds**", PARTLY: "~ **holds partly**", FAILS: "✗ **does not hold**", UNMEASURED: "— not measured"}


def _cell(text: str) -> str:
    """A table cell: a literal | (as in |cos|) would end the cell."""
    return str(text).replace("|", "\\|")


def render(rows: list[dict], profiles: dict[str, str]) -> str:
    counts = {k: sum(r["verdict"] == k for r in rows) for k in (HOLDS, PARTLY, FAILS, UNMEASURED)}
    prof = sorted(set(profiles.values()))
    lines = [
        "# Claims scorecard",
        "",
        "Which of the paper's claims hold in our runs. Every row is computed, at each build of the book, "
        "from the numbers the chapters record; the verdict follows the rule stated in the row. "
        f"This build used the profile(s) {', '.join(f'`{p}`' for p in prof) or '(none)'}; "
        "at the `quick` profile the runs are short and the verdicts describe short runs.",
        "",
        f"**{counts[HOLDS]} hold, {counts[PARTLY]} hold partly, {counts[FAILS]} do not hold, "
        f"{counts[UNMEASURED]} not measured.**",
        "",
        "| | Quantity | Paper | Ours | Verdict (rule) | Chapter |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        link = f"{{doc}}`chapters/{r['chapter']}`" if r["chapter"] else "—"
        cells = [r["result"], _cell(r["quantity"]), _cell(r["paper"]), _cell(r["ours"]),
                 f"{ICON[r['verdict']]} ({_cell(r['rule'])})", link]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "*Ours*: mean over seeds, ± one standard deviation where the chapter runs several seeds."]
    return "\n".join(lines) + "\n"


def write_scorecard(chapters_dir: Path, out: Path) -> list[dict]:
    """Read every NAME.json in chapters_dir, write the page, return the rows."""
    records = {}
    for p in sorted(Path(chapters_dir).glob("*.json")):
        if "--" not in p.stem:  # grid points are not chapters
            with open(p) as f:
                records[p.stem] = json.load(f)
    rows = evaluate(records)
    profiles = {k: r.get("provenance", {}).get("profile", "?") for k, r in records.items()}
    from .records import write_text_atomic

    write_text_atomic(out, render(rows, profiles))
    return rows
