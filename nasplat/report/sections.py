"""`build_report(folder)`: one self-contained HTML page about an experiment folder (no external URLs).

Sections: summary, best-so-far (against time and trials), learning curves, PBT schedules and exploit
events, the evolution lineage (with the decision each mutation changed), decision importance (Optuna's
fANOVA), the rungs of ASHA / Hyperband (trials per rung, promotion thresholds over time), weight sharing (the
supernet's training curve, the search over it, inherited against standalone accuracy) and the top 10 trials.
A section that does not apply to the experiment says so in one line.
"""

from __future__ import annotations

import html
import time
from pathlib import Path

import numpy as np
import pandas as pd

from nasplat.core import pareto
from nasplat.core.checks import is_real
from nasplat.core.rows import RESERVED
from nasplat.core.trees import flatten
from nasplat.report import plots
from nasplat.report.frame import ReportFrame, changes_text, diff, figure, fmt, na, table
from nasplat.report.oneshot import MAX_GROUND_TRUTH_ROWS, oneshot_section
from nasplat.report.output import write_page
from nasplat.report.rungs import rungs_section
from nasplat.storage import ROWS_FILE

TOP_K = 10
SECTIONS = {"summary": "Summary", "best-so-far": "Best so far", "pareto": "Pareto front",
            "learning-curves": "Learning curves", "pbt": "PBT schedules and exploits", "lineage": "Evolution lineage",
            "importance": "Decision importance", "rungs": "Rungs (ASHA, Hyperband)",
            "weight-sharing": "Weight sharing", "top": f"Top {TOP_K} trials"}


# -- sections ----------------------------------------------------------------------------------------
def summary(exp: ReportFrame) -> str:
    counts = exp.result.counts()
    best = exp.result.best
    items = {
        "experiment": exp.meta.get("name", exp.folder.name), "controller": exp.meta.get("controller", "—"),
        "executor": exp.meta.get("executor", "—"), "metric": f"{exp.metric} ({exp.mode})",
        "trials": f"{exp.rows['trial_id'].nunique()} ("
                  + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + ")",
        "rows (trial steps)": len(exp.rows), "exploit events": int(exp.rows["donor_id"].notna().sum()),
        "time span": f"{fmt(float(exp.rows['end'].max()))} s" if len(exp.rows) else "—",
        "best": f"{exp.metric} = {fmt(best[exp.metric])} (trial {best['trial_id']}, step {best['step']})"
                if best else "no successful result yet",
        "folder": str(exp.folder), "generated": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    return "<dl>" + "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(str(v))}</dd>" for k, v in items.items()) \
        + "</dl>"


def best_section(exp: ReportFrame) -> str:
    ok = exp.ok.sort_values(["end", "order"]).copy()
    if ok.empty:
        return na("No successful result yet: nothing to plot.")
    ok["n_trials"] = (~ok["trial_id"].duplicated()).cumsum()
    ok["best"] = ok["value"].cummax() if exp.mode == "max" else ok["value"].cummin()
    return figure(plots.best_so_far(ok, exp.metric, exp.mode),
                  f"Best {exp.metric} so far ({exp.mode}) against the executor clock and against trials evaluated; "
                  "grey dots are individual reports.")


def exploit_events(exp: ReportFrame) -> pd.DataFrame:
    """Rows where a PBT exploit happened, with the donor's latest value and the config before and after."""
    events = exp.rows[exp.rows["donor_id"].notna()].sort_values("order")
    out = []
    for _, row in events.iterrows():
        own = exp.rows[exp.rows["trial_id"] == row["trial_id"]]
        later = own[own["step"] > row["step"]].sort_values("step")
        after = later["config"].iloc[0] if len(later) else None
        donor = exp.ok[(exp.ok["trial_id"] == row["donor_id"]) & (exp.ok["end"] <= row["end"])].sort_values("end")
        record = {"trial": int(row["trial_id"]), "step": int(row["step"]), "donor": int(row["donor_id"]),
                  "value": row["value"], "donor value": donor["value"].iloc[-1] if len(donor) else np.nan,
                  "changes": changes_text(diff(row["config"], after)) if after is not None else "(trial ended)"}
        record.update({f"after.{k}": v for k, v in flatten(after).items()} if after is not None else {})
        out.append(record)
    return pd.DataFrame(out, columns=["trial", "step", "donor", "value", "donor value", "changes"]
                        + sorted({k for r in out for k in r if k.startswith("after.")}))


