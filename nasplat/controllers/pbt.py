"""Population based training (Jaderberg et al., 2017): exploit the top quantile, explore by perturbing, or by
PB2's bandit (Parker-Holder et al., 2020; `nasplat.controllers.pb2`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from nasplat.controllers.base import CONTINUE, Controller, Decision, Exploit, Result, TrialSpec
from nasplat.controllers.pb2 import Bandit
from nasplat.core.checks import check_int, check_real
from nasplat.space import Config, Space
from nasplat.space.domains import copy_config, random_index


class PopulationBasedTraining(Controller):
    """A population of `population_size` members trained side by side.

    Every `perturbation_interval` steps a member ranked in the bottom `quantile_fraction` of the members
    still training copies the state of one from the top quantile (`Exploit`) and continues with the
    donor's config perturbed (`Space.perturb`, resampling each decision with `resample_probability`).
    Members are ranked by their score at their latest perturbation step, and a donor gives the state it had
    there (its snapshot), so what is copied is what was ranked; the receiver goes on from the donor's
    progress at that step (`Exploit.donor_step`). A member that exploited at its latest perturbation step
    has no snapshot there and is no donor until its next one. A failed or NaN report ranks the member last
    until it reports a finite score again.

    `explore="pb2"` (PB2): the exploited member's numeric hyperparameters (`Float`, `Int` outside a `Choice`) are
    chosen by a time-varying GP-UCB bandit over the population's improvements per step in each interval
    (`nasplat.controllers.pb2.Bandit`; an interval after an exploit starts from the donor's ranked score); the other
    decisions are perturbed as by PBT, which also decides the numeric ones until the bandit has two observations.
    """

    EXPLORES = ("perturb", "pb2")

    def __init__(self, space: Space | Mapping[str, Any], *, population_size: int = 4, perturbation_interval: int = 5,
                 quantile_fraction: float = 0.25, resample_probability: float = 0.25,
                 initial_configs: Sequence[Config] = (), explore: str = "perturb", **kwargs: Any) -> None:
        super().__init__(space, **kwargs)
        if explore not in self.EXPLORES:
            raise ValueError(f"`explore` must be one of {list(self.EXPLORES)}, got {explore=!r}")
        check_int("population_size", population_size, minimum=2)
        check_int("perturbation_interval", perturbation_interval, minimum=1)
        if check_real("quantile_fraction", quantile_fraction, minimum=0, strict=True) > 0.5:
            raise ValueError(f"`quantile_fraction` must be in (0, 0.5], got {quantile_fraction=!r}")
        check_real("resample_probability", resample_probability, minimum=0, maximum=1)
        if len(initial_configs) > population_size:
            raise ValueError(f"got {len(initial_configs)} `initial_configs` for {population_size=}")
        for config in initial_configs:
            self.space.validate(config)
        self.population_size, self.perturbation_interval = population_size, perturbation_interval
        self.quantile_fraction, self.resample_probability = quantile_fraction, resample_probability
        self.initial_configs = [dict(c) for c in initial_configs]
        self.configs: dict[int, Config] = {}
        self.scores: dict[int, float] = {}  # each member still training: its score at its latest perturbation step
        self.scored_at: dict[int, int] = {}  # the step of that score
        self.snapshot_at: dict[int, int] = {}  # the step of each member's latest snapshot (a perturbation step)
        self.exploits: list[tuple[int, int, int]] = []  # (step, member, donor)
        self.explore = explore
        self.bandit = Bandit(self.space) if explore == "pb2" else None
        self.interval_start: dict[int, tuple[int, float]] = {}  # PB2: each member's (step, score) its interval began

    def ask(self) -> TrialSpec | None:
        if self.next_trial_id >= self.population_size:
            return None
        index = self.next_trial_id
        config = self.initial_configs[index] if index < len(self.initial_configs) else self.space.sample(self.rng)
        spec = self._propose(copy_config(config))
        self.configs[spec.trial_id] = copy_config(config)
        return spec

    @property
    def min_concurrency(self) -> int:
        """Members must train side by side: the engine refuses fewer concurrent trials."""
        return self.population_size

    def quantiles(self) -> tuple[list[int], list[int]]:
        """(bottom, top) member ids among those still training and ranked: by their score at their latest
        perturbation step (a member is ranked from its first). The top holds only members with a snapshot at that
        step; a member whose latest report failed (NaN) ranks last and is never in the top.
        """
        ranked = sorted(self.scores, key=lambda t: (self.scores[t], -t))
        n = min(math.ceil(len(ranked) * self.quantile_fraction), len(ranked) // 2)
        top = [t for t in ranked[len(ranked) - n:]
               if self.scores[t] > -math.inf and self.snapshot_at.get(t) == self.scored_at[t]] if n else []
        return ranked[:n], top

    def on_result(self, trial_id: int, result: Result) -> Decision:
        score = self._score_of(trial_id, result)
        if trial_id not in self.configs:  # not a member of this population
            return CONTINUE
        perturbation = result.step >= 1 and result.step % self.perturbation_interval == 0
        if self.bandit is not None:
            self._observe(self.bandit, trial_id, result.step, score, perturbation)
        if perturbation or score is None or self.scores.get(trial_id) == -math.inf:
            self.scores[trial_id] = -math.inf if score is None else score
            self.scored_at[trial_id] = result.step
        if not perturbation:
            return CONTINUE
        bottom, top = self.quantiles()
        if trial_id not in bottom or not top:
            self.snapshot_at[trial_id] = result.step  # it goes on: the engine snapshots it here (`snapshot_due`)
            return CONTINUE
        donor = int(top[random_index(self.rng, len(top))])
        config = self.space.perturb(self.configs[donor], self.rng, resample_probability=self.resample_probability)
        if self.bandit is not None:
            config = self.bandit.explore(config, result.step + self.perturbation_interval, self.scores[donor],
                                         self.rng)
            if not self.space.allows(config):  # a rule forbids the bandit's choice: PBT's perturbation stands
                config = self.space.perturb(self.configs[donor], self.rng,
                                            resample_probability=self.resample_probability)
            self.interval_start[trial_id] = (result.step, self.scores[donor])  # it goes on from the donor's state
        self.configs[trial_id] = config
        self.exploits.append((result.step, trial_id, donor))
        return Exploit(donor, copy_config(config), donor_step=self.snapshot_at[donor])

    def _observe(self, bandit: Bandit, trial_id: int, step: int, score: float | None, perturbation: bool) -> None:
        """PB2: at a perturbation step, the member's improvement per step since its interval began goes to the
        bandit and a new interval begins here; a failed report ends the interval, a first finite one begins one."""
        start = self.interval_start.get(trial_id)
        if score is None:
            self.interval_start.pop(trial_id, None)
        elif start is None:
            self.interval_start[trial_id] = (step, score)
        elif perturbation and start[0] < step:
            bandit.observe(step, start[1], self.configs[trial_id], (score - start[1]) / (step - start[0]))
            self.interval_start[trial_id] = (step, score)

    def snapshot_due(self, trial_id: int, step: int) -> bool:
        """At every perturbation step, where members are ranked and become donors."""
        return trial_id in self.configs and step % self.perturbation_interval == 0

    def tell(self, trial_id: int, result: Result) -> None:
        self._score_of(trial_id, result)
        for known in (self.scores, self.scored_at, self.snapshot_at, self.configs, self.interval_start):
            known.pop(trial_id, None)  # a finished member's state is no longer available to copy
