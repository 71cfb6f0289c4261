"""Search controllers: pure-Python ask/tell strategies, no Ray import. `CONTROLLERS` names them for YAML
(`controller:`), `nasplat.run(controller=...)` and the command line's help."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nasplat.controllers.base import (
    CONTINUE,
    PAUSE,
    STOP,
    Continue,
    Controller,
    Decision,
    Exploit,
    Pause,
    Result,
    Searcher,
    Stop,
    TrialSpec,
)
from nasplat.controllers.evolution import RegularizedEvolution
from nasplat.controllers.local_search import LocalSearch
from nasplat.controllers.mf_model import ModelBasedMultiFidelity
from nasplat.controllers.mo_evolution import MultiObjectiveEvolution
from nasplat.controllers.optuna_sampler import OptunaSampler
from nasplat.controllers.pbt import PopulationBasedTraining
from nasplat.controllers.predictor import Predictor
from nasplat.controllers.random_search import RandomSearch
from nasplat.controllers.reinforce import Reinforce
from nasplat.core.registry import Registry, constructor_options

CONTROLLERS: Registry[type[Controller]] = Registry("controller", {
    "random": RandomSearch,
    "evolution": RegularizedEvolution,
    "mo_evolution": MultiObjectiveEvolution,
    "pbt": PopulationBasedTraining,
    "reinforce": Reinforce,
    "optuna": OptunaSampler,
    "local_search": LocalSearch,
    "predictor": Predictor,
    "mobster": ModelBasedMultiFidelity,
})
# Set by the experiment itself (its space, metric, mode and seed), never as a controller option.
EXPERIMENT_LEVEL = ("space", "metric", "mode", "constraints", "seed")


def controller_options(cls: type[Controller]) -> list[str] | None:
    """The option names `cls` takes (see `constructor_options`); None when its `**kwargs` accepts anything."""
    return constructor_options(cls, base=Controller, skip=EXPERIMENT_LEVEL)


def check_controller_options(cls: type[Controller], options: Mapping[str, Any] | None) -> dict[str, Any]:
    """`options` as a dict, after checking each name against what `cls` takes; a misspelled option is named
    together with the allowed ones. The values are checked by the constructor itself."""
    options = dict(options or {})
    label = CONTROLLERS.name_of(cls) or cls.__name__
    keys = [k for k in options if not isinstance(k, str)]
    if keys:
        raise ValueError(f"controller option names must be strings, got {keys} for controller {label!r}")
    misplaced = [k for k in options if k in EXPERIMENT_LEVEL]
    if misplaced:
        raise ValueError(f"controller options {misplaced} belong to the experiment itself (top-level "
                         f"{list(EXPERIMENT_LEVEL)[1:]}), not to controller {label!r}")
    allowed = controller_options(cls)
    unknown = [k for k in options if allowed is not None and k not in allowed]
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for controller {label!r}; allowed: {allowed}")
    return options


__all__ = [
    "CONTINUE", "CONTROLLERS", "PAUSE", "STOP", "Continue", "Controller", "Decision", "Exploit", "LocalSearch",
    "ModelBasedMultiFidelity", "MultiObjectiveEvolution", "OptunaSampler", "Pause", "PopulationBasedTraining",
    "Predictor", "RandomSearch",
    "RegularizedEvolution", "Reinforce", "Result", "Searcher", "Stop", "TrialSpec", "check_controller_options",
    "controller_options",
]
