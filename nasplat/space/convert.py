"""Build nasplat spaces from Ray Tune domains and from Optuna distributions."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from nasplat.space import Choice, Float, Int, Space

MAX_GRID = 10_000  # the most values a quantized (stepped) domain may expand to as a Choice


def _grid(key: str, base: float, step: float, first: int, last: int, *, integer: bool) -> Choice:
    """A `Choice` of `base + i * step` for i in [first, last] (the values a stepped domain can take)."""
    count = last - first + 1
    if not 1 <= count <= MAX_GRID:
        raise ValueError(f"{key!r}: a stepped domain becomes a Choice of its values, which needs 1 to {MAX_GRID} "
                         f"values; got {count} for {base=}, {step=}, {first=}, {last=}")
    values = [base + i * step for i in range(first, last + 1)]
    # int(round(...)): numpy's round() of a numpy float is a numpy float in older numpy (1.18, for one)
    return Choice([int(round(v)) for v in values] if integer else values)  # noqa: RUF046 (see above)


def _inward(low: float, high: float) -> tuple[int, int]:
    """The integers from `low` rounded up to `high` rounded down (values within 1e-9 of an integer count as it)."""
    return math.ceil(low - 1e-9), math.floor(high + 1e-9)


def space_from_tune(param_space: Mapping[str, Any]) -> Space:
    """A `Space` from a Ray Tune `param_space` (`tune.choice`, `tune.uniform`, `tune.loguniform`, `tune.randint`, ...).

    `randint`/`lograndint` exclude their upper bound, as in Tune; quantized domains (`qrandint`, `quniform`,
    ...) become a `Choice` of their grid values, with the upper bound included as Tune includes it;
    `grid_search` becomes a `Choice` of its values. Dicts nest, also inside `tune.choice`.
    """
    from ray.tune.search import sample as tune_sample

    def convert(key: str, domain: Any) -> Any:
        if isinstance(domain, Mapping):
            if set(domain) == {"grid_search"}:
                return Choice([convert(key, v) for v in domain["grid_search"]])
            return {k: convert(f"{key}.{k}", v) for k, v in domain.items()}
        if not isinstance(domain, tune_sample.Domain):
            return domain
        if isinstance(domain, tune_sample.Categorical):
            return Choice([convert(key, c) for c in domain.categories])
        sampler = domain.get_sampler()
        q = None
        if isinstance(sampler, tune_sample.Quantized):
            q, sampler = sampler.q, sampler.get_sampler()
        if isinstance(sampler, tune_sample.Normal):
            raise TypeError(f"{key!r}: {domain!r} draws from a normal distribution (tune.randn / tune.qrandn), "
                            "which has no bounds; use tune.uniform or tune.loguniform")
        log = isinstance(sampler, tune_sample.LogUniform)
        if isinstance(domain, tune_sample.Integer):
            if q is not None and q != 1:  # Tune's quantized integers include the upper bound
                first, last = _inward(domain.lower / q, domain.upper / q)
                return _grid(key, 0, q, first, last, integer=True)
            return Int(int(domain.lower), int(domain.upper) - 1, log=log)  # Tune's upper bound is exclusive
        if isinstance(domain, tune_sample.Float):
            if q is not None:
                first, last = _inward(domain.lower / q, domain.upper / q)
                return _grid(key, 0.0, q, first, last, integer=False)
            return Float(float(domain.lower), float(domain.upper), log=log)
        raise TypeError(f"{key!r}: unsupported Ray Tune domain {domain!r}; allowed: choice, uniform, "
                        "loguniform, quniform, qloguniform, randint, lograndint, qrandint, qlograndint, grid_search")

    return Space({k: convert(k, v) for k, v in param_space.items()})


def space_from_optuna(distributions: Mapping[str, Any]) -> Space:
    """A `Space` from Optuna distributions (`CategoricalDistribution`, `FloatDistribution`, `IntDistribution`).

    A distribution with a `step` (other than an `IntDistribution`'s step of 1) becomes a `Choice` of its values.
    """
    import optuna.distributions as od

    def convert(key: str, dist: Any) -> Any:
        if isinstance(dist, od.CategoricalDistribution):
            return Choice(list(dist.choices))
        if isinstance(dist, od.IntDistribution):
            if dist.step != 1:
                return _grid(key, dist.low, dist.step, 0, (dist.high - dist.low) // dist.step, integer=True)
            return Int(dist.low, dist.high, log=dist.log)
        if isinstance(dist, od.FloatDistribution):
            if dist.step is not None:
                last = math.floor((dist.high - dist.low) / dist.step + 1e-9)
                return _grid(key, dist.low, dist.step, 0, last, integer=False)
            return Float(dist.low, dist.high, log=dist.log)
        raise TypeError(f"{key!r}: unsupported Optuna distribution {dist!r}; "
                        "allowed: CategoricalDistribution, IntDistribution, FloatDistribution")

    return Space({k: convert(k, v) for k, v in distributions.items()})
