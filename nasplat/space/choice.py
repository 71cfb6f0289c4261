"""`Choice`: a decision among listed options, where an option that is a dict is a sub-space (a conditional branch:
the sub-domains of the chosen option exist only in it).

It lives apart from the leaf domains (`nasplat.space.domains`) because its options may be `Space`s; `Space` itself
knows it only as a `Domain` (`changeable`, `constrained`) and through the walk (`node_kind = "choice"`).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from typing import Any

import numpy as np

from nasplat.space.domains import Domain, check_token, copy_config, random_index, same_value
from nasplat.space.space import Space

__all__ = ["Choice"]


class Choice(Domain):
    """One of `options`; options that are dicts are sub-spaces (conditional parameters)."""

    node_kind = "choice"  # to `walk`

    def __init__(self, options: list[Any]) -> None:
        if not isinstance(options, (list, tuple)) or len(options) == 0:
            raise ValueError(f"Choice needs a non-empty list of options, got {options!r}")
        self.options = [Space(o) if isinstance(o, Mapping) else o for o in options]
        self._lookup: dict[Any, int] = {}  # hashable option -> its first index: a fast path for `index`
        for i, option in enumerate(self.options):
            try:
                self._lookup.setdefault(option, i)
            except TypeError:
                pass
        # All options hashable and pairwise unequal (1 and True, or 1 and 1.0, hash alike and count as equal).
        self._distinct = len(self._lookup) == len(self.options) > 1 and not self.branches

    def __repr__(self) -> str:
        return f"Choice({self.options!r})"

    @cached_property
    def changeable(self) -> bool:
        """Whether some option differs from the first (duplicates are allowed, e.g. to weight a value)."""
        return any(isinstance(o, Space) or not same_value(o, self.options[0]) for o in self.options[1:])

    @property
    def constrained(self) -> bool:
        """Whether a sub-space option has rules."""
        return any(isinstance(o, Space) and o.constrained for o in self.options)

    @property
    def branches(self) -> bool:
        """Whether an option is a sub-space (a conditional decision)."""
        return any(isinstance(o, Space) for o in self.options)

    def sample(self, rng: np.random.Generator) -> Any:
        return self._materialise(random_index(rng, len(self.options)), rng)

    def _materialise(self, index: int, rng: np.random.Generator | None) -> Any:
        option = self.options[index]
        if isinstance(option, Space):
            return option.sample(rng) if rng is not None else option.default()
        return copy_config(option)  # a list option must not be shared between configs and the space

    def index(self, path: str, value: Any) -> int:
        try:
            i = None if type(value) is dict else self._lookup.get(value)  # a dict is unhashable: no exception raised
        except TypeError:
            i = None
        if i is not None and same_value(self.options[i], value):
            return i
        for i, option in enumerate(self.options):
            if isinstance(option, Space):
                if isinstance(value, Mapping) and option.fits(value):
                    return i
            elif not isinstance(value, Mapping) and same_value(option, value):
                return i
        raise ValueError(f"{path!r}: {value!r} is not one of the allowed options {self.options!r}")

    def check(self, path: str, value: Any) -> None:
        try:
            self.index(path, value)
        except ValueError:
            closest = self._closest(value)
            if closest is not None:  # name the nested key at fault rather than the whole dict
                closest.validate(value, prefix=path + ".")
            raise

    def _closest(self, value: Any) -> Space | None:
        """The one dict option `value` was evidently meant for (its constants match, then its keys), if any."""
        if not isinstance(value, Mapping):
            return None
        candidates = [o for o in self.options if isinstance(o, Space) and all(
            k in value and same_value(c, value[k]) for k, c in o.domains.items() if not isinstance(c, (Domain, Space)))]
        if len(candidates) > 1:
            candidates = [o for o in candidates if set(o.domains) == set(value)]
        return candidates[0] if len(candidates) == 1 else None

    def neighbours(self, value: Any, rng: np.random.Generator) -> list[Any]:
        """Every other option (a dict option with a fresh sample of its sub-space), duplicates once."""
        current = self.index("", value)
        out: list[Any] = []
        for i, option in enumerate(self.options):
            if i == current or (not isinstance(option, Space) and (
                    same_value(option, value) or any(same_value(option, o) for o in out))):
                continue
            out.append(self._materialise(i, rng))
        return out

    def resample_other(self, value: Any, rng: np.random.Generator) -> Any:
        current = self.index("", value)
        if self._distinct:  # the common case: any option but the current one
            other = random_index(rng, len(self.options) - 1)
            return self._materialise(other + (other >= current), rng)
        others = [i for i, o in enumerate(self.options)
                  if i != current and (isinstance(o, Space) or not same_value(o, value))]
        new = value
        for _ in range(16):  # a dict option may overlap the current one; draw until the value differs
            if not others:
                break
            new = self._materialise(others[random_index(rng, len(others))], rng)
            if not isinstance(new, Mapping) or new != value:
                break
        return new

    def nudge(self, value: Any, rng: np.random.Generator) -> Any:
        current = self.index("", value)
        step = 1 if rng.random() < 0.5 else -1
        target = min(max(current + step, 0), len(self.options) - 1)
        if target == current:
            target = min(max(current - step, 0), len(self.options) - 1)
        return value if target == current else self._materialise(target, rng)

    @property
    def cardinality(self) -> int:
        return len(self.options)

    def encode(self, value: Any) -> int:
        return self.index("", value)

    def decode(self, token: int, rng: np.random.Generator | None = None) -> Any:
        return self._materialise(check_token(token, len(self.options)), rng)
