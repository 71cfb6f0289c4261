"""The report's weight-sharing section: a supernet's training curve, a search over its shared weights, and, given
standalone results of the same architectures (the ground truth), the search's metric against theirs with the rank
correlation.

What applies is read from the rows: supernet training reports `paths_trained` (SPOS, FairNAS) or `alpha_entropy`
(DARTS, GDAS); a trial judging a path by shared weights reports `inherited: 1`. The ground truth is another
experiment folder (each trial's last result) or a table (.csv, .json, .jsonl, .parquet) with one column per
decision and one for the metric; architectures are matched by their decisions.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import kendalltau, spearmanr

from nasplat.core.trees import flatten
from nasplat.engine.result import ExperimentResult
from nasplat.report import plots
from nasplat.report.frame import ReportFrame, figure, fmt, na, table
from nasplat.storage import ROWS_FILE

TRAINING_MARKS = ("paths_trained", "alpha_entropy")
TABLE_READERS = {".csv": pd.read_csv, ".json": pd.read_json, ".parquet": pd.read_parquet,
                 ".jsonl": lambda path: pd.read_json(path, lines=True)}


def _column(rows: pd.DataFrame, name: str) -> pd.Series:
    """`rows[name]` as numbers (NaN where absent or not a number)."""
    if name not in rows:
        return pd.Series(np.nan, index=rows.index, dtype=float)
    return pd.to_numeric(rows[name], errors="coerce")


def last_results(rows: pd.DataFrame, value: pd.Series) -> pd.DataFrame:
    """Each trial's last row (by order) where `value` is a number: `trial_id`, `config`, `value`."""
    kept = rows.assign(value=value)[value.notna()].sort_values("order")
    return kept.groupby("trial_id", sort=True).tail(1)[["trial_id", "config", "value"]].reset_index(drop=True)


def with_decisions(frame: pd.DataFrame, decisions: list[str]) -> pd.DataFrame:
    """`frame` with a `key` column: its decisions' values as one string (types differ between a table and a config:
    3 and "3" are the same decision)."""
    return frame.assign(key=["|".join(str(v) for v in values) for values in frame[decisions].itertuples(index=False)])


def load_ground_truth(source: str | Path, decisions: list[str], metric: str) -> pd.DataFrame:
    """Standalone results: `key` (the decisions) and `standalone` (the mean of `metric` where an architecture
    appears several times), from an experiment folder or a table file."""
    path = Path(source)
    if (path / ROWS_FILE).exists():
        result = ExperimentResult.load(path)
        rows = result.dataframe()
        rows["order"] = np.arange(len(rows))
        last = last_results(rows, _column(rows, metric))
        frame = pd.DataFrame([flatten(c) for c in last["config"]]).assign(**{metric: last["value"].to_numpy()})
    elif path.suffix in TABLE_READERS and path.is_file():
        frame = TABLE_READERS[path.suffix](path)
    else:
        raise ValueError(f"the ground truth must be an experiment folder or a table file "
                         f"({', '.join(TABLE_READERS)}), got {str(source)!r}")
    missing = [name for name in [*decisions, metric] if name not in frame]
    if missing:
        raise ValueError(f"the ground truth {str(source)!r} lacks {missing}: it needs a column for each decision "
                         f"{decisions} and for {metric!r}")
    frame = with_decisions(frame.assign(standalone=pd.to_numeric(frame[metric], errors="coerce")), decisions)
    return frame.dropna(subset=["standalone"]).groupby("key", as_index=False)["standalone"].mean()


def training_part(exp: ReportFrame) -> str:
    marked = exp.rows[pd.concat([_column(exp.rows, m).notna() for m in TRAINING_MARKS], axis=1).any(axis=1)]
    if marked.empty:
        return ""
    curves = pd.DataFrame({"trial_id": marked["trial_id"], "order": marked["order"],
                           "epoch": _column(marked, "epoch").fillna(marked["step"]),
                           **{k: _column(marked, k) for k in ("train_loss", "valid_acc", "valid_acc_min",
                                                              "valid_acc_max", "parameter_free")}})
    paths = _column(marked, "paths_trained").groupby(marked["trial_id"]).max()
    trained = f"; {fmt(paths.sum())} paths trained in all" if paths.notna().any() else ""
    return figure(plots.supernet_curves(curves.sort_values("order")),
                  f"Supernet training, {curves['trial_id'].nunique()} trial(s){trained}: training loss and the "
                  f"validation accuracy of the paths judged after each epoch (the band: their lowest and highest; "
                  f"DARTS/GDAS: the derived cell) against epoch.")


