"""Several objectives: non-dominated sorting, crowding distance, exact hypervolume, metric constraints.

Every function here takes points as an (n, m) array of *maximised* objectives (controllers flip the sign of
`mode="min"` metrics once, before calling them); a point dominates another if it is at least as good in every
objective and better in one. Constraints are metric thresholds (`params <= 1.0`); a result's total violation
is the sum over constraints of how far it lies beyond each threshold (0: feasible).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nasplat.core.checks import (
    EXPERIMENT_MODES,
    is_real,
    parse_objectives,  # noqa: F401 (re-exported: the objectives are checked there)
    received,
)
from nasplat.core.rows import Status

MODES = EXPERIMENT_MODES
OPERATORS = ("<=", ">=")


# -- objectives and constraints ---------------------------------------------------------------------
@dataclass(frozen=True)
class Constraint:
    """`metric <op> threshold`, with `op` one of `<=`, `>=`."""

    metric: str
    op: str
    threshold: float

    def violation(self, metrics: Mapping[str, Any]) -> float:
        """How far `metrics[metric]` lies beyond the threshold (0 when satisfied); inf when it is missing."""
        value = finite(metrics.get(self.metric))
        if value is None:
            return math.inf
        return max(0.0, value - self.threshold) if self.op == "<=" else max(0.0, self.threshold - value)

    def __str__(self) -> str:
        return f"{self.metric} {self.op} {self.threshold:g}"


_CONSTRAINT_TEXT = re.compile(r"^\s*([A-Za-z_][\w./-]*)\s*(<=|>=)\s*(\S+)\s*$")


def parse_constraints(spec: Any) -> tuple[Constraint, ...]:
    """Constraints from None, `"params <= 1.0"`, a list of such strings (or `Constraint`s), or a mapping
    `{"params": ("<=", 1.0)}`; a mistake names the entry, what was received and what is allowed.

    Numbers follow the rule of every number nasplat is given, where they are values of their own: a threshold in
    the mapping form must be a number, and a string (YAML reads `1e3` as the string '1e3') or a bool is refused
    with the same hint as elsewhere. Inside a constraint string the threshold is text that nasplat reads itself,
    with Python's float syntax (`params <= 1e3` is 1000.0): nothing there changes type silently, so `1e3`, `2e1`
    and `1.0e+3` all read as the numbers they spell."""
    if spec is None:
        return ()
    if isinstance(spec, (str, Constraint)):
        spec = [spec]
    items = list(spec.items()) if isinstance(spec, Mapping) else list(spec) if isinstance(spec, Sequence) else None
    if items is None:
        raise ValueError(f"constraints must be a list like ['params <= 1.0'] or a mapping like "
                         f"{{'params': ('<=', 1.0)}}, got {spec!r}")
    out = []
    for item in items:
        if isinstance(item, Constraint):
            out.append(item)
            continue
        if isinstance(item, str):
            match = _CONSTRAINT_TEXT.match(item)
            parts = match.groups() if match else None
        else:
            parts = (item[0], *item[1]) if isinstance(item, tuple) and len(item) == 2 and isinstance(
                item[1], Sequence) and not isinstance(item[1], str) and len(item[1]) == 2 else None
            if parts is not None and isinstance(parts[2], (str, bool)):
                raise ValueError(f"constraint {parts[0]!r}: the threshold must be a number, "
                                 f"{received('threshold', parts[2])}")
        threshold = finite(_number(parts[2])) if parts else None
        if parts is None or not isinstance(parts[0], str) or parts[1] not in OPERATORS or threshold is None:
            raise ValueError(f"a constraint must read '<metric> <= <number>' or '<metric> >= <number>' (as a string "
                             f"or a mapping entry metric: (op, number)), got {item!r}")
        out.append(Constraint(parts[0], parts[1], threshold))
    return tuple(out)


def _number(text: Any) -> Any:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def finite(value: Any) -> float | None:
    """`value` as a float if it is a finite real number (bools excluded), else None."""
    if not is_real(value):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def total_violation(constraints: Sequence[Constraint], metrics: Mapping[str, Any]) -> float:
    """The sum of the constraints' violations: 0 when every constraint holds."""
    return float(sum(c.violation(metrics) for c in constraints))


def signs(modes: Sequence[str]) -> np.ndarray:
    """+1 for each `max`, -1 for each `min`: multiplying by it turns metric values into maximised objectives."""
    return np.array([1.0 if m == "max" else -1.0 for m in modes])


