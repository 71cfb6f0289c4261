"""The search space: domains (`Int`, `Float`, `Choice`), the `Space` that samples, mutates, encodes and checks
configs, and conversion from Ray Tune's and Optuna's spaces (`nasplat.space.convert`)."""

from nasplat.space.choice import Choice
from nasplat.space.domains import Domain, Float, Int
from nasplat.space.space import MAX_ATTEMPTS, Config, ForbiddenConfigError, Rule, Space

__all__ = ["MAX_ATTEMPTS", "Choice", "Config", "Domain", "Float", "ForbiddenConfigError", "Int", "Rule", "Space"]
