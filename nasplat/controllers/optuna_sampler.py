"""Any Optuna sampler (TPE, CMA-ES, GP, ...) driven through Optuna's own ask/tell interface."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from nasplat.controllers.base import Controller, Result, TrialSpec
from nasplat.domains import copy_config
from nasplat.space import MAX_ATTEMPTS, Choice, Config, Float, ForbiddenConfigError, Int, Space

if TYPE_CHECKING:  # imported when first used: trial workers never pay for Optuna
    import optuna


class OptunaSampler(Controller):
    """Proposes configs with `sampler` (default: `TPESampler(seed=seed)`); conditional spaces define-by-run.

    In a space with rules, a suggested config that breaks one is told to Optuna as a pruned trial with no
    value (samplers such as TPE rank those below every completed trial, so they learn to avoid the
    region) and the sampler is asked again, at most `MAX_ATTEMPTS` times.
    """

    def __init__(self, space: Space | Mapping[str, Any], *, sampler: optuna.samplers.BaseSampler | None = None,
                 **kwargs: Any) -> None:
        super().__init__(space, **kwargs)
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        sampler = sampler if sampler is not None else optuna.samplers.TPESampler(seed=self.seed)
        self.study = optuna.create_study(direction="maximize", sampler=sampler)
        self.pending: dict[int, int] = {}  # trial_id -> Optuna trial number

    def ask(self) -> TrialSpec:
        from optuna.trial import TrialState

        for _ in range(MAX_ATTEMPTS):
            trial = self.study.ask()
            config = _suggest(self.space, trial, "")
            if self.space.allows(config):
                spec = self._propose(config)
                self.pending[spec.trial_id] = trial.number
                return spec
            self.study.tell(trial.number, state=TrialState.PRUNED)
        raise ForbiddenConfigError(f"Optuna: {MAX_ATTEMPTS} suggested configs in a row were forbidden by the "
                                   f"space's rules {sorted(self.space.forbidden)}")

    def tell(self, trial_id: int, result: Result) -> None:
        score = self._score_of(trial_id, result)
        number = self.pending.pop(trial_id, None)
        if number is None:
            return
        if score is None:
            from optuna.trial import TrialState

            self.study.tell(number, state=TrialState.FAIL)
        else:
            self.study.tell(number, score)


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
