"""Multi-objective regularized evolution: tournaments ranked by non-dominated sorting and crowding distance."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from nasplat.controllers.base import Result
from nasplat.controllers.evolution import RegularizedEvolution
from nasplat.core.pareto import rank_order
from nasplat.space import Config


class MultiObjectiveEvolution(RegularizedEvolution):
    """Regularized evolution over several objectives and constraints.

    The population is ranked as NSGA-II ranks it (Deb et al., 2002): feasible members by non-dominated front,
    ties broken by crowding distance (members in sparse parts of their front first), then the infeasible ones
    by total constraint violation. Each `ask` mutates the best-ranked of `sample_size` members drawn at random;
    each `tell` appends the child and removes the oldest member, whatever its rank. Takes
    `RegularizedEvolution`'s options; with one metric and no constraints it behaves as `RegularizedEvolution`.
    """

    multi_objective: ClassVar[bool] = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.population: list[tuple[int, Config, np.ndarray]] = []  # type: ignore[assignment]  # vector scores
        self._violations: list[float] = []  # each member's total constraint violation, oldest first

    def tell(self, trial_id: int, result: Result) -> None:
        scored = self._objectives_of(trial_id, result)
        config = self.pending.pop(trial_id, None)
        if config is None or scored is None:
            return
        objectives, violation = scored
        self.population.append((trial_id, config, objectives))
        self._violations.append(violation)
        if len(self.population) > self.population_size:
            del self.population[0], self._violations[0]
        self._scores = self.member_ranks()

    def member_ranks(self) -> list[float]:
        """Each member's position in the population's ranking, negated (higher is better), oldest first."""
        order = rank_order(np.array([m[2] for m in self.population]), self._violations)
        position = np.empty(len(order))
        position[order] = np.arange(len(order))
        return (-position).tolist()