def search_part(exp: ReportFrame) -> str:
    inherited = exp.ok[_column(exp.ok, "inherited") == 1]
    if inherited.empty:
        return ""
    points = last_results(inherited, inherited["value"]).assign(
        params=_column(inherited, "params").groupby(inherited["trial_id"]).last().to_numpy())
    points["n"] = np.arange(1, len(points) + 1)
    points["best"] = points["value"].cummax() if exp.mode == "max" else points["value"].cummin()
    best = points.loc[points["value"].idxmax() if exp.mode == "max" else points["value"].idxmin()]
    eval_ms = _column(inherited, "eval_ms").median()
    return figure(plots.path_search(points, exp.metric),
                  f"The search over the supernet's shared weights: {len(points)} paths judged (median "
                  f"{fmt(eval_ms)} ms each), their inherited {exp.metric} in trial order with the best so far, and "
                  f"against their parameter count. Best: trial {int(best['trial_id'])}, {exp.metric} "
                  f"{fmt(best['value'])}, {flatten(best['config'])}.")


def truth_part(exp: ReportFrame, source: str | Path, metric: str | None = None) -> str:
    metric = metric or exp.metric
    searched = last_results(exp.rows, exp.rows["value"])
    if searched.empty:
        return na(f"Ground truth {source}: no trial here reported {exp.metric} yet, nothing to compare.")
    configs = pd.DataFrame([flatten(c) for c in searched["config"]])
    decisions = sorted(configs.columns, key=str)
    truth = load_ground_truth(source, decisions, metric)
    pairs = with_decisions(configs.assign(searched=searched["value"].to_numpy()), decisions)
    pairs = pairs.groupby("key", as_index=False)["searched"].mean().merge(truth, on="key")
    if len(pairs) < 3:
        return na(f"Ground truth {source}: {len(pairs)} of the {len(configs)} architectures here have a standalone "
                  f"{metric} there; a rank correlation needs 3 or more.")
    tau, spearman = kendalltau(pairs["searched"], pairs["standalone"]), spearmanr(pairs["searched"], pairs["standalone"])
    inherited = (_column(exp.rows, "inherited") == 1).any()
    x_label = f"{'inherited ' if inherited else ''}{exp.metric}"
    stats = {"architectures": len(pairs), "kendall_tau": float(tau.statistic), "tau_p_value": float(tau.pvalue),
             "spearman": float(spearman.statistic)}
    return (figure(plots.inherited_vs_standalone(pairs, x_label, f"standalone {metric}"),
                   f"{x_label} here against standalone {metric} in {source} over the {len(pairs)} architectures both "
                   f"have: Kendall tau {stats['kendall_tau']:+.3f} (p {stats['tau_p_value']:.2g}), Spearman "
                   f"{stats['spearman']:+.3f}.")
            + table(pd.DataFrame([stats]), caption="Rank correlation with the ground truth."))


def pipeline_part(exp: ReportFrame) -> str:
    """Links to the other stages of the pipeline this folder is a stage of (`../pipeline.json` beside it: supernet,
    search, retrain; `nasplat.experiment.pipeline`), each stage's report."""
    record = exp.folder.resolve().parent / "pipeline.json"
    try:
        stages = json.loads(record.read_text(encoding="utf-8")).get("stages")
    except (OSError, ValueError, AttributeError):
        return ""
    if not isinstance(stages, list):
        return ""
    names = [s for s in stages if isinstance(s, str) and re.fullmatch(r"[A-Za-z0-9_-]+", s)]
    links = [f"<b>{html.escape(s)}</b> (this folder)" if s == exp.folder.resolve().name
             else f"<a href='../{s}/report.html'>{html.escape(s)}</a>" for s in names]
    return f"<p class='pipeline'>A stage of the pipeline {html.escape(record.parent.name)}: {' → '.join(links)}</p>"


def oneshot_section(exp: ReportFrame, ground_truth: str | Path | None = None,
                    ground_truth_metric: str | None = None) -> str:
    """The weight-sharing section: whichever of training curve, path search and ground truth apply."""
    parts = [pipeline_part(exp), training_part(exp), search_part(exp)]
    if ground_truth is not None:
        parts.append(truth_part(exp, ground_truth, ground_truth_metric))
    body = "".join(parts)
    return body or na("No supernet training (rows with paths_trained or alpha_entropy) and no search over shared "
                      "weights (rows with inherited) here; give a ground truth (--ground-truth) to compare any "
                      "search's metric with standalone results.")

