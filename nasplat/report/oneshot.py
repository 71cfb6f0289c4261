"""The report's weight-sharing section: a supernet's training curve, a search over its shared weights, and, given
standalone results of the same architectures (the ground truth), the search's metric against theirs with the rank
correlation.

What applies is read from the rows: supernet training reports `paths_trained` (SPOS, FairNAS) or `alpha_entropy`
(DARTS, GDAS); a trial judging a path by shared weights reports `inherited: 1`. The ground truth is another
experiment folder (each trial's last result) or a table (.csv, .json, .jsonl, .parquet) with one column per
decision and one for the metric; architectures are matched by their decisions, numbers as numbers (`canonical`:
3, 3.0 and "3" are one decision). A table is read up to a row limit (`MAX_GROUND_TRUTH_ROWS`): a Parquet file's
is checked in its metadata before any row is read, and only the columns needed are read.
"""

from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import kendalltau, spearmanr

from nasplat.core.checks import check_int
from nasplat.core.trees import flatten
from nasplat.engine.result import ExperimentResult
from nasplat.report import plots
from nasplat.report.frame import ReportFrame, figure, fmt, na, table
from nasplat.storage import ROWS_FILE

TRAINING_MARKS = ("paths_trained", "alpha_entropy")
TABLE_SUFFIXES = (".csv", ".json", ".jsonl", ".parquet")
MAX_GROUND_TRUTH_ROWS = 1_000_000  # rows of a ground-truth table read at most (`--ground-truth-max-rows`)
BYTES_PER_ROW = 1024  # a Parquet file's columns may decompress to this many bytes a row of that limit, no more
NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _column(rows: pd.DataFrame, name: str) -> pd.Series:
    """`rows[name]` as numbers (NaN where absent or not a number)."""
    if name not in rows:
        return pd.Series(np.nan, index=rows.index, dtype=float)
    return pd.to_numeric(rows[name], errors="coerce")


def last_results(rows: pd.DataFrame, value: pd.Series) -> pd.DataFrame:
    """Each trial's last row (by order) where `value` is a number: `trial_id`, `config`, `value`."""
    kept = rows.assign(value=value)[value.notna()].sort_values("order")
    return kept.groupby("trial_id", sort=True).tail(1)[["trial_id", "config", "value"]].reset_index(drop=True)


def canonical(value: Any) -> Any:
    """A decision's value as architectures are matched on it: a number (or a string that reads as one) as an int
    when integral, else a float (3, 3.0 and "3" are one decision; float32's 0.1 is 0.1); lists and dicts (or
    strings holding them as JSON) item by item; a missing value as None; anything else as it is."""
    if isinstance(value, (list, tuple, np.ndarray)):
        return [canonical(v) for v in value]
    if isinstance(value, dict):
        return {str(k): canonical(v) for k, v in value.items()}
    if value is None or value is pd.NA or isinstance(value, (float, np.floating)) and math.isnan(value):
        return None
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        number = float(str(value))  # the shortest text of the value in its own precision
        return int(number) if number.is_integer() and abs(number) < 2**53 else number
    if isinstance(value, str):
        text = value.strip()
        if NUMBER.fullmatch(text):
            return canonical(float(text))
        if text[:1] in "[{":
            try:
                return canonical(json.loads(text))
            except ValueError:
                pass
    return value


def _texts(column: pd.Series) -> pd.Series:
    """Each value's `canonical` form as JSON text, worked out once per distinct value."""
    seen: dict[tuple[type, Any], str] = {}

    def text(value: Any) -> str:
        try:
            return seen[(type(value), value)]
        except KeyError:
            seen[(type(value), value)] = json.dumps(canonical(value), sort_keys=True, default=str)
            return seen[(type(value), value)]
        except TypeError:  # unhashable: a list, an array, a dict
            return json.dumps(canonical(value), sort_keys=True, default=str)

    return column.map(text).astype(str)


