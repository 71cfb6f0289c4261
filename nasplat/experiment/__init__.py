"""An experiment from a YAML file (`file`) or from `nasplat.run`'s arguments, checked once into a typed
`ExperimentSpec` (`spec`), made into a `BuiltExperiment` (`build`: the trainer imported, the controller, scheduler,
executor and callbacks made from their registries), then run or resumed (`run`)."""

from nasplat.experiment.build import BuiltExperiment, build
from nasplat.experiment.run import resume, run, run_spec
from nasplat.experiment.spec import ExperimentSpec

__all__ = ["BuiltExperiment", "ExperimentSpec", "build", "resume", "run", "run_spec"]
