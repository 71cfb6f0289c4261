"""Random search: every trial an independent sample of the space."""

from __future__ import annotations

from typing import ClassVar

from nasplat.controllers.base import Controller, TrialSpec


class RandomSearch(Controller):
    """Samples configs uniformly (log-uniformly for `log=True` domains) from the space; any number of objectives."""

    multi_objective: ClassVar[bool] = True

    def ask(self) -> TrialSpec:
        return self._propose(self.space.sample(self.rng))