def with_decisions(frame: pd.DataFrame, decisions: list[str]) -> pd.DataFrame:
    """`frame` with a `key` column: its decisions' `canonical` values as a JSON list (a table and a config write
    values differently: 3, 3.0 and "3" are the same decision)."""
    if not decisions:
        return frame.assign(key="[]")
    columns = [_texts(frame[name]) for name in decisions]
    return frame.assign(key="[" + columns[0].str.cat(columns[1:], sep=",") + "]")


def _decoded_bytes(column: Any) -> int:
    """The bytes an Arrow column takes once every value is written out (a dictionary's values once per use)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    total = 0
    for chunk in column.chunks:
        if pa.types.is_dictionary(chunk.type) and len(chunk):
            total += pc.sum(pc.take(pc.binary_length(chunk.dictionary), chunk.indices)).as_py() or 0
        else:
            total += chunk.nbytes
    return total


def _read_parquet(path: Path, columns: list[str], max_rows: int) -> pd.DataFrame:
    """Those of `columns` that the Parquet file has: refused by its metadata beyond `max_rows` rows or beyond
    `BYTES_PER_ROW` bytes a row of that limit decompressed, before any row is read; read with repeated strings
    kept once (as dictionaries) and refused beyond that size again once each value is counted where it is used."""
    import pyarrow.parquet as pq

    limit = max_rows * BYTES_PER_ROW
    parquet = pq.ParquetFile(path, read_dictionary=columns)
    meta = parquet.metadata
    if meta.num_rows > max_rows:
        raise ValueError(f"the ground truth {str(path)!r} holds {meta.num_rows:,} rows, more than the limit of "
                         f"{max_rows:,} (--ground-truth-max-rows to raise it)")
    present = [name for name in columns if name in parquet.schema_arrow.names]
    indices = [i for i in range(meta.num_columns) if meta.schema.column(i).path.split(".")[0] in present]
    stored = sum(meta.row_group(g).column(i).total_uncompressed_size
                 for g in range(meta.num_row_groups) for i in indices)
    table = parquet.read(columns=present) if stored <= limit else None
    size = stored if table is None else sum(_decoded_bytes(table.column(name)) for name in present)
    if table is None or size > limit:  # no table only when the stored size was over the limit
        raise ValueError(f"the ground truth {str(path)!r}: its columns {present} decompress to {size:,} bytes, "
                         f"more than the limit of {limit:,} ({BYTES_PER_ROW} bytes a row of --ground-truth-max-rows "
                         f"{max_rows:,})")
    frame = table.to_pandas()
    return frame.astype({name: object for name in frame if isinstance(frame[name].dtype, pd.CategoricalDtype)})


def read_table(path: Path, columns: list[str], max_rows: int = MAX_GROUND_TRUTH_ROWS) -> pd.DataFrame:
    """Those of `columns` that the table file `path` has, refused in one line beyond `max_rows` rows: a Parquet file
    by its metadata before any row is read (and beyond `BYTES_PER_ROW` bytes a row of that limit, see
    `_read_parquet`), a CSV or JSON-lines file by reading at most `max_rows + 1` rows; a .json file is one document,
    read whole."""
    if path.suffix == ".parquet":
        return _read_parquet(path, columns, max_rows)
    if path.suffix == ".csv":
        header = pd.read_csv(path, nrows=0).columns
        frame = pd.read_csv(path, usecols=[name for name in columns if name in header], nrows=max_rows + 1)
    elif path.suffix == ".jsonl":
        frame = pd.read_json(path, lines=True, nrows=max_rows + 1)
    else:
        frame = pd.read_json(path)
    if len(frame) > max_rows:
        raise ValueError(f"the ground truth {str(path)!r} holds more than {max_rows:,} rows, the limit "
                         f"(--ground-truth-max-rows to raise it)")
    return frame[[name for name in columns if name in frame]]


def load_ground_truth(source: str | Path, decisions: list[str], metric: str,
                      max_rows: int = MAX_GROUND_TRUTH_ROWS) -> pd.DataFrame:
    """Standalone results: `key` (the decisions, see `with_decisions`) and `standalone` (the mean of `metric` where
    an architecture appears several times), in the order they first appear, from an experiment folder or a table
    file of at most `max_rows` rows (see `read_table`)."""
    check_int("--ground-truth-max-rows", max_rows, minimum=1)
    path = Path(source)
    if (path / ROWS_FILE).exists():
        result = ExperimentResult.load(path)
        rows = result.dataframe()
        rows["order"] = np.arange(len(rows))
        last = last_results(rows, _column(rows, metric))
        frame = pd.DataFrame([flatten(c) for c in last["config"]]).assign(**{metric: last["value"].to_numpy()})
    elif path.suffix in TABLE_SUFFIXES and path.is_file():
        frame = read_table(path, [*decisions, metric], max_rows)
    else:
        raise ValueError(f"the ground truth must be an experiment folder or a table file "
                         f"({', '.join(TABLE_SUFFIXES)}), got {str(source)!r}")
    missing = [name for name in [*decisions, metric] if name not in frame]
    if missing:
        raise ValueError(f"the ground truth {str(source)!r} lacks {missing}: it needs a column for each decision "
                         f"{decisions} and for {metric!r}")
    frame = with_decisions(frame.assign(standalone=pd.to_numeric(frame[metric], errors="coerce")), decisions)
    return frame.dropna(subset=["standalone"]).groupby("key", as_index=False, sort=False)["standalone"].mean()


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


def _example(key: str, decisions: list[str]) -> dict[str, Any]:
    """An architecture's decisions as a dict, from its `key`."""
    return dict(zip(decisions, json.loads(key)))


