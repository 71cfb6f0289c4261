"""The report's figures and stylesheet. Figures are drawn with matplotlib's object API (no pyplot, no global
backend) and inlined as SVG.

Every function takes tidy pandas frames prepared by `nasplat.report` and returns an `<svg>` string.
Plots with many marks are rasterized inside the SVG so a 10,000-trial experiment stays a few MB.
"""

from __future__ import annotations

import io
import re
import threading
from typing import cast

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.collections import LineCollection
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.text import Text

from nasplat.core.checks import is_real

RASTER_ABOVE = 1500  # marks per plot beyond which they are embedded as an image inside the SVG
RGB = tuple[float, float, float]


def _palette(name: str) -> tuple[RGB, ...]:
    """The colors of matplotlib's qualitative colormap `name` (`tab10`, `tab20`: a list of RGB triples)."""
    colormap = matplotlib.colormaps[name]
    if not isinstance(colormap, ListedColormap):
        raise ValueError(f"colormap {name!r} is a {type(colormap).__name__}, not a list of colors")
    return cast("tuple[RGB, ...]", colormap.colors)


TOP_COLORS = _palette("tab10")
GREY = "#b8bec6"
# The page's stylesheet (the report inlines it: no external files).
CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;margin:0 auto;max-width:1180px;padding:0 20px 40px;
  color:#1f2328}
