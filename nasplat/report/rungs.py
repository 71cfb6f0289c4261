"""The report's rung section: how far trials got under ASHA / Hyperband, and the promotion thresholds over time.

Everything is read from the folder: the rungs from `meta.json`'s `schedule` (written by `nasplat.run` when a
scheduler wraps the controller), pauses from the rows' status, promotions from `journal.jsonl`'s `resume` entries.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from nasplat.core.rows import Status
from nasplat.report import plots
from nasplat.report.frame import ReportFrame, figure, na, table
from nasplat.storage import JOURNAL_FILE, read_rows


def rung_steps(schedule: dict[str, Any]) -> list[int]:
    """Every bracket's rung steps, and `max_steps`, ascending."""
    return sorted({int(s) for bracket in schedule.get("rungs", []) for s in bracket} | {int(schedule["max_steps"])})


def thresholds(ok: pd.DataFrame, steps: list[int], schedule: dict[str, Any], mode: str) -> pd.DataFrame:
    """For each rung below `max_steps`, after each arrival (by end time): the score a trial had to reach there.
    `promote`: the worst score in the top floor(n / reduction_factor) of the n arrivals so far (none while n <
    reduction_factor); `stop`: the (1 - 1/reduction_factor) quantile of the earlier arrivals, as ASHA cuts."""
    rf, sign = int(schedule["reduction_factor"]), 1.0 if mode == "max" else -1.0
    out = []
    for rung, step in enumerate(steps[:-1]):
        arrivals = ok[ok["step"] == step].sort_values(["end", "order"])
        seen: list[float] = []
        for end, value in zip(arrivals["end"], arrivals["value"]):
            if schedule.get("type") == "stop":
                cut = float(np.percentile(seen, (1 - 1 / rf) * 100)) if seen else np.nan
                seen.append(sign * value)
            else:
                seen.append(sign * value)
                top = len(seen) // rf
                cut = sorted(seen, reverse=True)[top - 1] if top else np.nan
            out.append({"rung": rung, "step": step, "end": end, "threshold": sign * cut})
    return pd.DataFrame(out, columns=["rung", "step", "end", "threshold"])


def promotions(exp: ReportFrame) -> pd.DataFrame:
    """One row per promotion: the trial, the step it had paused at, when it was resumed (executor clock)."""
    path = exp.folder / JOURNAL_FILE
    entries = [e for e in read_rows(path) if "resume" in e] if path.exists() else []
    out = []
    for entry in entries:
        before = exp.rows[(exp.rows["trial_id"] == entry["resume"]) & (exp.rows["order"] < int(entry["rows"]))]
        out.append({"trial": int(entry["resume"]), "from step": int(before["step"].max()) if len(before) else 0,
                    "time": entry.get("time")})
    return pd.DataFrame(out, columns=["trial", "from step", "time"])


def rungs_section(exp: ReportFrame) -> str:
    """Trials per rung (reached, paused there now, promoted from it) and the thresholds over time."""

    schedule = exp.meta.get("schedule") or {}
    if "rungs" not in schedule:
        return na("No rung schedule (no ASHA or Hyperband scheduler): trials ran until their controller or "
                  "max_steps ended them.")
    steps, ok = rung_steps(schedule), exp.ok
    reached = ok.groupby("trial_id")["step"].max()
    final = exp.rows.sort_values("order").groupby("trial_id")["status"].last()
    promoted = promotions(exp)
    counts = pd.DataFrame([{
        "rung": i, "step": step, "trials reached": int((reached >= step).sum()),
        "paused there now": int(((reached == step) & (final.reindex(reached.index) == Status.PAUSED)).sum()),
        "promoted from it": int((promoted["from step"] == step).sum()),
        "stopped there": int(((reached == step) & (final.reindex(reached.index) == Status.STOPPED)).sum()),
    } for i, step in enumerate(steps)])
    cuts = thresholds(ok, steps, schedule, exp.mode)
    parts = [table(counts, caption=f"ASHA ({schedule.get('type')}, reduction factor {schedule['reduction_factor']}) "
                                   f"rungs at steps {steps[:-1]}, max_steps {steps[-1]}: trials that reached each "
                                   f"rung; {len(promoted)} promotions.")]
    if cuts["threshold"].notna().any():
        parts.append(figure(plots.rung_thresholds(cuts, exp.metric),
                            f"The {exp.metric} a trial needed at each rung to be promoted (promote: the worst of the "
                            "rung's top 1/reduction factor) or to go on (stop: the cut ASHA applied), after each "
                            "arrival, against the executor clock."))
    per_trial = pd.DataFrame({"trial": reached.index, "steps": reached.to_numpy(),
                              "rung reached": [sum(s <= r for s in steps) - 1 for r in reached],
                              "status": final.reindex(reached.index).to_numpy()})
    parts.append(f"<details><summary>Rung of every trial ({len(per_trial)})</summary>" + table(per_trial)
                 + "</details>")
    if len(promoted):
        parts.append(f"<details><summary>Promotions ({len(promoted)}): trial, the step it had paused at, when it "
                     "resumed</summary>" + table(promoted) + "</details>")
    return "".join(parts)