def curves_section(exp: ReportFrame, exploits: pd.DataFrame) -> str:
    ok = exp.ok
    if ok.empty:
        return na("No successful result yet: no learning curves.")
    top_ids = [int(r["trial_id"]) for r in exp.result.ranked()[:TOP_K]]
    marks = exploits.rename(columns={"trial": "trial_id"})[["trial_id", "step", "value"]]
    if ok["step"].max() <= 1:
        return na(f"Every trial reported a single step (one evaluation each): no curves to draw; the "
                  f"{ok['trial_id'].nunique()} results are in 'Best so far' and the lineage.")
    return figure(plots.learning_curves(ok, top_ids, marks, exp.metric),
                         f"{exp.metric} against step for each of {ok['trial_id'].nunique()} trials; the top "
                         f"{len(top_ids)} in colour, the rest grey; x marks PBT exploits.")


def pbt_section(exp: ReportFrame, exploits: pd.DataFrame) -> str:
    is_pbt = "populationbased" in str(exp.meta.get("controller", "")).lower().replace("_", "")
    if not is_pbt and exploits.empty:
        return na(f"Not a PBT experiment (controller {exp.meta.get('controller', 'unknown')}): no row has a "
                  "donor_id, so there are no hyperparameter schedules or exploit events.")
    flat = pd.DataFrame([flatten(c) for c in exp.rows["config"]], index=exp.rows.index)
    keys = [k for k in flat.columns if flat[k].map(lambda v: is_real(v) or v is None).all() and flat[k].notna().any()]
    parts = []
    if keys:
        frame = pd.concat([exp.rows[["trial_id", "step"]], flat[keys].astype(float)], axis=1)
        parts.append(figure(plots.schedules(frame, keys, exploits),
                            "Numeric hyperparameters of each member over steps; x marks the value a member "
                            "continued with after an exploit."))
    else:
        parts.append(na("The configs have no numeric hyperparameters to plot."))
    if exploits.empty:
        parts.append(na("No exploit event yet: no member has copied another's weights."))
    else:
        parts.append(table(exploits[["trial", "step", "donor", "value", "donor value", "changes"]].rename(
            columns={"value": exp.metric, "donor value": f"donor {exp.metric}"}),
            caption=f"{len(exploits)} exploit events: after `step` the trial loaded the donor's state and "
                    "continued with the donor's config, perturbed (changes from its own previous config)."))
    return "".join(parts)


def lineage_section(exp: ReportFrame) -> str:
    trials = exp.trials()
    children = trials[trials["parent_id"].notna()].copy()
    if children.empty:
        return na(f"No trial has a parent_id (controller {exp.meta.get('controller', 'unknown')} does not breed "
                  "trials from others): no lineage tree.")
    children["parent_id"] = children["parent_id"].astype(int)
    by_id = trials.set_index("trial_id")
    records = []
    for _, child in children.iterrows():
        parent = by_id.loc[child["parent_id"]] if child["parent_id"] in by_id.index else None
        changes = diff(parent["config"], child["config"]) if parent is not None else []
        kind = ", ".join(str(k) for k, _, _ in changes) or ("(no change)" if parent is not None else "(parent unknown)")
        pv = parent["value"] if parent is not None else np.nan
        records.append({"trial_id": int(child["trial_id"]), "parent_id": int(child["parent_id"]), "changed": kind,
                        "mutation": changes_text(changes) if parent is not None else "(parent not recorded)",
                        "value": child["value"], "parent value": pv, "delta": child["value"] - pv})
    edges = pd.DataFrame(records)
    ancestry = ancestors(by_id, exp.result.best["trial_id"]) if exp.result.best else []
    sign = 1 if exp.mode == "max" else -1
    effect = edges.groupby("changed").agg(mutations=("trial_id", "size"), mean_delta=("delta", "mean"),
                                          improved=("delta", lambda d: float((sign * d > 0).mean())))
    effect = effect.sort_values("mutations", ascending=False).reset_index().rename(columns={
        "changed": "decision changed", "mean_delta": f"mean Δ {exp.metric}", "improved": "share improved"})
    chain = pd.DataFrame([{"generation": i, "trial": t, exp.metric: by_id.loc[t, "value"],
                           "mutation from parent": edges.set_index("trial_id")["mutation"].get(t, "(random start)")}
                          for i, t in enumerate(ancestry)])
    full = edges.rename(columns={"trial_id": "child", "parent_id": "parent", "value": exp.metric,
                                 "parent value": f"parent {exp.metric}", "delta": "Δ"}).drop(columns="changed")
    return (figure(plots.lineage(trials[trials["value"].notna()], edges, ancestry, exp.metric),
                   f"{len(edges)} children bred from parents among {len(trials)} trials; each line joins a parent "
                   "to its child, coloured by the decision the mutation changed; red: the best trial's ancestors.")
            + table(chain, caption="Ancestry of the best trial, from its random ancestor down.")
            + table(effect, caption=f"Mutations per decision: mean change of {exp.metric} and share that improved.")
            + f"<details{' open' if len(full) <= 30 else ''}><summary>All {len(full)} mutations</summary>"
            + table(full) + "</details>")


