"""nasplat.core.pareto against hand-worked fronts, and hypervolume against an independent count of unit cells."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from nasplat.core.pareto import (
    Constraint,
    crowding_distance,
    dominates,
    front_rows,
    hypervolume,
    non_dominated_mask,
    non_dominated_sort,
    parse_constraints,
    parse_objectives,
    rank_order,
    rows_hypervolume,
)

# Maximised points: A, B, C and G (a copy of C) are non-dominated; D and E only by front 0; F by everything.
POINTS = np.array([[1, 5], [2, 4], [3, 3], [1, 4], [2, 2], [0, 0], [3, 3]], dtype=float)
STAIRCASE = np.array([[1, 5], [2, 4], [3, 3], [5, 1]], dtype=float)


def test_dominance_is_strict_somewhere() -> None:
    assert dominates([2, 4], [1, 4]) and not dominates([1, 4], [2, 4])
    assert not dominates([3, 3], [3, 3])  # equal points do not dominate each other
    assert not dominates([1, 5], [2, 4]) and not dominates([2, 4], [1, 5])


def test_non_dominated_sort_hand_worked() -> None:
    assert non_dominated_mask(POINTS).tolist() == [True, True, True, False, False, False, True]
    assert non_dominated_sort(POINTS).tolist() == [0, 0, 0, 1, 1, 2, 0]
    assert non_dominated_sort(np.array([[float(k)] for k in (3, 1, 2)])).tolist() == [0, 2, 1]  # one objective
    assert non_dominated_sort(np.zeros((0, 2))).tolist() == []


def test_crowding_distance_hand_worked() -> None:
    """Per objective the range is 4: (2, 4) gets (3-1)/4 + (5-3)/4 = 1.0, (3, 3) gets (5-2)/4 + (4-1)/4 = 1.5."""
    distance = crowding_distance(STAIRCASE)
    assert distance[0] == distance[3] == math.inf
    assert distance[1] == pytest.approx(1.0) and distance[2] == pytest.approx(1.5)
    assert crowding_distance(STAIRCASE[:2]).tolist() == [math.inf, math.inf]
    flat = crowding_distance(np.array([[1.0, 7.0], [2.0, 7.0], [3.0, 7.0]]))  # no spread in objective 2: adds 0
    assert flat[1] == pytest.approx(1.0)


def test_rank_order_front_then_crowding_then_age_and_infeasible_last() -> None:
    order = rank_order(STAIRCASE)
    assert order.tolist() == [0, 3, 2, 1]  # extremes (inf, older first), then 1.5, then 1.0
    violations = [0.0, 0.0, 0.5, 0.0]  # (3, 3) breaks a constraint by 0.5
    with_dominated = np.vstack([STAIRCASE, [[0.0, 0.0]]])
    order = rank_order(with_dominated, violations + [2.0])
    assert order.tolist() == [0, 3, 1, 2, 4]  # feasible: extremes, then (2, 4); then by violation
    assert rank_order(np.array([[9.0, 9.0], [0.0, 0.0]]), [1.0, 0.0]).tolist() == [1, 0]  # feasible beats better


def test_hypervolume_2d_hand_worked() -> None:
    """The staircase under (1,5), (2,4), (3,3), (5,1) from (0,0): heights 5, 4, 3, 1, 1 on unit widths = 14."""
    assert hypervolume(STAIRCASE, [0, 0]) == pytest.approx(14.0)
    noisy = np.vstack([STAIRCASE, [[1, 1], [-1, 10], [3, 3]]])  # a dominated point, one behind the reference, a copy
    assert hypervolume(noisy, [0, 0]) == pytest.approx(14.0)
    assert hypervolume(STAIRCASE, [1, 1]) == pytest.approx(5.0)  # (1,5), (5,1) touch the reference: 1*3 + 1*2
    assert hypervolume(np.zeros((0, 2)), [0, 0]) == 0.0
    with pytest.raises(ValueError, match="one value per objective"):
        hypervolume(STAIRCASE, [0, 0, 0])


def test_hypervolume_3d_hand_worked() -> None:
    """Three boxes of volume 2 meeting in the unit cube: 6 - 3 * 1 + 1 = 4 (inclusion-exclusion)."""
    assert hypervolume(np.array([[2, 1, 1], [1, 2, 1], [1, 1, 2]]), [0, 0, 0]) == pytest.approx(4.0)
    assert hypervolume(np.array([[3, 2, 1]]), [0, 0, 0]) == pytest.approx(6.0)
    # A 2-cube plus three 3x1x1 bars sticking out of it, one cell each: 8 + 3 = 11.
    points = np.array([[3, 1, 1], [1, 3, 1], [1, 1, 3], [2, 2, 2]])
    assert hypervolume(points, [0, 0, 0]) == pytest.approx(11.0)
    assert hypervolume(points - 0.5, [-0.5, -0.5, -0.5]) == pytest.approx(11.0)  # shifting changes nothing


@pytest.mark.parametrize("dims", [2, 3, 4])
def test_hypervolume_equals_the_count_of_dominated_unit_cells(dims: int) -> None:
    """Integer points from 0: the volume is the number of unit cells [c, c+1] inside some point's box."""
    rng = np.random.default_rng(dims)
    for _ in range(15):
        points = rng.integers(0, 6, size=(int(rng.integers(1, 12)), dims)).astype(float)
        cells = np.array(list(itertools.product(range(6), repeat=dims)))  # lower corners; cell inside iff p >= c+1
        covered = np.any(np.all(points[None, :, :] >= cells[:, None, :] + 1, axis=2), axis=1)
        assert hypervolume(points, np.zeros(dims)) == pytest.approx(float(covered.sum()))


