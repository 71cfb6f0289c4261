"""Search controllers: pure-Python ask/tell strategies, no Ray import."""

from nasplat.controllers.base import (
    CONTINUE, STOP, Continue, Controller, Decision, Exploit, Result, Stop, TrialSpec,
)
from nasplat.controllers.evolution import RegularizedEvolution
from nasplat.controllers.local_search import LocalSearch
from nasplat.controllers.optuna_sampler import OptunaSampler
from nasplat.controllers.pbt import PopulationBasedTraining
from nasplat.controllers.predictor import Predictor
from nasplat.controllers.random_search import RandomSearch
from nasplat.controllers.reinforce import Reinforce

CONTROLLERS: dict[str, type[Controller]] = {
    "random": RandomSearch,
    "evolution": RegularizedEvolution,
    "pbt": PopulationBasedTraining,
    "reinforce": Reinforce,
    "optuna": OptunaSampler,
    "local_search": LocalSearch,
    "predictor": Predictor,
}

__all__ = [
    "CONTINUE", "CONTROLLERS", "STOP", "Continue", "Controller", "Decision", "Exploit", "LocalSearch",
    "OptunaSampler", "PopulationBasedTraining", "Predictor", "RandomSearch", "RegularizedEvolution", "Reinforce",
    "Result", "Stop", "TrialSpec",
]