def truth_part(exp: ReportFrame, source: str | Path, metric: str | None = None,
               max_rows: int = MAX_GROUND_TRUTH_ROWS) -> str:
    """This search's metric against the ground truth's over the architectures both have, with the rank correlation;
    a one-line note where fewer than 3 match (naming an architecture of each side where none does)."""
    metric = metric or exp.metric
    searched = last_results(exp.rows, exp.rows["value"]).sort_values("trial_id")
    if searched.empty:
        return na(f"Ground truth {source}: no trial here reported {exp.metric} yet, nothing to compare.")
    configs = pd.DataFrame([flatten(c) for c in searched["config"]])
    decisions = sorted(configs.columns, key=str)
    truth = load_ground_truth(source, decisions, metric, max_rows)
    here = with_decisions(configs.assign(searched=searched["value"].to_numpy()), decisions)
    here = here.groupby("key", as_index=False, sort=False)["searched"].mean()
    pairs = here.merge(truth, on="key")
    if pairs.empty:
        there = f", there {_example(truth['key'].iloc[0], decisions)}" if len(truth) else ""
        return na(f"Ground truth {source}: none of its {len(truth)} architectures is one of the {len(here)} here "
                  f"(matched on {decisions}, numbers as numbers; e.g. here {_example(here['key'].iloc[0], decisions)}"
                  f"{there}): nothing to compare.")
    if len(pairs) < 3:
        return na(f"Ground truth {source}: {len(pairs)} of the {len(here)} architectures here have a standalone "
                  f"{metric} there; a rank correlation needs 3 or more.")
    tau = kendalltau(pairs["searched"], pairs["standalone"])
    spearman = spearmanr(pairs["searched"], pairs["standalone"])
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
                    ground_truth_metric: str | None = None, ground_truth_max_rows: int = MAX_GROUND_TRUTH_ROWS) -> str:
    """The weight-sharing section: whichever of training curve, path search and ground truth apply."""
    parts = [pipeline_part(exp), training_part(exp), search_part(exp)]
    if ground_truth is not None:
        parts.append(truth_part(exp, ground_truth, ground_truth_metric, ground_truth_max_rows))
    body = "".join(parts)
    return body or na("No supernet training (rows with paths_trained or alpha_entropy) and no search over shared "
                      "weights (rows with inherited) here; give a ground truth (--ground-truth) to compare any "
                      "search's metric with standalone results.")