def test_parse_objectives_and_constraints() -> None:
    assert parse_objectives("acc", "max") == (("acc",), ("max",))
    assert parse_objectives(["acc", "params"], ["max", "min"]) == (("acc", "params"), ("max", "min"))
    assert parse_objectives(["a", "b"], "min") == (("a", "b"), ("min", "min"))
    with pytest.raises(ValueError, match="one per metric.*mode=\\['max'\\]"):
        parse_objectives(["acc", "params"], ["max"])
    with pytest.raises(ValueError, match="distinct"):
        parse_objectives(["acc", "acc"], "max")
    parsed = parse_constraints(["params <= 1.0", "acc>=0.5"])
    assert parsed == (Constraint("params", "<=", 1.0), Constraint("acc", ">=", 0.5))
    assert parse_constraints({"params": ("<=", 1)}) == (Constraint("params", "<=", 1.0),)
    assert parse_constraints("latency_ms <= 2e1") == (Constraint("latency_ms", "<=", 20.0),)
    assert parse_constraints(parsed) == parsed and parse_constraints(None) == ()
    for bad in ("params < 1", "params <= many", "<= 1", {"params": ("==", 1)}, "params <= nan", 5):
        with pytest.raises(ValueError, match="constraint"):
            parse_constraints(bad)


def test_constraint_violation_amounts() -> None:
    small, accurate = Constraint("params", "<=", 1.0), Constraint("acc", ">=", 0.9)
    assert small.violation({"params": 0.4}) == 0.0 and small.violation({"params": 1.5}) == pytest.approx(0.5)
    assert accurate.violation({"acc": 0.85}) == pytest.approx(0.05) and accurate.violation({"acc": 0.95}) == 0.0
    assert small.violation({}) == math.inf and small.violation({"params": float("nan")}) == math.inf
    assert str(small) == "params <= 1"


def test_front_rows_feasible_first_and_least_violation_when_none_is_feasible() -> None:
    rows = [
        {"trial_id": 0, "status": "completed", "acc": 0.95, "params": 3.0},  # dominates all, but too big
        {"trial_id": 1, "status": "completed", "acc": 0.90, "params": 0.9},
        {"trial_id": 2, "status": "completed", "acc": 0.80, "params": 0.2},
        {"trial_id": 3, "status": "completed", "acc": 0.70, "params": 0.5},  # dominated by 2
        {"trial_id": 4, "status": "failed", "acc": 0.99, "params": 0.1},  # failed: never on the front
    ]
    metrics, modes = ["acc", "params"], ["max", "min"]
    assert [r["trial_id"] for r in front_rows(rows, metrics, modes)] == [0, 1, 2]
    bounded = parse_constraints("params <= 1.0")
    assert [r["trial_id"] for r in front_rows(rows, metrics, modes, bounded)] == [1, 2]
    tight = parse_constraints("params <= 0.1")  # nobody fits: 2 breaks it least (by 0.1)
    assert [r["trial_id"] for r in front_rows(rows, metrics, modes, tight)] == [2]
    # The feasible hypervolume from (acc 0.5, params 1.0): 0.4 * 0.1 + 0.3 * 0.7 = 0.25.
    assert rows_hypervolume(rows, metrics, modes, [0.5, 1.0], bounded) == pytest.approx(0.25)
    assert rows_hypervolume(rows, metrics, modes, [0.5, 1.0], tight) == 0.0


def test_front_never_holds_an_infeasible_row_when_a_feasible_one_exists() -> None:
    rng = np.random.default_rng(0)
    constraints = parse_constraints(["cost <= 0.5", "acc >= 0.2"])
    for _ in range(200):
        n = int(rng.integers(1, 30))
        rows = [{"trial_id": i, "acc": float(rng.random()), "cost": float(rng.random())} for i in range(n)]
        front = front_rows(rows, ["acc", "cost"], ["max", "min"], constraints)
        feasible = [r for r in rows if r["cost"] <= 0.5 and r["acc"] >= 0.2]
        assert front, rows
        if feasible:
            assert all(r["cost"] <= 0.5 and r["acc"] >= 0.2 for r in front)
            points = np.array([[r["acc"], -r["cost"]] for r in feasible])
            assert {r["trial_id"] for r in front} == {feasible[i]["trial_id"] for i in
                                                     np.flatnonzero(non_dominated_mask(points))}
