"""The search space: domains (`Int`, `Float`, `Choice`), the `Space` that samples, mutates, encodes and checks
configs, and conversion from Ray Tune's and Optuna's spaces (`nasplat.space.convert`)."""

from nasplat.space import space as _space_module
from nasplat.space.choice import Choice
from nasplat.space.domains import Domain, Float, Int
from nasplat.space.space import MAX_ATTEMPTS, Config, ForbiddenConfigError, Rule, Space

# Pickles made before `Choice` moved to `nasplat.space.choice` (a spec's `experiment.pkl`) name it
# `nasplat.space.space.Choice`; importing that module runs this package first, so they still load.
setattr(_space_module, "Choice", Choice)  # noqa: B010 - not an attribute space.py declares (it cannot import Choice)

__all__ = ["MAX_ATTEMPTS", "Choice", "Config", "Domain", "Float", "ForbiddenConfigError", "Int", "Rule", "Space"]
