"""Any Optuna sampler (TPE, CMA-ES, GP, NSGA-II, ...) driven through Optuna's own ask/tell interface."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from nasplat.controllers.base import Controller, Result, TrialSpec
from nasplat.space import MAX_ATTEMPTS, Choice, Config, Float, ForbiddenConfigError, Int, Space
from nasplat.space.domains import copy_config

if TYPE_CHECKING:  # imported when first used: trial workers never pay for Optuna
    import optuna


SAMPLERS = ("tpe", "nsga2", "nsga3", "random")
_LOCK_TYPES = {type(threading.Lock()): threading.Lock, type(threading.RLock()): threading.RLock}


class OptunaSampler(Controller):
    """Proposes configs with `sampler`, an Optuna sampler or one of `SAMPLERS` by name (default: TPE for one
    objective, NSGA-II for several); conditional spaces define-by-run. Several objectives make a study with one
    direction each; each constraint's violation is set on the trial (`Trial.set_constraint`, feasible at 0),
    where Optuna's constraint-aware samplers (TPE, NSGA-II, NSGA-III, GP) read it.

    In a space with rules, a suggested config that breaks one is told to Optuna as a pruned trial with no
    value (samplers such as TPE rank those below every completed trial, so they learn to avoid the
    region) and the sampler is asked again, at most `MAX_ATTEMPTS` times."""

    multi_objective: ClassVar[bool] = True

    def __init__(self, space: Space | Mapping[str, Any], *,
                 sampler: optuna.samplers.BaseSampler | str | None = None, **kwargs: Any) -> None:
        super().__init__(space, **kwargs)
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        if sampler is None or isinstance(sampler, str):
            sampler = self._named_sampler(sampler or ("tpe" if len(self.metrics) == 1 else "nsga2"))
        self.study = optuna.create_study(directions=["maximize"] * len(self.metrics), sampler=sampler)
        self.pending: dict[int, optuna.Trial] = {}  # trial_id -> its Optuna trial

    def _named_sampler(self, name: str) -> optuna.samplers.BaseSampler:
        import optuna

        if name == "tpe":
            return optuna.samplers.TPESampler(seed=self.seed)
        if name == "nsga2":
            return optuna.samplers.NSGAIISampler(seed=self.seed)
        if name == "nsga3":
            return optuna.samplers.NSGAIIISampler(seed=self.seed)
        if name == "random":
            return optuna.samplers.RandomSampler(seed=self.seed)
        raise ValueError(f"unknown Optuna sampler {name!r}; allowed: {list(SAMPLERS)} or a sampler instance")

    def ask(self) -> TrialSpec:
        from optuna.trial import TrialState

        for _ in range(MAX_ATTEMPTS):
            trial = self.study.ask()
            config = _suggest(self.space, trial, "")
            if self.space.allows(config):
                spec = self._propose(config)
                self.pending[spec.trial_id] = trial
                return spec
            self.study.tell(trial.number, state=TrialState.PRUNED)
        raise ForbiddenConfigError(f"Optuna: {MAX_ATTEMPTS} suggested configs in a row were forbidden by the "
                                   f"space's rules {sorted(self.space.forbidden)}")

    def tell(self, trial_id: int, result: Result) -> None:
        scored = self._objectives_of(trial_id, result)
        trial = self.pending.pop(trial_id, None)
        if trial is None:
            return
        if scored is None:
            from optuna.trial import TrialState

            self.study.tell(trial, state=TrialState.FAIL)
            return
        values, _ = scored
        for constraint in self.constraints:
            trial.set_constraint(str(constraint), constraint.violation(result.metrics))
        self.study.tell(trial, values.tolist() if len(values) > 1 else float(values[0]))

    # -- persistence: some samplers (NSGA-II) hold a thread lock, which neither copies nor pickles ----------
    def state_dict(self) -> dict[str, Any]:
        with _locks_set_aside(self.study.sampler) as locks:
            state = super().state_dict()
        state["sampler_locks"] = locks
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        state = dict(state)
        locks = state.pop("sampler_locks", {})
        super().load_state_dict(state)
        for name, make_lock in locks.items():
            setattr(self.study.sampler, name, make_lock())

    def __getstate__(self) -> dict[str, Any]:
        return {"space": self.space, "state": self.state_dict()}

    def __setstate__(self, saved: dict[str, Any]) -> None:
        self.space, self.rng = saved["space"], np.random.default_rng()
        self.load_state_dict(saved["state"])


@contextmanager
def _locks_set_aside(sampler: Any) -> Iterator[dict[str, Callable[[], Any]]]:
    """Within the block, the sampler's attributes that hold a lock are None; yields {name: lock factory}."""
    locks = {k: v for k, v in vars(sampler).items() if type(v) in _LOCK_TYPES}
    for name in locks:
        setattr(sampler, name, None)
    try:
        yield {name: _LOCK_TYPES[type(lock)] for name, lock in locks.items()}
    finally:
        for name, lock in locks.items():
            setattr(sampler, name, lock)


def _suggest(space: Space, trial: optuna.Trial, prefix: str) -> Config:
    """A config with each decision suggested by `trial`; a branch's parameters are named `choice[i].key`, so
    branches that reuse a key with different domains stay distinct parameters to Optuna."""
    config: Config = {}
    for key, domain in space.domains.items():
        name = prefix + key
        if isinstance(domain, Space):
            config[key] = _suggest(domain, trial, name + ".")
        elif isinstance(domain, Choice):
            index = trial.suggest_categorical(name, list(range(len(domain.options))))
            option = domain.options[index]
            config[key] = _suggest(option, trial, f"{name}[{index}].") if isinstance(option, Space) else (
                copy_config(option))
        elif isinstance(domain, Int):
            config[key] = trial.suggest_int(name, domain.low, domain.high, log=domain.log)
        elif isinstance(domain, Float):
            config[key] = trial.suggest_float(name, domain.low, domain.high, log=domain.log)
        else:
            config[key] = copy_config(domain)
    return config
