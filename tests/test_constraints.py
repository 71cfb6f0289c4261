"""Space rules: forbidden configs are never sampled, mutated, perturbed or proposed, and `validate` names the rule."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from helpers import FACTORIES, METRIC, MIXED, Driver, objective, proposed_configs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nasplat.controllers import Result
from nasplat.space import MAX_ATTEMPTS, Choice, Config, Float, ForbiddenConfigError, Int, Space
from search_spaces.nb201 import CUT_OFF, EDGES, OPS, connected_space, cut_off, space, space_for


# -- random spaces and rules -------------------------------------------------------------------------
@st.composite
def domains(draw: st.DrawFn, depth: int = 0) -> Any:
    kind = draw(st.sampled_from(["choice", "int", "float"] + (["branch"] if depth == 0 else [])))
    if kind == "choice":
        return Choice(draw(st.lists(st.integers(0, 9), min_size=2, max_size=5, unique=True)))
    if kind == "int":
        low = draw(st.integers(1, 20))
        return Int(low, low + draw(st.integers(1, 30)), log=draw(st.booleans()))
    if kind == "float":
        low = draw(st.floats(0.01, 1.0))
        return Float(low, low * draw(st.floats(2.0, 100.0)), log=draw(st.booleans()))
    return Choice([{"kind": "a"}, {"kind": "b", "x": draw(domains(depth + 1)), "y": draw(domains(depth + 1))}])


@st.composite
def constrained_spaces(draw: st.DrawFn) -> Space:
    """A space of 2-4 random decisions (one may be a conditional branch) with a rule forbidding one combination
    of the first two decisions' tokens: every allowed config keeps an allowed neighbour, so `mutate` must
    always find one."""
    names = draw(st.lists(st.sampled_from("abcdef"), min_size=2, max_size=4, unique=True))
    plain = Space({name: draw(domains()) for name in names})
    second = len(Space({names[0]: plain.domains[names[0]]}).cardinalities())  # the second decision's token
    first_token, second_token = draw(st.integers(0, 1)), draw(st.integers(0, 1))

    def rule(config: Config) -> bool:
        tokens = plain.encode(config)
        return tokens[0] == first_token and tokens[second] == second_token
    return Space(plain, forbidden={"first two tokens": rule})


def _check_never_forbidden(space: Space, configs: list[Config]) -> None:
    assert configs
    for config in configs:
        space.validate(config)  # raises naming the rule if one is broken
        assert space.broken_rule(config) is None


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(constrained_spaces(), st.integers(0, 2**16))
def test_sample_mutate_perturb_and_neighbours_never_return_a_forbidden_config(space, seed) -> None:
    rng = np.random.default_rng(seed)
    configs = [space.sample(rng) for _ in range(20)]
    _check_never_forbidden(space, configs)
    _check_never_forbidden(space, [space.mutate(c, rng) for c in configs])
    _check_never_forbidden(space, [space.perturb(c, rng, resample_probability=0.5) for c in configs])
    _check_never_forbidden(space, [n for c in configs[:3] for n in space.neighbours(c, rng)] or configs)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(constrained_spaces(), st.integers(0, 2**16))
@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_no_controller_proposes_a_forbidden_config(name, space, seed) -> None:
    """Every controller of the contract suite, on a random constrained space, with failures in between."""

    def score(config: Config, step: int) -> float:
        return float(sum(space.encode(config)) + 0.01 * step)

    driver = Driver(FACTORIES[name](seed=seed, space=space), fail_every=5, score=score)
    _check_never_forbidden(space, proposed_configs(driver.rounds(14)))


def test_rules_are_seen_by_every_operation_of_a_fixed_example() -> None:
    """On MIXED, forbidding the MLP head with gelu: none of 2,000 samples, mutations or perturbations has it."""
    rule = "no gelu head"
    space = Space(MIXED, forbidden={rule: lambda c: c["head"].get("act") == "gelu"})
    rng = np.random.default_rng(0)
    drawn = [space.sample(rng) for _ in range(500)]
    drawn += [space.mutate(c, rng) for c in drawn] + [space.perturb(c, rng) for c in drawn]
    acts = {c["head"].get("act") for c in drawn}
    assert acts == {None, "relu", "tanh"}  # the other values still come up
    gelu = {**drawn[0], "head": {"kind": "mlp", "hidden": 32, "act": "gelu"}}
    MIXED.validate(gelu)
    with pytest.raises(ValueError, match=f"forbidden by the rule '{rule}'"):
        space.validate(gelu)
    assert not space.accepts(gelu) and space.fits(gelu)


def test_rules_of_a_sub_space_are_named_by_their_path() -> None:
    inner = Space({"x": Int(0, 3)}, forbidden={"x is odd": lambda c: c["x"] % 2 == 1})
    space = Space({"head": Choice([{"kind": "none"}, inner]), "outer": inner})
    rng = np.random.default_rng(1)
    samples = [space.sample(rng) for _ in range(200)]
    assert all(s["outer"]["x"] % 2 == 0 for s in samples)
    assert {s["head"].get("x") for s in samples} == {None, 0, 2}
    with pytest.raises(ValueError, match="forbidden by the rule 'outer.x is odd'"):
        space.validate({"head": {"kind": "none"}, "outer": {"x": 3}})
    with pytest.raises(ValueError, match="forbidden by the rule 'head.x is odd'"):
        space.validate({"head": {"x": 1}, "outer": {"x": 2}})


def test_a_rule_that_forbids_everything_fails_clearly() -> None:
    space = Space({"x": Choice([1, 2])}, forbidden={"everything": lambda c: True})
    rng = np.random.default_rng(0)
    message = f"{MAX_ATTEMPTS} draws in a row were forbidden by the space's rules .*'everything': {MAX_ATTEMPTS}"
    with pytest.raises(ForbiddenConfigError, match=message):
        space.sample(rng)
    with pytest.raises(ForbiddenConfigError, match="^mutate: "):
        space.mutate({"x": 1}, rng)
    for name in ("reinforce", "optuna_random", "random"):
        with pytest.raises(ForbiddenConfigError, match="forbidden"):
            FACTORIES[name](seed=0, space=space).ask()
    with pytest.raises(TypeError, match="rule names .* predicates"):
        Space({"x": Choice([1, 2])}, forbidden={"bad": 3})


def test_optuna_learns_nothing_from_forbidden_suggestions() -> None:
    """Forbidden suggestions are told to Optuna as pruned trials and never reach the search."""
    space = Space(MIXED, forbidden={"few layers": lambda c: c["layers"] < 5})
    controller = FACTORIES["optuna_tpe"](seed=0, space=space)
    for _ in range(12):
        spec = controller.ask()
        assert spec.config["layers"] >= 5
        controller.tell(spec.trial_id, Result({METRIC: objective(spec.config)}))
    states = [t.state.name for t in controller.study.trials]
    assert states.count("COMPLETE") == 12 and states.count("PRUNED") == len(states) - 12 > 0


# -- NAS-Bench-201 ---------------------------------------------------------------------------------------
def test_nb201_cut_off_cells_are_exactly_the_zero_accuracy_ones(shared_data) -> None:
    """The rule forbids the 341 cells without a path from input to output: the table scores every one of them
    at chance (<= 10% on CIFAR-10), and every other cell above 27%."""
    from trainers.nb201_table import load_table

    table = load_table("cifar10")
    cut = np.array([cut_off(dict(zip(EDGES, ops))) for ops in itertools.product(OPS, repeat=len(EDGES))])
    assert cut.sum() == 341
    assert table["test_acc"][cut].max() <= 10.0 and table["valid_acc"][~cut].min() > 27.0
    assert not cut_off({edge: "none" if edge.startswith("3<-0") else "skip_connect" for edge in EDGES})
    assert cut_off({**{edge: "nor_conv_3x3" for edge in EDGES}, "3<-0": "none", "3<-1": "none", "3<-2": "none"})


def test_nb201_connected_space_is_opt_in() -> None:
    """The published protocol samples all 15,625 cells; `connected=True` only is constrained."""
    assert not space.forbidden and not space_for("cifar10").forbidden
    assert space_for("cifar10", connected=True).forbidden.keys() == {CUT_OFF} == connected_space.forbidden.keys()
    dead = {edge: "none" for edge in EDGES}
    space.validate(dead)
    with pytest.raises(ValueError, match=f"forbidden by the rule '{CUT_OFF}'"):
        connected_space.validate(dead)
    rng = np.random.default_rng(0)
    assert sum(cut_off(space.sample(rng)) for _ in range(3000)) > 30  # ~2.2% of cells
    assert not any(cut_off(connected_space.sample(rng)) for _ in range(3000))
