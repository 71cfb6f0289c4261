"""nasplat: population and architecture search on Ray."""

from nasplat.api import resume, run
from nasplat.checkpoint import CheckpointPolicy
from nasplat.controllers import (
    Continue, Controller, Exploit, OptunaSampler, PopulationBasedTraining, RandomSearch, RegularizedEvolution,
    Reinforce, Result, Stop, TrialSpec,
)
from nasplat.integrations.optuna_export import to_optuna
from nasplat.interop import space_from_optuna, space_from_tune
from nasplat.trials import ExperimentFailed
from nasplat.results import ExperimentResult
from nasplat.space import Choice, Float, Int, Space
from nasplat.trainer import Trainer, WorkerContext

__version__ = "0.1.0"

__all__ = [
    "CheckpointPolicy", "Choice", "Continue", "Controller", "ExperimentFailed", "ExperimentResult", "Exploit", "Float", "Int", "OptunaSampler",
    "PopulationBasedTraining", "RandomSearch", "RegularizedEvolution", "Reinforce", "Result", "Space", "Stop",
    "Trainer", "TrialSpec", "WorkerContext", "resume", "run", "space_from_optuna", "space_from_tune",
    "to_optuna",
]
