"""PB2's explore (Parker-Holder et al., 2020): a time-varying GP-UCB bandit over the population's improvements.

PBT's explore perturbs a donor's config at random. PB2 instead models how fast members improved: every
perturbation interval a member adds one observation, (time, score at the interval's start, its numeric
hyperparameters during the interval) -> (change of its score) / (steps of the interval). A Gaussian process
(scikit-learn's `GaussianProcessRegressor`) fitted to the most recent observations, with time as one of its inputs
(an anisotropic RBF: points far apart in time correlate less, the learned length scale along time says how fast the
past is forgotten, an approximation of the paper's time-varying kernel) and the starting score as another (as Ray
Tune's PB2 does: a better state improves differently), gives a mean and an uncertainty for any hyperparameters at
the time of the interval to come and from the donor's score; the new hyperparameters maximise the upper confidence
bound (GP-UCB, `mean + kappa * std`, kappa growing slowly with the observations as in Srinivas et al. 2010). The
configs already chosen in the same round count as pending evaluations: the GP's uncertainty is conditioned on
them (GP-BUCB), so one round's choices spread out. The bound is maximised over the unit box by seeded random
candidates and L-BFGS-B refinement from the best few.

Only `Float` and `Int` decisions outside a `Choice` (at the top level or in nested dicts) are the bandit's inputs,
each on its own scale (log or linear) mapped to [0, 1]; everything else keeps PBT's perturbation.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

from nasplat.space import Config, Float, Int, Space

WINDOW = 200  # the most recent observations the GP is fitted to
MIN_OBSERVATIONS = 2  # fewer: PBT's perturbation decides
CANDIDATES = 512  # random points of the unit box scored before refinement
REFINED = 3  # the best candidates refined by L-BFGS-B
UCB_SCALE = 0.2  # Srinivas et al.'s beta scaled down, as is usual in practice (their constant is for the proof)

Path = tuple[str, ...]


def numeric_decisions(space: Space, prefix: Path = ()) -> Iterator[tuple[Path, Int | Float]]:
    """The `Float` and `Int` decisions (with more than one value) outside any `Choice`, by their key path."""
    for key, domain in space.domains.items():
        if isinstance(domain, Space):
            yield from numeric_decisions(domain, (*prefix, key))
        elif isinstance(domain, (Float, Int)) and domain.low < domain.high:
            yield (*prefix, key), domain


def to_unit(domain: Int | Float, value: Any) -> float:
    """`value`'s position in [0, 1] on the domain's scale (log or linear)."""
    low, high, x = float(domain.low), float(domain.high), float(value)
    if domain.log:
        low, high, x = math.log(low), math.log(high), math.log(x)
    return min(max((x - low) / (high - low), 0.0), 1.0)


def from_unit(domain: Int | Float, unit: float) -> int | float:
    """The value at position `unit` of [0, 1] on the domain's scale, inside its bounds (rounded for an `Int`)."""
    low, high, u = float(domain.low), float(domain.high), min(max(float(unit), 0.0), 1.0)
    x = math.exp(math.log(low) + u * (math.log(high) - math.log(low))) if domain.log else low + u * (high - low)
    if isinstance(domain, Int):
        return min(max(round(x), domain.low), domain.high)
    return min(max(x, domain.low), domain.high)


def _get(config: Config, path: Path) -> Any:
    for key in path:
        config = config[key]
    return config


def _set(config: Config, path: Path, value: Any) -> None:
    for key in path[:-1]:
        config = config[key]
    config[path[-1]] = value