# -- ranking ----------------------------------------------------------------------------------------------
def _as_points(points: Any) -> np.ndarray:
    array = np.asarray(points, dtype=float)
    if array.ndim != 2:
        raise ValueError(f"points must be an (n, m) array of objective vectors, got shape {array.shape}")
    return array


def dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether maximised point `a` dominates `b`: no worse anywhere, better somewhere."""
    first, second = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return bool(np.all(first >= second) and np.any(first > second))


def non_dominated_mask(points: Any) -> np.ndarray:
    """True for each point that no other point dominates (equal points do not dominate each other)."""
    p = _as_points(points)
    mask = np.ones(len(p), dtype=bool)
    for i in range(len(p)):
        if mask[i]:
            dominated = np.all(p[i] >= p, axis=1) & np.any(p[i] > p, axis=1)
            mask &= ~dominated
    return mask


def non_dominated_sort(points: Any) -> np.ndarray:
    """Each point's front: 0 for the non-dominated points, 1 for those left non-dominated once front 0 is
    removed, and so on (Deb et al., 2002). Builds the n x n dominance matrix: meant for populations, not for
    thousands of points (`non_dominated_mask` finds one front in O(n) memory)."""
    p = _as_points(points)
    beats = np.all(p[:, None] >= p[None], axis=2) & np.any(p[:, None] > p[None], axis=2)  # [i, j]: i dominates j
    dominators = beats.sum(axis=0)
    ranks = np.full(len(p), -1)
    current, front = np.flatnonzero(dominators == 0), 0
    while len(current):
        ranks[current] = front
        dominators -= beats[current].sum(axis=0)
        dominators[current] = -1  # placed
        current, front = np.flatnonzero(dominators == 0), front + 1
    return ranks


def crowding_distance(points: Any) -> np.ndarray:
    """NSGA-II's crowding distance within one front: per objective, the gap between a point's two neighbours
    divided by the objective's range, summed; the extreme points of each objective get infinity."""
    p = _as_points(points)
    n = len(p)
    distance = np.zeros(n)
    if n <= 2:
        return np.full(n, math.inf)
    for j in range(p.shape[1]):
        order = np.argsort(p[:, j], kind="stable")
        values = p[order, j]
        span = values[-1] - values[0]
        distance[order[0]] = distance[order[-1]] = math.inf
        if span > 0:
            distance[order[1:-1]] += (values[2:] - values[:-2]) / span
    return distance


def rank_order(points: Any, violations: Sequence[float] | None = None) -> np.ndarray:
    """Indices of the points, best first: feasible points (violation 0) by front, then by crowding distance
    (larger first), then by index (older first); after them the infeasible ones by total violation, then index."""
    p = _as_points(points)
    v = np.zeros(len(p)) if violations is None else np.asarray(violations, dtype=float)
    feasible = np.flatnonzero(v <= 0)
    fronts = non_dominated_sort(p[feasible])
    crowding = np.zeros(len(feasible))
    for front in np.unique(fronts):
        members = fronts == front
        crowding[members] = crowding_distance(p[feasible][members])
    best = feasible[np.lexsort((feasible, -crowding, fronts))]
    infeasible = np.flatnonzero(v > 0)
    return np.concatenate([best, infeasible[np.lexsort((infeasible, v[infeasible]))]]).astype(int)


# -- hypervolume --------------------------------------------------------------------------------------------
def hypervolume(points: Any, reference: Sequence[float]) -> float:
    """The exact volume dominated by the maximised `points` and dominating `reference` (points that do not
    beat the reference in every objective add nothing). 2-D: a sweep; more objectives: slicing along the last
    objective (HSO, While et al., 2006), exact and fine for fronts of a few hundred points in 3-D."""
    p = _as_points(points)
    ref = np.asarray(reference, dtype=float)
    if ref.shape != (p.shape[1],) or not np.all(np.isfinite(ref)):
        raise ValueError(f"reference must be a finite point with one value per objective ({p.shape[1]}), "
                         f"got {reference!r}")
    gains = p[np.all(p > ref, axis=1)] - ref  # boxes from the origin, maximised
    return _volume(gains[non_dominated_mask(gains)]) if len(gains) else 0.0


