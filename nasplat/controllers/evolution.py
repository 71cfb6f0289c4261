"""Regularized evolution (Real et al., 2019): tournament selection, ageing out the oldest member."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nasplat.controllers.base import Controller, Result, TrialSpec
from nasplat.core.checks import check_int, is_int
from nasplat.space import Config, Space
from nasplat.space.domains import copy_config


class RegularizedEvolution(Controller):
    """Steady-state, asynchronous evolution.

    Until `population_size` members have reported, trials are random samples. After that each `ask`
    draws `sample_size` members at random, mutates the best of them (one decision changed), and each
    `tell` appends the child and removes the oldest member, whatever its fitness. With `inherit_weights`, a
    child starts from its parent's final state where the shapes allow (`Trainer.inherit_state`).
    """

    def __init__(self, space: Space | Mapping[str, Any], *, population_size: int = 10, sample_size: int = 3,
                 inherit_weights: bool = False, **kwargs: Any) -> None:
        super().__init__(space, **kwargs)
        check_int("population_size", population_size, minimum=1)
        if not is_int(sample_size) or not 1 <= sample_size <= population_size:
            raise ValueError(f"`sample_size` must be an integer in [1, population_size], got {sample_size=!r}, "
                             f"{population_size=}")
        if not isinstance(inherit_weights, bool):
            raise TypeError(f"`inherit_weights` must be True or False, got {inherit_weights=!r}")
        self.population_size, self.sample_size, self.inherit_weights = population_size, sample_size, inherit_weights
        self.population: list[tuple[int, Config, float]] = []  # (trial_id, config, score), oldest first
        self._scores: list[float] = []  # the population's scores, for a fast tournament
        self.pending: dict[int, Config] = {}

    def ask(self) -> TrialSpec:
        if len(self.population) < self.population_size:
            spec = self._propose(self.space.sample(self.rng))
        else:
            parent = self.tournament()
            spec = self._propose(self.space.mutate(parent[1], self.rng), parent_id=parent[0],
                                 inherit_from=parent[0] if self.inherit_weights else None)
        self.pending[spec.trial_id] = copy_config(spec.config)  # the trial may change its copy
        return spec

    def parents(self) -> set[int] | None:
        """With `inherit_weights`, the members of the population: any of them may become a parent."""
        return {member[0] for member in self.population} if self.inherit_weights else None

    def tournament(self) -> tuple[int, Config, float]:
        """The best of `sample_size` members drawn without replacement (ties: the older wins)."""
        n, k, scores = len(self.population), self.sample_size, self._scores
        if k >= n:
            picks: list[int] | range = range(n)
        elif 2 * k > n:
            picks = sorted(self.rng.permutation(n)[:k].tolist())
        else:  # the first k distinct of uniform draws: a uniform k-subset, without touching the other members
            chosen: dict[int, None] = {}
            while len(chosen) < k:
                draws = self.rng.random(k - len(chosen)) * n
                chosen.update(dict.fromkeys(min(int(u), n - 1) for u in draws.tolist()))
            picks = sorted(chosen)
        return self.population[max(picks, key=scores.__getitem__)]  # max keeps the first (oldest) of equals

    def tell(self, trial_id: int, result: Result) -> None:
        score = self._score_of(trial_id, result)
        config = self.pending.pop(trial_id, None)
        if config is None or score is None:
            return
        self.population.append((trial_id, config, score))
        self._scores.append(score)
        if len(self.population) > self.population_size:
            del self.population[0], self._scores[0]
