"""Asynchronous Hyperband: ASHA over every bracket of Hyperband (Li et al. 2018), trials spread as Hyperband does."""

from __future__ import annotations

import math
from typing import Literal

from nasplat.controllers.base import Controller
from nasplat.core.checks import check_choice, check_int
from nasplat.schedulers.asha import ASHA, TYPES
from nasplat.schedulers.base import check_first_rung


class Hyperband(ASHA):
    """Hyperband's brackets run asynchronously: bracket b's rungs start at `grace_period * reduction_factor**b`,
    b = 0 .. s_max (s_max = the number of rungs below `max_steps`; the last bracket trains every trial to
    `max_steps`). A new trial joins bracket b with chance proportional to the number of configurations
    Hyperband gives that bracket, `ceil((s_max + 1) / (s + 1) * reduction_factor**s)` with s = s_max - b, so
    that every bracket gets about the same share of the steps, as in the synchronous algorithm. `rank_by` and
    `delayed` are ASHA's.
    """

    def __init__(self, controller: Controller, *, max_steps: int, grace_period: int = 1, reduction_factor: int = 3,
                 type: Literal["stop", "promote"] = "stop", rank_by: Literal["value", "curve"] = "value",
                 delayed: bool = False) -> None:
        max_steps = check_int("max_steps", max_steps, minimum=1)
        grace_period = check_int("grace_period", grace_period, minimum=1)
        reduction_factor = check_int("reduction_factor", reduction_factor, minimum=2)
        check_choice("type", type, TYPES)
        check_first_rung(self.__class__.__name__, grace_period, max_steps)
        s_max = 0
        while grace_period * reduction_factor ** s_max < max_steps:
            s_max += 1
        self.s_max = s_max
        super().__init__(controller, max_steps=max_steps, grace_period=grace_period,
                         reduction_factor=reduction_factor, brackets=s_max + 1, type=type, rank_by=rank_by,
                         delayed=delayed)

    def bracket_weights(self) -> list[float]:
        counts = [math.ceil((self.s_max + 1) / (s + 1) * self.reduction_factor ** s)
                  for s in (self.s_max - b for b in range(self.brackets))]
        return [c / sum(counts) for c in counts]
