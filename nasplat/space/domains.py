"""The leaf domains of a search space: the `Domain` contract, `Int` and `Float`, and shared helpers.

`Choice`, which may hold sub-spaces, lives in `nasplat.space.choice`.
"""

from __future__ import annotations

import bisect
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import numpy as np

from nasplat.core.checks import is_int, is_real


class Domain(ABC):
    """One decision of a search space."""

    @property
    def changeable(self) -> bool:
        """Whether a value other than any given one exists (a mutation can change it): True unless the domain has
        a single value."""
        return True

    @property
    def constrained(self) -> bool:
        """Whether a sub-space of the domain has rules (`Space.forbidden`): False unless it holds sub-spaces."""
        return False

    @abstractmethod
    def sample(self, rng: np.random.Generator) -> Any:
        """A value drawn with `rng`."""

    @abstractmethod
    def check(self, path: str, value: Any) -> None:
        """Raise `ValueError`/`TypeError` naming `path`, `value` and what is allowed."""

    @abstractmethod
    def resample_other(self, value: Any, rng: np.random.Generator) -> Any:
        """A value different from `value` (mutation)."""

    @abstractmethod
    def nudge(self, value: Any, rng: np.random.Generator) -> Any:
        """A nearby value: PBT's explore (x0.8 / x1.2 for numbers, a neighbouring option)."""

    def neighbours(self, value: Any, rng: np.random.Generator) -> list[Any]:
        """The values one step from `value` (local search): by default two nudges, without `value` itself."""
        out: list[Any] = []
        for _ in range(2):
            new = self.nudge(value, rng)
            if not same_value(new, value) and not any(same_value(new, o) for o in out):
                out.append(new)
        return out

    @property
    @abstractmethod
    def cardinality(self) -> int:
        """Number of tokens in the encoding (floats are binned)."""

    @abstractmethod
    def encode(self, value: Any) -> int:
        """The token (0 .. cardinality - 1) of `value`."""

    @abstractmethod
    def decode(self, token: int, rng: np.random.Generator | None = None) -> Any:
        """A value of `token`'s bin (its middle for numbers; a fresh sample of a sub-space with `rng`)."""



class Int(Domain):
    """An integer in [low, high], both inclusive; `log=True` samples log-uniformly.

    Encoded exactly when the range has at most `bins` values, else in up to `bins` bins of consecutive
    integers (equal widths on the linear or log scale; bins that would hold no integer are dropped).
    """

    def __init__(self, low: int, high: int, *, log: bool = False, bins: int = 16) -> None:
        if not (is_int(low) and is_int(high)):
            raise TypeError(f"Int bounds must be integers, got {low=!r}, {high=!r}")
        if low > high or (log and low < 1):
            raise ValueError(f"Int needs low <= high (and low >= 1 with log=True), got {low=}, {high=}, {log=}")
        if not is_int(bins) or bins < 1:
            raise ValueError(f"Int needs an integer bins >= 1, got {bins=!r}")
        self.low, self.high, self.log = int(low), int(high), log
        self.starts = self._bin_starts(int(bins))  # the first integer of each token's bin, ascending
        self.bins = len(self.starts)

    def __repr__(self) -> str:
        return f"Int({self.low}, {self.high}, log={self.log})"

    @property
    def changeable(self) -> bool:
        return self.low < self.high

    def _bin_starts(self, bins: int) -> list[int]:
        if self.high - self.low + 1 <= bins:
            return list(range(self.low, self.high + 1))
        lo, hi = (math.log(self.low), math.log(self.high + 1)) if self.log else (self.low, self.high + 1)
        starts = {self.low}
        for edge in np.linspace(lo, hi, bins + 1)[1:-1]:
            x = math.exp(edge) if self.log else float(edge)
            start = math.ceil(x - 1e-9 * max(1.0, abs(x)))
            if self.low < start <= self.high:
                starts.add(start)
        return sorted(starts)

    def sample(self, rng: np.random.Generator) -> int:
        if self.log:
            x = math.exp(rng.uniform(math.log(self.low), math.log(self.high + 1)))
            return min(int(x), self.high)
        return int(rng.integers(self.low, self.high + 1))

    def check(self, path: str, value: Any) -> None:
        if not is_int(value):
            raise TypeError(f"{path!r} must be an integer in [{self.low}, {self.high}], got {value!r}")
        if not self.low <= value <= self.high:
            raise ValueError(f"{path!r} must be in [{self.low}, {self.high}], got {value!r}")

    def resample_other(self, value: Any, rng: np.random.Generator) -> int:
        if self.low == self.high:
            return value
        while (new := self.sample(rng)) == value:
            pass
        return new

    def nudge(self, value: Any, rng: np.random.Generator) -> int:
        factor = 0.8 if rng.random() < 0.5 else 1.2
        new = int(round(value * factor))  # noqa: RUF046 (a numpy float's round() is a float in older numpy)
        if new == value:
            new = value + (1 if factor > 1 else -1)
        return min(max(new, self.low), self.high)

    def neighbours(self, value: Any, rng: np.random.Generator) -> list[int]:
        """A step down and a step up (x0.8 / x1.2, at least 1), inside the bounds."""
        # int(round(...)): `value` may be a numpy integer, whose products' round() is a numpy float in older numpy
        down = min(int(round(value * 0.8)), value - 1)  # noqa: RUF046 (see above)
        up = max(int(round(value * 1.2)), value + 1)  # noqa: RUF046 (see above)
        return [v for v in (down, up) if self.low <= v <= self.high]

    @property
    def cardinality(self) -> int:
        return self.bins

    def encode(self, value: Any) -> int:
        return max(bisect.bisect_right(self.starts, value) - 1, 0)

    def decode(self, token: int, rng: np.random.Generator | None = None) -> int:
        token = check_token(token, self.bins)
        first = self.starts[token]
        last = self.starts[token + 1] - 1 if token + 1 < self.bins else self.high
        middle = round(math.sqrt(first * last)) if self.log else (first + last) // 2
        return min(max(int(middle), first), last)


