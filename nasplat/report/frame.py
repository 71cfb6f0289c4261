"""What every report section shares: the experiment folder read into frames, and the HTML building blocks
(tables, figures, one-line notes) the sections are made of."""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from nasplat.core.checks import is_real
from nasplat.core.rows import Status
from nasplat.core.trees import flatten
from nasplat.engine.result import ExperimentResult

MAX_TABLE_ROWS = 2000


@dataclass
class ReportFrame:
    """An experiment folder's rows as a frame, with `value` the metric (NaN when failed or missing)."""

    folder: Path
    meta: dict[str, Any]
    metric: str
    mode: str
    result: ExperimentResult
    rows: pd.DataFrame

    @classmethod
    def load(cls, folder: str | Path) -> ReportFrame:
        folder = Path(folder)
        result = ExperimentResult.load(folder)
        meta = json.loads((folder / "meta.json").read_text()) if (folder / "meta.json").exists() else {}
        if not result.metric:
            raise ValueError(f"{folder / 'meta.json'} must name the experiment's `metric`; got meta {meta!r}")
        if result.mode not in ("max", "min"):
            raise ValueError(f"mode in {folder / 'meta.json'} must be 'max' or 'min', got {result.mode!r}")
        rows = result.dataframe()
        rows["order"] = np.arange(len(rows))
        value = pd.to_numeric(rows[result.metric], errors="coerce") if result.metric in rows else np.nan
        rows["value"] = pd.Series(value, index=rows.index, dtype=float).replace([np.inf, -np.inf], np.nan)
        rows.loc[rows["status"].astype(str).isin([Status.FAILED.value, Status.RETRIED.value]), "value"] = np.nan
        return cls(folder, meta, result.metric, result.mode, result, rows)

    @property
    def ok(self) -> pd.DataFrame:
        return self.rows[self.rows["value"].notna()]

    def trials(self) -> pd.DataFrame:
        """One row per trial: its first config, parent, final status, best value and number of steps."""
        grouped = self.rows.sort_values("order").groupby("trial_id", sort=True)
        frame = grouped.agg(config=("config", "first"), parent_id=("parent_id", "first"),
                            status=("status", "last"), steps=("step", "max")).reset_index()
        best = self.ok.groupby("trial_id")["value"].agg("max" if self.mode == "max" else "min")
        frame["value"] = frame["trial_id"].map(best)
        return frame


def diff(old: Any, new: Any) -> list[tuple[str, Any, Any]]:
    """The decisions that differ between two configs: (key, old value, new value); '—' where absent."""
    a, b = flatten(old), flatten(new)
    keys = sorted(set(a) | set(b), key=str)
    return [(k, a.get(k, "—"), b.get(k, "—")) for k in keys if a.get(k, "—") != b.get(k, "—")]


def fmt(value: Any) -> str:
    if not is_real(value):
        return "—" if value is None else str(value)
    if isinstance(value, (float, np.floating)) and math.isnan(value):
        return "—"
    if isinstance(value, (int, np.integer)) or float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.4g}"


def changes_text(changes: list[tuple[str, Any, Any]]) -> str:
    return "; ".join(f"{k}: {fmt(a)} → {fmt(b)}" for k, a, b in changes) or "(no change)"


def table(frame: pd.DataFrame, *, caption: str = "", limit: int = MAX_TABLE_ROWS) -> str:
    """A pandas HTML table (values escaped), cut at `limit` rows with a note saying how many were left out."""
    note = f"<p class='note'>{len(frame) - limit} more rows not shown.</p>" if len(frame) > limit else ""
    body = frame.head(limit).map(fmt).to_html(index=False, escape=True, border=0, classes="data")
    head = f"<p class='caption'>{html.escape(caption)}</p>" if caption else ""
    return head + body + note


def na(text: str) -> str:
    return f"<p class='na'>{html.escape(text)}</p>"


def figure(svg: str, caption: str) -> str:
    return f"<figure>{svg}<figcaption>{html.escape(caption)}</figcaption></figure>"