def _volume(gains: np.ndarray) -> float:
    """Volume of the union of the boxes [0, g] for the non-dominated, positive rows g of `gains`."""
    if len(gains) == 0:
        return 0.0
    if gains.shape[1] == 1:
        return float(gains.max())
    if gains.shape[1] == 2:
        order = np.argsort(-gains[:, 0], kind="stable")  # x falling, so y rises along a non-dominated front
        x, y = gains[order, 0], gains[order, 1]
        return float(np.sum(x * np.diff(np.concatenate([[0.0], y]))))
    order = np.argsort(-gains[:, -1], kind="stable")  # slices from the top of the last objective down
    g = gains[order]
    total = 0.0
    for i in range(len(g)):
        depth = g[i, -1] - (g[i + 1, -1] if i + 1 < len(g) else 0.0)
        if depth > 0:
            above = g[:i + 1, :-1]
            total += depth * _volume(above[non_dominated_mask(above)])
    return total


# -- experiment rows ------------------------------------------------------------------------------------------
def trial_rows(rows: Sequence[Mapping[str, Any]], metrics: Sequence[str]) -> list[Mapping[str, Any]]:
    """Each trial's latest row that did not fail (nor a retry go back over it) and holds a finite value for every
    one of `metrics`."""
    latest: dict[Any, Mapping[str, Any]] = {}
    for row in rows:
        if row.get("status") not in (Status.FAILED, Status.RETRIED) and all(
                finite(row.get(m)) is not None for m in metrics):
            latest[row["trial_id"]] = row
    return list(latest.values())


def front_rows(rows: Sequence[Mapping[str, Any]], metrics: Sequence[str], modes: Sequence[str],
               constraints: Sequence[Constraint] = ()) -> list[Mapping[str, Any]]:
    """The Pareto front of the trials' latest rows (`trial_rows`), best first by the first metric: the
    non-dominated feasible rows when any row is feasible; otherwise the non-dominated rows among those that
    violate the constraints least."""
    candidates = trial_rows(rows, metrics)
    if not candidates:
        return []
    violations = np.array([total_violation(constraints, row) for row in candidates])
    keep = np.flatnonzero(violations == violations.min())
    points = np.array([[float(candidates[i][m]) for m in metrics] for i in keep]) * signs(modes)
    front = keep[non_dominated_mask(points)]
    best_first = sorted(front, key=lambda i: (-float(candidates[i][metrics[0]]) * signs(modes)[0],
                                              str(candidates[i]["trial_id"])))
    return [candidates[i] for i in best_first]


def rows_hypervolume(rows: Sequence[Mapping[str, Any]], metrics: Sequence[str], modes: Sequence[str],
                     reference: Sequence[float], constraints: Sequence[Constraint] = ()) -> float:
    """The hypervolume, in metric units, that the feasible rows among `rows` dominate up to `reference` (one
    value per metric, worse than the front in every metric: below it for `max`, above it for `min`)."""
    feasible = [r for r in trial_rows(rows, metrics) if total_violation(constraints, r) == 0]
    if len(reference) != len(metrics):
        raise ValueError(f"reference_point needs one value per metric {list(metrics)}, got {reference!r}")
    points = np.array([[float(r[m]) for m in metrics] for r in feasible]).reshape(-1, len(metrics))
    return hypervolume(points * signs(modes), np.asarray(reference, dtype=float) * signs(modes))


def ranked_rows(rows: Sequence[Mapping[str, Any]], metric: str, mode: str,
                constraints: Sequence[Constraint] = ()) -> list[Mapping[str, Any]]:
    """The best row of each trial by `metric` (its earliest such row), best trial first; failed and retried rows
    and missing or non-finite values left out; with constraints, trials that break them come last, by total
    violation. Ties go to the earliest trial (the lowest trial id): the one rule for "the best" everywhere."""
    best: dict[Any, Mapping[str, Any]] = {}
    for row in rows:
        value = row.get(metric)
        if row.get("status") in (Status.FAILED, Status.RETRIED) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            continue
        current = best.get(row["trial_id"])
        if current is None or better(value, current[metric], mode):
            best[row["trial_id"]] = row
    sign = -1 if mode == "max" else 1
    return sorted(best.values(), key=lambda r: (total_violation(constraints, r), sign * r[metric], r["trial_id"]))


def tied_best(ranked: Sequence[Mapping[str, Any]], metric: str, constraints: Sequence[Constraint] = ()) -> list[Any]:
    """The trial ids of `ranked` (`ranked_rows`' order) that tie with the first on `metric` and on violation: the
    best and those it won against by the tie rule alone (an empty list when nothing ranked)."""
    if not ranked:
        return []
    first = ranked[0]
    key = (total_violation(constraints, first), first[metric])
    return [r["trial_id"] for r in ranked if (total_violation(constraints, r), r[metric]) == key]


def better(a: float, b: float, mode: str) -> bool:
    """Whether `a` beats `b` under `mode`."""
    return a > b if mode == "max" else a < b