def ancestors(by_id: pd.DataFrame, trial_id: int) -> list[int]:
    """`trial_id` and its parents up to a trial with no (recorded) parent, oldest first."""
    chain, seen = [int(trial_id)], {int(trial_id)}
    while True:
        parent = by_id["parent_id"].get(chain[-1])
        if parent is None or pd.isna(parent) or int(parent) in seen or int(parent) not in by_id.index:
            return chain[::-1]
        chain.append(int(parent))
        seen.add(int(parent))


def importance_section(exp: ReportFrame) -> str:
    from nasplat.integrations import param_importances

    try:
        importances = param_importances(exp.result)
    except ValueError as exc:
        return na(f"No decision importance: {exc}")
    frame = pd.DataFrame({"decision": list(importances), "importance": list(importances.values())})
    return table(frame, caption=f"The share of {exp.metric}'s variance over completed trials that each decision "
                                "explains (Optuna's fANOVA, seeded; decisions inside a branch are left out).")


def top_section(exp: ReportFrame) -> str:
    ranked = exp.result.ranked()[:TOP_K]
    if not ranked:
        return na("No successful result yet: no ranking.")
    metrics = [k for k in ranked[0] if k not in RESERVED and k != exp.metric
               and is_real(ranked[0][k])]
    records = []
    for rank, row in enumerate(ranked, start=1):
        record = {"rank": rank, "trial": row["trial_id"], exp.metric: row[exp.metric]}
        record.update({k: row.get(k) for k in metrics})
        record.update({"step": row["step"], "parent": row.get("parent_id")})
        record.update({(k if k not in record else f"config.{k}"): v for k, v in flatten(row["config"]).items()})
        records.append(record)
    return table(pd.DataFrame(records), caption=f"The {len(records)} best trials by {exp.metric} ({exp.mode}), "
                                                "each at its best step, with its full config.")


def hypervolume_progress(trials: pd.DataFrame, metrics: list[str], modes: list[str], reference: list[float],
                         curve_points: int = 200) -> pd.DataFrame:
    """The hypervolume of the feasible front after the first n trials (rows in order of ending, with one column
    per metric, `end` and `feasible`), at up to `curve_points` values of n: columns n_trials, end, hypervolume."""
    counts = np.unique(np.linspace(1, len(trials), min(len(trials), curve_points)).astype(int))
    signs = pareto.signs(modes)
    points = trials[metrics].to_numpy() * signs
    so_far, volumes, done = np.zeros((0, len(metrics))), [], 0
    for n in counts:  # the front so far, grown by the trials that ended since the last point of the curve
        so_far = np.vstack([so_far, points[done:n][trials["feasible"].to_numpy()[done:n]]])
        so_far, done = so_far[pareto.non_dominated_mask(so_far)], n
        volumes.append(pareto.hypervolume(so_far, np.array(reference) * signs))
    return pd.DataFrame({"n_trials": counts, "end": trials["end"].to_numpy()[counts - 1], "hypervolume": volumes})


