"""Shared, fixture-free test data: a small mixed space, a synthetic objective, controller factories, a driver."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import optuna

from nasplat.controllers import (
    Controller,
    Exploit,
    LocalSearch,
    ModelBasedMultiFidelity,
    MultiObjectiveEvolution,
    OptunaSampler,
    PopulationBasedTraining,
    Predictor,
    RandomSearch,
    RegularizedEvolution,
    Reinforce,
    Result,
)
from nasplat.space import Choice, Config, Domain, Float, Int, Space

METRIC = "score"
COST = "cost"  # a second objective (minimised) that every Driver report carries

MIXED = Space({
    "op": Choice(["conv3x3", "conv5x5", "maxpool", "skip"]),
    "layers": Int(1, 8),
    "lr": Float(1e-4, 1e-1, log=True),
    "head": Choice([
        {"kind": "linear"},
        {"kind": "mlp", "hidden": Int(16, 512, log=True), "act": Choice(["relu", "gelu", "tanh"])},
    ]),
})

_OP_BONUS = {"conv3x3": 0.3, "conv5x5": 0.2, "maxpool": 0.0, "skip": -0.2}


def objective(config: Config, step: int = 1) -> float:
    """A deterministic score over `MIXED`, best near lr=3e-3, 5 layers, conv3x3, an MLP head of ~128 units."""
    score = -(math.log10(config["lr"]) + 2.5) ** 2 - 0.05 * (config["layers"] - 5) ** 2 + _OP_BONUS[config["op"]]
    head = config["head"]
    if head["kind"] == "mlp":
        score += 0.4 - 0.1 * abs(math.log2(head["hidden"]) - 7) + (0.1 if head["act"] == "gelu" else 0.0)
    return score + 0.01 * step


def cost(config: Config) -> float:
    """A deterministic cost over `MIXED` that grows with depth and head width: in conflict with `objective`
    (0 for configs of other spaces, which the constraint tests drive)."""
    if "layers" not in config or "head" not in config:
        return 0.0
    head = config["head"]
    return config["layers"] * (1.0 + (math.log2(head["hidden"]) if head["kind"] == "mlp" else 0.0))


MO = dict(metric=[METRIC, COST], mode=["max", "min"], constraints=[f"{COST} <= 40"])  # two objectives, a bound

# -- controllers under test ------------------------------------------------------------------
Factory = Callable[..., Controller]

FACTORIES: dict[str, Factory] = {  # `space` (default MIXED) lets a test run the same controllers on another space
    "random": lambda seed, space=MIXED, **kw: RandomSearch(space, metric=METRIC, seed=seed, **kw),
    "evolution": lambda seed, space=MIXED, **kw: RegularizedEvolution(space, population_size=6, sample_size=3,
                                                                      metric=METRIC, seed=seed, **kw),
    "pbt": lambda seed, space=MIXED, **kw: PopulationBasedTraining(space, population_size=4, perturbation_interval=2,
                                                                   metric=METRIC, seed=seed, **kw),
    "reinforce": lambda seed, space=MIXED, **kw: Reinforce(space, learning_rate=0.1, metric=METRIC, seed=seed, **kw),
    "optuna_tpe": lambda seed, space=MIXED, **kw: OptunaSampler(
        space, sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=4), metric=METRIC, seed=seed, **kw),
    "optuna_random": lambda seed, space=MIXED, **kw: OptunaSampler(
        space, sampler=optuna.samplers.RandomSampler(seed=seed), metric=METRIC, seed=seed, **kw),
    "local_search": lambda seed, space=MIXED, **kw: LocalSearch(space, initial_samples=3, metric=METRIC, seed=seed,
                                                                **kw),
    "predictor": lambda seed, space=MIXED, **kw: Predictor(space, initial_samples=4, fit_steps=5, max_fit_steps=20,
                                                           mutations=10, metric=METRIC, seed=seed, **kw),
    "mobster": lambda seed, space=MIXED, **kw: ModelBasedMultiFidelity(space, initial_samples=4, pool_size=40,
                                                                       mutations=5, metric=METRIC, seed=seed, **kw),
    "mo_evolution": lambda seed, space=MIXED, **kw: MultiObjectiveEvolution(space, population_size=6, sample_size=3,
                                                                            **MO, seed=seed, **kw),
    "mo_random": lambda seed, space=MIXED, **kw: RandomSearch(space, **MO, seed=seed, **kw),
    "mo_optuna_nsga2": lambda seed, space=MIXED, **kw: OptunaSampler(
        space, sampler=optuna.samplers.NSGAIISampler(seed=seed, population_size=4), **MO, seed=seed, **kw),
}


@dataclass
class Driver:
    """Runs a controller against `objective`, one round at a time, and returns what it proposed.

    Ask/tell controllers: a round is one `ask` and one `tell`. PBT (whose `ask` runs dry after its
    population): the first round asks for the whole population, every round then reports each member
    once at the next step through `on_result`. `fail_every=k` makes every k-th report a failure,
    alternating between `Result(failed=True)` and a NaN metric. `score(config, step)` scores a report
    (default: `objective`).
    """

    controller: Controller
    fail_every: int = 0
    step: int = 0
    reports: int = 0
    members: dict[int, Config] = field(default_factory=dict)
    failed_ids: set[int] = field(default_factory=set)
    score: Callable[[Config, int], float] = field(default=objective)

    def fork(self, controller: Controller) -> Driver:
        """A driver for `controller` (a copy of this one's controller) that continues from this one's state."""
        return Driver(controller, self.fail_every, self.step, self.reports,
                      {k: dict(v) for k, v in self.members.items()}, set(self.failed_ids), self.score)

    def _result(self, trial_id: int, config: Config) -> Result:
        self.reports += 1
        if self.fail_every and self.reports % self.fail_every == 0:
            self.failed_ids.add(trial_id)
            if (self.reports // self.fail_every) % 2:
                return Result({METRIC: 1.0}, self.step, failed=True, error="synthetic crash")
            return Result({METRIC: float("nan")}, self.step)
        return Result({METRIC: self.score(config, self.step), COST: cost(config)}, self.step)

    def rounds(self, n: int) -> list[Any]:
        """`n` rounds; returns the proposals: (trial_id, config, parent_id) or (trial_id, step, decision)."""
        return [event for _ in range(n) for event in self._round()]

    def _round(self) -> Iterator[Any]:
        self.step += 1
        spec = self.controller.ask()
        if spec is not None:
            self.members[spec.trial_id] = spec.config
            yield spec.trial_id, spec.config, spec.parent_id
            if not isinstance(self.controller, PopulationBasedTraining):
                self.controller.tell(spec.trial_id, self._result(spec.trial_id, spec.config))
                return
            while (spec := self.controller.ask()) is not None:
                self.members[spec.trial_id] = spec.config
                yield spec.trial_id, spec.config, spec.parent_id
        for trial_id in sorted(self.members):
            decision = self.controller.on_result(trial_id, self._result(trial_id, self.members[trial_id]))
            if isinstance(decision, Exploit):
                self.members[trial_id] = decision.config
            yield trial_id, self.step, decision


def proposed_configs(events: list[Any]) -> list[Config]:
    """Every config in `Driver.rounds` output: proposals and exploit configs."""
    out = []
    for event in events:
        if isinstance(event[1], dict):
            out.append(event[1])
        elif isinstance(event[2], Exploit):
            out.append(event[2].config)
    return out


# -- comparing configs decision by decision -----------------------------------------------------
def decision_values(space: Space, config: Config) -> dict[str, Any]:
    """Path -> value of each active decision; a conditional `Choice` counts by its option index."""
    out: dict[str, Any] = {}
    for path, domain, value, _ in space.decisions(config):
        if isinstance(domain, Choice):
            out[path] = ("option", domain.index(path, value))
        else:
            out[path] = (type(value).__name__, value)
    return out


def changed_decisions(space: Space, before: Config, after: Config) -> set[str]:
    """Paths of decisions whose value differs, or that exist on one side only."""
    a, b = decision_values(space, before), decision_values(space, after)
    return {p for p in a.keys() | b.keys() if a.get(p) != b.get(p)}


def roots(paths: set[str]) -> set[str]:
    """The shallowest paths: those not below another path of the set."""
    return {p for p in paths if not any(p.startswith(q + ".") for q in paths if q != p)}


def changeable(domain: Domain) -> bool:
    """Whether a decision can take a value other than its current one."""
    if isinstance(domain, Choice):
        return len(domain.options) > 1
    if isinstance(domain, Int):
        return domain.low < domain.high
    return True