h1{font-size:22px;margin:18px 0 4px}
h2{font-size:18px;border-bottom:1px solid #d0d7de;padding-bottom:4px;margin-top:30px}
nav a{margin-right:14px} dl{display:grid;grid-template-columns:max-content auto;gap:2px 14px} dt{color:#57606a}
dd{margin:0} figure{margin:8px 0} svg.plot{max-width:100%;height:auto} .na{color:#57606a;font-style:italic}
figcaption,.caption,.note{color:#57606a;font-size:12.5px} details summary{cursor:pointer;color:#0969da}
table.data{border-collapse:collapse;font-size:12.5px;margin:6px 0 12px} table.data th{background:#f6f8fa}
table.data th,table.data td{border:1px solid #d0d7de;padding:3px 7px;text-align:left}
"""
_RC_LOCK = threading.Lock()  # rc_context edits global rcParams; serve() may render from several threads


def to_svg(fig: Figure, name: str) -> str:
    """`fig` as an inline `<svg>` element (XML prolog dropped, text kept as text, ids salted by `name`). Every text
    set so far (labels, titles, legends: names from the folder) is shown as written, never read as mathtext (a
    metric `loss$\\frac{$` would not parse): its dollars are escaped. Tick labels, set while drawing, are untouched
    (a log axis writes its powers of ten in mathtext)."""
    for text in fig.findobj(Text):
        text.set_text(text.get_text().replace("$", r"\$"))
    with _RC_LOCK, matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": name}):
        buffer = io.StringIO()
        fig.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    svg = buffer.getvalue()
    svg = re.sub(r"<metadata>.*?</metadata>\s*", "", svg[svg.index("<svg"):], count=1, flags=re.DOTALL)
    svg = re.sub(r'\s+xmlns(:xlink)?="[^"]*"', "", svg)  # HTML parses inline SVG without namespace URLs
    return svg.replace("<svg ", f'<svg role="img" aria-label="{name}" class="plot" ', 1)


def _figure(width: float, height: float, ncols: int = 1) -> tuple[Figure, list]:
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    for ax in axes:
        ax.grid(True, color="#e6e9ee", linewidth=0.6)
        ax.set_axisbelow(True)
    return fig, list(axes)


def best_so_far(points: pd.DataFrame, metric: str, mode: str) -> str:
    """Two panels: the running best of `metric` against time and against trials evaluated.

    `points` has one row per successful step in finishing order: `end`, `n_trials`, `value`, `best`.
    """
    fig, (ax_time, ax_trials) = _figure(11, 3.6, ncols=2)
    many = len(points) > RASTER_ABOVE
    for ax, x, label in ((ax_time, "end", "time since start [s]"), (ax_trials, "n_trials", "trials evaluated")):
        ax.scatter(points[x], points["value"], s=6, color=GREY, alpha=0.7, label="each report", rasterized=many,
                   linewidths=0)
        ax.step(points[x], points["best"], where="post", color="#d62728", linewidth=1.8, label=f"best so far ({mode})")
        ax.set_xlabel(label)
        ax.set_ylabel(metric)
        if x == "end" and points[x].max() > 0 and points[x].min() >= 0:
            ax.set_xlim(left=0)
    ax_time.legend(loc="lower right" if mode == "max" else "upper right", fontsize=8)
    return to_svg(fig, "best-so-far")


def learning_curves(rows: pd.DataFrame, top_ids: list[int], exploits: pd.DataFrame, metric: str) -> str:
    """`metric` against step for every trial; the top trials coloured, exploit events marked with x."""
    fig, (ax,) = _figure(11, 4.2)
    top = set(top_ids)
    rest = [g.sort_values("step")[["step", "value"]].to_numpy() for t, g in rows.groupby("trial_id") if t not in top]
    if rest:
        ax.add_collection(LineCollection(rest, colors=GREY, linewidths=0.8, alpha=0.6,
                                         rasterized=sum(len(r) for r in rest) > RASTER_ABOVE))
        singles = np.concatenate(rest)
        ax.scatter(singles[:, 0], singles[:, 1], s=5, color=GREY, linewidths=0, rasterized=len(singles) > RASTER_ABOVE)
    for i, trial in enumerate(top_ids):
        curve = rows[rows["trial_id"] == trial].sort_values("step")
        ax.plot(curve["step"], curve["value"], marker="o", markersize=3, linewidth=1.6,
                color=TOP_COLORS[i % len(TOP_COLORS)], label=f"trial {trial}")
    if len(exploits):
        ax.scatter(exploits["step"], exploits["value"], marker="x", s=40, color="black", zorder=5,
                   label="exploit (weights copied)")
    ax.autoscale_view()
    ax.set_xlabel("step")
    ax.set_ylabel(metric)
    ax.legend(fontsize=7, ncol=2, loc="best", title="top trials", title_fontsize=7)
    return to_svg(fig, "learning-curves")


def schedules(rows: pd.DataFrame, keys: list[str], exploits: pd.DataFrame) -> str:
    """One panel per numeric hyperparameter: its value in each trial over steps (PBT's schedules).

    `rows` has `trial_id`, `step` and one column per key in `keys`; exploit events are drawn as x at the
    step they happened, on the value the trial continued with.
    """
    ncols = min(len(keys), 3)
    fig = Figure(figsize=(11, 3.2 * ((len(keys) + ncols - 1) // ncols)), layout="constrained")
    axes = fig.subplots((len(keys) + ncols - 1) // ncols, ncols, squeeze=False).ravel()
    trials = sorted(rows["trial_id"].unique())
    for ax, key in zip(axes, keys):
        ax.grid(True, color="#e6e9ee", linewidth=0.6)
        for i, trial in enumerate(trials):
            curve = rows[rows["trial_id"] == trial].sort_values("step")
            ax.step(curve["step"], curve[key], where="pre", linewidth=1.4, color=TOP_COLORS[i % len(TOP_COLORS)],
                    label=f"trial {trial}", marker="o", markersize=2.5)
        for _, event in exploits.iterrows():
            after = event.get(f"after.{key}")
            if is_real(after):
                ax.scatter([event["step"]], [after], marker="x", s=45, color="black", zorder=5)
        positive = pd.to_numeric(rows[key], errors="coerce").dropna()
        if len(positive) and (positive > 0).all() and positive.max() / positive.min() > 20:
            ax.set_yscale("log")
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("step")
    for ax in axes[len(keys):]:
        ax.set_visible(False)
    if len(trials) <= 12:
        axes[0].legend(fontsize=7, ncol=2)
    return to_svg(fig, "pbt-schedules")


def lineage(trials: pd.DataFrame, edges: pd.DataFrame, ancestry: list[int], metric: str) -> str:
    """The evolution tree: each trial at (trial id, best `metric`), a line from parent to child coloured by
    the decision the mutation changed; the best trial's line of ancestors drawn thick.

    `trials` has `trial_id`, `value`; `edges` has `parent_id`, `trial_id`, `changed` (a decision or a label).
    """
    fig, (ax,) = _figure(11.5, 4.8)
    value = trials.set_index("trial_id")["value"]
    many = len(trials) > RASTER_ABOVE
    ax.scatter(trials["trial_id"], trials["value"], s=7, color="#7f8a99", linewidths=0, zorder=3, rasterized=many)
    known = edges[edges["parent_id"].isin(value.index) & edges["trial_id"].isin(value.index)]
    kinds = known["changed"].value_counts().index.tolist()
    palette = _palette("tab10" if len(kinds) <= 10 else "tab20")
    for i, kind in enumerate(kinds):
        part = known[known["changed"] == kind]
        segments = [[(p, value[p]), (c, value[c])] for p, c in zip(part["parent_id"], part["trial_id"])]
        color = palette[i % len(palette)] if i < 19 else GREY
        ax.add_collection(LineCollection(segments, colors=[color], linewidths=0.7, alpha=0.75,
                                         label=kind if i < 19 else None, rasterized=len(known) > RASTER_ABOVE))
    chain = [t for t in ancestry if t in value.index]
    if len(chain) > 1:
        ax.plot(chain, [value[t] for t in chain], color="#d62728", linewidth=2.4, marker="o", markersize=4,
                zorder=4, label="ancestry of the best trial")
    ax.autoscale_view()
    ax.set_xlabel("trial id (birth order)")
    ax.set_ylabel(f"best {metric} of the trial")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="decision mutated",
              title_fontsize=7)
    return to_svg(fig, "lineage")


def pareto_front(trials: pd.DataFrame, front: pd.DataFrame, metrics: list[str], modes: list[str]) -> str:
    """Every trial in the plane of the first two objectives (feasible grey, infeasible hollow), the front joined
    by a step line in red. `trials` and `front` have one column per metric and `feasible`."""
    fig, (ax,) = _figure(7, 4.6)
    x, y = metrics[:2]
    many = len(trials) > RASTER_ABOVE
    ok = trials[trials["feasible"]]
    ax.scatter(ok[x], ok[y], s=10, color=GREY, linewidths=0, label="trial", rasterized=many)
    broken = trials[~trials["feasible"]]
    if len(broken):
        ax.scatter(broken[x], broken[y], s=12, facecolors="none", edgecolors="#8c959f", linewidths=0.7,
                   label="breaks a constraint", rasterized=many)
    line = front.sort_values(x)
    ax.step(line[x], line[y], where="post" if modes[0] == "min" else "pre",  # the edge of the dominated region
            color="#d62728", linewidth=1.2, alpha=0.7)
    ax.scatter(line[x], line[y], s=22, color="#d62728", zorder=5, label=f"Pareto front ({len(line)})")
    ax.set_xlabel(f"{x} ({modes[0]})")
    ax.set_ylabel(f"{y} ({modes[1]})")
    ax.legend(fontsize=8)
    return to_svg(fig, "pareto-front")


def hypervolume_curve(points: pd.DataFrame) -> str:
    """Two panels: the hypervolume of the feasible front so far against time and against trials evaluated.
    `points` has `end`, `n_trials` and `hypervolume`."""
    fig, (ax_time, ax_trials) = _figure(11, 3.2, ncols=2)
    for ax, x, label in ((ax_time, "end", "time since start [s]"), (ax_trials, "n_trials", "trials evaluated")):
        ax.step(points[x], points["hypervolume"], where="post", color="#d62728", linewidth=1.8)
        ax.set_xlabel(label)
        ax.set_ylabel("hypervolume")
    return to_svg(fig, "hypervolume")


def rung_thresholds(cuts: pd.DataFrame, metric: str) -> str:
    """One step line per rung: the threshold after each arrival against time."""
    fig, (ax,) = _figure(11, 3.6)
    for i, (rung, group) in enumerate(cuts.groupby("rung")):
        ax.step(group["end"], group["threshold"], where="post", linewidth=1.6, color=TOP_COLORS[i % len(TOP_COLORS)],
                label=f"rung {rung} (step {int(group['step'].iloc[0])})")
    ax.set_xlabel("time (executor clock, s)")
    ax.set_ylabel(f"{metric} needed")
    ax.legend(fontsize=7, loc="best")
    return to_svg(fig, "rung-thresholds")


def supernet_curves(curves: pd.DataFrame) -> str:
    """Two panels, one line per supernet training trial: `train_loss` and `valid_acc` (a band from `valid_acc_min`
    to `valid_acc_max` where given) against `epoch`."""
    fig, (ax_loss, ax_acc) = _figure(11, 3.4, ncols=2)
    for i, (trial, group) in enumerate(curves.groupby("trial_id", sort=True)):
        color = TOP_COLORS[i % len(TOP_COLORS)]
        ax_loss.plot(group["epoch"], group["train_loss"], color=color, linewidth=1.4, label=f"trial {trial}")
        ax_acc.plot(group["epoch"], group["valid_acc"], color=color, linewidth=1.4, marker=".", markersize=4)
        if group["valid_acc_min"].notna().any():
            ax_acc.fill_between(group["epoch"], group["valid_acc_min"], group["valid_acc_max"], color=color,
                                alpha=0.15, linewidth=0)
    ax_loss.set_ylabel("training loss")
    ax_acc.set_ylabel("valid_acc of the judged paths")
    for ax in (ax_loss, ax_acc):
        ax.set_xlabel("epoch")
    ax_loss.legend(fontsize=7, loc="upper right")
    return to_svg(fig, "supernet-curves")


def path_search(points: pd.DataFrame, metric: str) -> str:
    """Two panels: each judged path's `value` against `n` (trial order) with the running `best`, and against
    `params` (its parameter count)."""
    fig, (ax_order, ax_params) = _figure(11, 3.4, ncols=2)
    many = len(points) > RASTER_ABOVE
    ax_order.scatter(points["n"], points["value"], s=7, color=GREY, linewidths=0, rasterized=many, label="a path")
    ax_order.step(points["n"], points["best"], where="post", color="#d62728", linewidth=1.8, label="best so far")
    ax_order.set_xlabel("paths judged")
    ax_order.legend(fontsize=8, loc="lower right")
    ax_params.scatter(points["params"], points["value"], s=7, color="#1f77b4", linewidths=0, rasterized=many)
    ax_params.set_xlabel("parameters of the path")
    for ax in (ax_order, ax_params):
        ax.set_ylabel(f"inherited {metric}")
    return to_svg(fig, "path-search")


def inherited_vs_standalone(pairs: pd.DataFrame, x_label: str, y_label: str) -> str:
    """One dot per architecture: `searched` (x) against `standalone` (y)."""
    fig, (ax,) = _figure(6, 4.4)
    ax.scatter(pairs["searched"], pairs["standalone"], s=14, color="#1f77b4", linewidths=0,
               rasterized=len(pairs) > RASTER_ABOVE)
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    return to_svg(fig, "inherited-vs-standalone")
