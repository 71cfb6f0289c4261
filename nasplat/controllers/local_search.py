"""Local search (White, Nolen, Ravi and Savani, UAI 2021): first-improvement hill climbing with random restarts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nasplat.controllers.base import Controller, Result, TrialSpec
from nasplat.core.checks import check_int
from nasplat.space import Config, Space
from nasplat.space.domains import config_key, copy_config


class LocalSearch(Controller):
    """Hill climbing over one-decision neighbours (`Space.neighbours`), moving on the first improvement.

    A climb starts from the best of its first `initial_samples` random configs to report (more are
    proposed while they run). Its centre's neighbours are proposed
    in a random order; the first one to report a better score than the centre becomes the new centre. When
    every neighbour of the centre has been proposed and none improved on it (a local optimum), the search
    restarts from fresh random samples. No config is proposed twice. Asynchronous: with many workers the
    next neighbours are proposed while earlier ones still run; a result that arrives after its climb moved
    on or restarted is only recorded.
    """

    def __init__(self, space: Space | Mapping[str, Any], *, initial_samples: int = 1, **kwargs: Any) -> None:
        super().__init__(space, **kwargs)
        check_int("initial_samples", initial_samples, minimum=1)
        self.initial_samples = initial_samples
        self.seen: set[Any] = set()  # keys of every config proposed
        self.climb = 0  # restarts so far
        self.starts: list[tuple[int, Config, float | None]] = []  # this climb's reported random samples
        self.centre: tuple[int, Config, float] | None = None
        self.queue: list[Config] = []  # the centre's neighbours not yet proposed
        self.pending: dict[int, tuple[int, int | None, Config]] = {}  # trial -> (climb, centre id or None, config)
        self.moves = 0  # times a neighbour improved on its centre

    def ask(self) -> TrialSpec:
        while self.centre is not None and self.queue:
            config = self.queue.pop()
            if config_key(config) not in self.seen:
                return self._remember(config, self.centre[0])
        if self.centre is not None:  # every neighbour proposed: a local optimum (unless a late one improves)
            self._restart()
        return self._remember(self.space.sample_unseen(self.rng, self.seen), None)

    def _remember(self, config: Config, centre_id: int | None) -> TrialSpec:
        self.seen.add(config_key(config))
        spec = self._propose(config, parent_id=centre_id)
        self.pending[spec.trial_id] = (self.climb, centre_id, copy_config(config))
        return spec

    def _restart(self) -> None:
        self.climb += 1
        self.starts, self.centre, self.queue = [], None, []

    def _move_to(self, trial_id: int, config: Config, score: float) -> None:
        self.centre = (trial_id, config, score)
        neighbours = self.space.neighbours(config, self.rng)
        order = self.rng.permutation(len(neighbours))
        self.queue = [neighbours[i] for i in order if config_key(neighbours[i]) not in self.seen]

    def tell(self, trial_id: int, result: Result) -> None:
        score = self._score_of(trial_id, result)
        origin = self.pending.pop(trial_id, None)
        if origin is None:
            return
        climb, centre_id, config = origin
        if climb != self.climb:
            return
        if centre_id is None:  # a start sample of this climb
            self.starts.append((trial_id, config, score))
            if self.centre is None and len(self.starts) >= self.initial_samples:
                scored = [s for s in self.starts if s[2] is not None]
                if scored:
                    best = max(scored, key=lambda s: s[2])  # type: ignore[arg-type, return-value]
                    self._move_to(best[0], best[1], best[2])  # type: ignore[arg-type]
                else:
                    self._restart()
        elif self.centre is not None and centre_id == self.centre[0] and score is not None and score > self.centre[2]:
            self.moves += 1
            self._move_to(trial_id, config, score)