class Bandit:
    """PB2's model of the population's improvements and its choice of new hyperparameters (see the module)."""

    def __init__(self, space: Space) -> None:
        self.decisions = list(numeric_decisions(space))
        # ((time, start score), unit hyperparameters, improvement per step), the most recent last
        self.observations: list[tuple[tuple[float, float], list[float], float]] = []
        self.pending: list[tuple[tuple[float, float], list[float]]] = []  # (context, unit hyperparameters) this round
        self.chosen = 0  # explores the bandit decided (the others fell back to PBT's perturbation)

    def encode(self, config: Config) -> list[float]:
        """The bandit's inputs of `config`: each numeric decision's position in [0, 1]."""
        return [to_unit(domain, _get(config, path)) for path, domain in self.decisions]

    def observe(self, time: float, start: float, config: Config, improvement: float) -> None:
        """A member with `config` improved its score by `improvement` per step over the interval ending at `time`,
        from the score `start`."""
        if self.decisions and math.isfinite(improvement) and math.isfinite(start):
            self.observations.append(((float(time), float(start)), self.encode(config), float(improvement)))
            del self.observations[:-WINDOW]

    def explore(self, config: Config, time: float, start: float, rng: np.random.Generator) -> Config:
        """`config` (PBT's explore of the donor's) with its numeric decisions set to the bandit's choice for the
        interval ending at `time` and starting from the score `start`; unchanged while the bandit has too few
        distinct observations."""
        context = (float(time), float(start))
        unit = self.select(context, rng)
        if unit is None:
            return config
        for (path, domain), u in zip(self.decisions, unit):
            _set(config, path, from_unit(domain, u))
        self.pending = [p for p in self.pending if p[0][0] == context[0]] + [(context, [float(u) for u in unit])]
        self.chosen += 1
        return config

    def select(self, context: tuple[float, float], rng: np.random.Generator) -> np.ndarray | None:
        """The unit hyperparameters maximising the upper confidence bound in `context` (time, start score), or None
        without a model."""
        if len(self.observations) < MIN_OBSERVATIONS:
            return None
        gains = np.array([o[2] for o in self.observations])
        if np.ptp(gains) == 0:
            return None
        contexts = np.array([o[0] for o in self.observations] + [context])
        low, span = contexts.min(axis=0), np.ptp(contexts, axis=0)
        contexts = (contexts - low) / np.where(span > 0, span, 1.0)  # each in [0, 1]: time, start score
        units = np.array([o[1] for o in self.observations])
        inputs = np.column_stack([contexts[:-1], units])
        target = (gains - gains.mean()) / gains.std()
        model = _fit(inputs, target)
        now = contexts[-1]
        pending = [u for c, u in self.pending if c[0] == context[0]]
        if pending:  # condition the uncertainty on this round's choices; the mean stays (their values are its own)
            extra = np.column_stack([np.tile(now, (len(pending), 1)), np.array(pending)])
            model = _refit(model, np.vstack([inputs, extra]), np.concatenate([target, model.predict(extra)]))
        # GP-UCB (Srinivas et al. 2010): beta_n = 2 log(d n^2 pi^2 / (6 delta)), delta = 0.1, scaled
        beta = UCB_SCALE * 2 * math.log(units.shape[1] * len(gains) ** 2 * math.pi ** 2 / (6 * 0.1))

        def ucb(points: np.ndarray) -> np.ndarray:
            mean, std = model.predict(np.column_stack([np.tile(now, (len(points), 1)), points]), return_std=True)
            return mean + math.sqrt(beta) * std

        return _maximise(ucb, units.shape[1], rng)


def _fit(inputs: np.ndarray, target: np.ndarray) -> Any:
    """A GP with a constant x anisotropic RBF kernel (time first) plus noise, its hyperparameters fitted."""
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

    kernel = (ConstantKernel(1.0, (1e-2, 1e2)) * RBF(np.full(inputs.shape[1], 0.5), (1e-2, 1e2))
              + WhiteKernel(0.1, (1e-6, 1.0)))
    model = GaussianProcessRegressor(kernel, alpha=1e-8, n_restarts_optimizer=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # bounds reached by a length scale: the fit stands
        return model.fit(inputs, target)


def _refit(model: Any, inputs: np.ndarray, target: np.ndarray) -> Any:
    """The fitted `model`'s kernel, unchanged, conditioned on `inputs`."""
    from sklearn.gaussian_process import GaussianProcessRegressor

    return GaussianProcessRegressor(model.kernel_, alpha=1e-8, optimizer=None).fit(inputs, target)


def _maximise(function: Any, dimensions: int, rng: np.random.Generator) -> np.ndarray:
    """The point of [0, 1]^dimensions where `function` (vectorised) is highest: the best of `CANDIDATES` random
    points and L-BFGS-B from the `REFINED` best of them."""
    from scipy.optimize import minimize

    candidates = rng.random((CANDIDATES, dimensions))
    values = function(candidates)
    best = int(np.argmax(values))
    point, value = candidates[best], values[best]
    for start in candidates[np.argsort(-values, kind="stable")[:REFINED]]:
        found = minimize(lambda x: -function(x[None, :])[0], start, method="L-BFGS-B",
                         bounds=[(0.0, 1.0)] * dimensions, options={"maxiter": 30})
        if -found.fun > value:
            point, value = np.clip(found.x, 0.0, 1.0), -found.fun
    return point
