"""Search controllers: pure-Python ask/tell strategies, no Ray import."""

from nasplat.controllers.base import (
    CONTINUE, PAUSE, STOP, Continue, Controller, Decision, Exploit, Pause, Result, Stop, TrialSpec,
)
from nasplat.controllers.evolution import RegularizedEvolution
from nasplat.controllers.mo_evolution import MultiObjectiveEvolution
from nasplat.controllers.optuna_sampler import OptunaSampler
from nasplat.controllers.pbt import PopulationBasedTraining
from nasplat.controllers.random_search import RandomSearch
from nasplat.controllers.reinforce import Reinforce

CONTROLLERS: dict[str, type[Controller]] = {
    "random": RandomSearch,
    "evolution": RegularizedEvolution,
    "mo_evolution": MultiObjectiveEvolution,
    "pbt": PopulationBasedTraining,
    "reinforce": Reinforce,
    "optuna": OptunaSampler,
}

__all__ = [
    "CONTINUE", "CONTROLLERS", "PAUSE", "STOP", "Continue", "Controller", "Decision", "Exploit",
    "MultiObjectiveEvolution", "OptunaSampler", "Pause", "PopulationBasedTraining", "RandomSearch",
    "RegularizedEvolution", "Reinforce", "Result", "Stop", "TrialSpec",
]