def pareto_section(exp: ReportFrame, curve_points: int = 200) -> str:
    """Several objectives: every trial against the first two, the front, and its hypervolume over time and trials
    (reference: the worst value of each objective over all trials)."""
    result = exp.result
    metrics, modes = list(result.metrics), list(result.modes)
    if len(metrics) < 2:
        return na(f"One objective ({exp.metric}): no Pareto front; give several metrics (metric: [a, b]) for one.")
    rows = sorted(pareto.trial_rows(result.rows, metrics), key=lambda r: (r["end"], r["trial_id"]))
    if not rows:
        return na(f"No trial has reported every objective {metrics} yet: no front.")
    trials = pd.DataFrame([{**{m: float(r[m]) for m in metrics}, "end": float(r["end"]),
                            "feasible": pareto.total_violation(result.constraints, r) == 0} for r in rows])
    front = pd.DataFrame([{m: float(r[m]) for m in metrics} for r in result.pareto_front()])
    worst = [trials[m].min() if d == "max" else trials[m].max() for m, d in zip(metrics, modes)]
    curve = hypervolume_progress(trials, metrics, modes, worst, curve_points)
    bounds = f"; constraints {', '.join(map(str, result.constraints))}" if result.constraints else ""
    return (figure(plots.pareto_front(trials, front, metrics, modes),
                   f"{len(rows)} trials by {metrics[0]} and {metrics[1]} (each trial's latest result); red: the "
                   f"{len(front)} trials of the Pareto front of {metrics}{bounds}.")
            + figure(plots.hypervolume_curve(curve),
                     f"Hypervolume of the feasible front so far, up to the reference point "
                     f"{dict(zip(metrics, map(fmt, worst)))} (the worst value of each objective over all trials)."))


# -- page ----------------------------------------------------------------------------------------------


def render_report(folder: str | Path, *, ground_truth: str | Path | None = None,
                  ground_truth_metric: str | None = None,
                  ground_truth_max_rows: int = MAX_GROUND_TRUTH_ROWS) -> str:
    """The report of the experiment in `folder` as one HTML string; `ground_truth` (an experiment folder or a
    table of standalone results of at most `ground_truth_max_rows` rows, compared on `ground_truth_metric`, default
    the experiment's metric) adds the scatter of this experiment's metric against it to the weight-sharing section.
    Nothing is written."""
    exp = ReportFrame.load(folder)
    exploits = exploit_events(exp)
    bodies = {"summary": summary(exp), "best-so-far": best_section(exp), "pareto": pareto_section(exp),
              "learning-curves": curves_section(exp, exploits), "pbt": pbt_section(exp, exploits),
              "lineage": lineage_section(exp), "importance": importance_section(exp), "rungs": rungs_section(exp),
              "weight-sharing": oneshot_section(exp, ground_truth, ground_truth_metric, ground_truth_max_rows),
              "top": top_section(exp)}
    title = html.escape(f"nasplat report: {exp.meta.get('name', exp.folder.name)}")
    nav = "".join(f"<a href='#{key}'>{html.escape(label)}</a>" for key, label in SECTIONS.items())
    sections = "".join(f"<section id='{key}'><h2>{html.escape(SECTIONS[key])}</h2>{body}</section>"
                       for key, body in bodies.items())
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{title}</title>"
            f"<meta name='viewport' content='width=device-width'><style>{plots.CSS}</style></head>"
            f"<body><h1>{title}</h1><nav>{nav}</nav>{sections}</body></html>\n")


def build_report(folder: str | Path, *, output: str | Path | None = None, ground_truth: str | Path | None = None,
                 ground_truth_metric: str | None = None, ground_truth_max_rows: int = MAX_GROUND_TRUTH_ROWS) -> Path:
    """Write the report (atomically) to `output`, by default `<folder>/report.html` (or `./<folder name>-report.html`
    where the folder cannot be written, see `nasplat.report.output.write_page`), and return its path;
    `ground_truth` as for `render_report`."""
    folder = Path(folder)
    if not (folder / ROWS_FILE).exists():
        raise FileNotFoundError(f"{folder} is not an experiment folder: no {ROWS_FILE} in it")
    page = render_report(folder, ground_truth=ground_truth, ground_truth_metric=ground_truth_metric,
                         ground_truth_max_rows=ground_truth_max_rows)
    return write_page(folder, page, output)[0]
