"""nasplat: population and architecture search on Ray."""

from nasplat.controllers import (
    Continue,
    Controller,
    Exploit,
    OptunaSampler,
    PopulationBasedTraining,
    RandomSearch,
    RegularizedEvolution,
    Reinforce,
    Result,
    Stop,
    TrialSpec,
)
from nasplat.engine.records import ExperimentFailed
from nasplat.engine.result import ExperimentResult
from nasplat.experiment.pipeline import run_pipeline
from nasplat.experiment.retrain import retrain
from nasplat.experiment.run import resume, run
from nasplat.integrations.optuna import to_optuna
from nasplat.space import Choice, Float, Int, Space
from nasplat.space.convert import space_from_optuna, space_from_tune
from nasplat.storage.checkpoints import CheckpointPolicy
from nasplat.trainer import Trainer, WorkerContext

__version__ = "0.1.0"

__all__ = [
    "CheckpointPolicy", "Choice", "Continue", "Controller", "ExperimentFailed", "ExperimentResult", "Exploit",
    "Float", "Int", "OptunaSampler", "PopulationBasedTraining", "RandomSearch", "RegularizedEvolution", "Reinforce",
    "Result", "Space", "Stop", "Trainer", "TrialSpec", "WorkerContext", "resume", "retrain", "run", "run_pipeline",
    "space_from_optuna", "space_from_tune", "to_optuna",
]