NEIGHBOUR_STEP = 0.1
"""A `Float`'s neighbours (local search, the predictor's candidates) are this share of its range away, on its scale."""


class Float(Domain):
    """A float in [low, high]; `log=True` samples log-uniformly. Encoded into `bins` bins."""

    def __init__(self, low: float, high: float, *, log: bool = False, bins: int = 8) -> None:
        if not (is_real(low) and is_real(high)):
            raise TypeError(f"Float bounds must be numbers, got {low=!r}, {high=!r}")
        if not (math.isfinite(low) and math.isfinite(high)) or low >= high or (log and low <= 0):
            raise ValueError(f"Float needs finite low < high (and low > 0 with log=True), got {low=}, {high=}, {log=}")
        if not is_int(bins) or bins < 1:
            raise ValueError(f"Float needs an integer bins >= 1, got {bins=!r}")
        self.low, self.high, self.log, self.bins = float(low), float(high), log, bins

    def __repr__(self) -> str:
        return f"Float({self.low}, {self.high}, log={self.log})"

    def _to_unit(self, x: float) -> float:
        if self.log:
            return (math.log(x) - math.log(self.low)) / (math.log(self.high) - math.log(self.low))
        return (x - self.low) / (self.high - self.low)

    def _from_unit(self, u: float) -> float:
        if self.log:
            return math.exp(math.log(self.low) + u * (math.log(self.high) - math.log(self.low)))
        return self.low + u * (self.high - self.low)

    def sample(self, rng: np.random.Generator) -> float:
        return min(max(self._from_unit(float(rng.random())), self.low), self.high)

    def check(self, path: str, value: Any) -> None:
        if not is_real(value):
            raise TypeError(f"{path!r} must be a float in [{self.low}, {self.high}], got {value!r}")
        if not self.low <= value <= self.high:
            raise ValueError(f"{path!r} must be in [{self.low}, {self.high}], got {value!r}")

    def resample_other(self, value: Any, rng: np.random.Generator) -> float:
        return self.sample(rng)

    def nudge(self, value: Any, rng: np.random.Generator) -> float:
        factor = 0.8 if rng.random() < 0.5 else 1.2
        return min(max(float(value) * factor, self.low), self.high)

    def neighbours(self, value: Any, rng: np.random.Generator) -> list[float]:
        """A step down and a step up on the domain's scale, `NEIGHBOUR_STEP` of its range: added and subtracted
        (linear; from 0 too), or as a factor of `(high / low) ** NEIGHBOUR_STEP` (log); clipped to the bounds,
        without `value` itself. `rng` is not used: the neighbours of a value are always the same."""
        value = float(value)
        if self.log:
            factor = (self.high / self.low) ** NEIGHBOUR_STEP
            out = [value / factor, value * factor]
        else:
            step = NEIGHBOUR_STEP * (self.high - self.low)
            out = [value - step, value + step]
        out = [min(max(v, self.low), self.high) for v in out]
        return [v for i, v in enumerate(out) if v != value and v not in out[:i]]

    @property
    def cardinality(self) -> int:
        return self.bins

    def encode(self, value: Any) -> int:
        return min(int(self._to_unit(float(value)) * self.bins), self.bins - 1)

    def decode(self, token: int, rng: np.random.Generator | None = None) -> float:
        token = check_token(token, self.bins)
        return min(max(self._from_unit((token + 0.5) / self.bins), self.low), self.high)


def same_value(a: Any, b: Any) -> bool:
    """Whether two values of a decision are the same: equal, and both bools or neither (`True` is not `1`)."""
    if isinstance(a, bool) != isinstance(b, bool):
        return False
    try:
        return bool(a == b)
    except (TypeError, ValueError):
        return False


def check_token(token: int, n: int) -> int:
    """`token` as an int, if it is in [0, n)."""
    if not 0 <= int(token) < n:
        raise ValueError(f"token must be in [0, {n - 1}], got {token!r}")
    return int(token)


_ATOMS = frozenset({str, int, float, bool, type(None)})


def random_index(rng: np.random.Generator, n: int) -> int:
    """A uniform index in [0, n): `rng.random()` scaled, several times faster than `rng.integers(n)`."""
    return min(int(rng.random() * n), n - 1)


def config_key(value: Any) -> Any:
    """A hashable stand-in for a config: equal configs (dict order aside) give equal keys."""
    if isinstance(value, Mapping):
        return tuple(sorted((k, config_key(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, *(config_key(v) for v in value))
    return value


def copy_config(value: Any) -> Any:
    """A copy of the dicts and lists in a config (the leaves are immutable or shared)."""
    if isinstance(value, dict):
        return {k: v if type(v) in _ATOMS else copy_config(v) for k, v in value.items()}
    if isinstance(value, list):
        return [v if type(v) in _ATOMS else copy_config(v) for v in value]
    return value

