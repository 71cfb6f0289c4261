"""A fixed-length numeric encoding of a space's configs, for learned models of the metric.

Each `Choice` is one-hot over its options, each `Int`/`Float` one number in [0, 1] (log-scaled for
`log=True`); decisions of conditional branches not taken are all zeros; constants take no room. `features`, a
function of a config to numbers (a zero-cost proxy's scores, say), adds those after the encoding, squashed by
sign(v) * log1p(|v|) / 10 so that scores of any scale (synflow's reach 1e30) sit beside the one-hot columns.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Mapping, Sequence
from typing import Any

import numpy as np

from nasplat.space import Choice, Config, Float, Int, Space
from nasplat.space.domains import config_key

Pool = tuple[list[Any], list[Config], np.ndarray]
"""A pool of candidate configs: their `config_key`s, the configs, and their encodings (one row each)."""

# A space's layout: (key, domain, offset, the layouts of a Choice's dict options, None for other options).
Layout = list[tuple[str, Any, int, list["Layout | None"]]]


class Encoder:
    """`encode(config) -> np.ndarray` of length `size` for configs of `space`, with `features(config)` after the
    encoding when given (their count is read from one call on a config of a fixed draw)."""

    def __init__(self, space: Space, features: Callable[[Config], Sequence[float]] | None = None) -> None:
        self.space, self.features = space, features
        self.size = 0
        self.layout = self._plan(space)
        self.base = self.size
        if features is not None:
            self.size += len(features(space.sample(np.random.default_rng(0))))

    def _plan(self, space: Space) -> Layout:
        layout: Layout = []
        for key, domain in space.domains.items():
            if isinstance(domain, Space):
                layout.append((key, domain, -1, [self._plan(domain)]))
            elif isinstance(domain, Choice):
                offset, self.size = self.size, self.size + len(domain.options)
                branches = [self._plan(o) if isinstance(o, Space) else None for o in domain.options]
                layout.append((key, domain, offset, branches))
            elif isinstance(domain, (Int, Float)):
                layout.append((key, domain, self.size, []))
                self.size += 1
        return layout

    def encode(self, config: Config) -> np.ndarray:
        """The config's features (float32)."""
        out = np.zeros(self.size, dtype=np.float32)
        self._fill(self.layout, config, out)
        self._add_features(config, out)
        return out

    def encode_many(self, configs: list[Config]) -> np.ndarray:
        """One row per config."""
        out = np.zeros((len(configs), self.size), dtype=np.float32)
        for row, config in zip(out, configs):
            self._fill(self.layout, config, row)
            self._add_features(config, row)
        return out

    def _add_features(self, config: Config, out: np.ndarray) -> None:
        if self.features is None:
            return
        values = np.asarray(self.features(config), dtype=np.float64)
        if values.shape != (self.size - self.base,) or not np.all(np.isfinite(values)):
            raise ValueError(f"`features` must give {self.size - self.base} finite numbers for every config, got "
                             f"{values.tolist()} for {config!r}")
        out[self.base:] = np.sign(values) * np.log1p(np.abs(values)) / 10.0

    def _fill(self, layout: Layout, config: Mapping[str, Any], out: np.ndarray) -> None:
        for key, domain, offset, branches in layout:
            value = config[key]
            if isinstance(domain, Space):
                self._fill(branches[0], value, out)  # type: ignore[arg-type]
            elif isinstance(domain, Choice):
                index = domain.index(key, value)
                out[offset + index] = 1.0
                branch = branches[index]
                if branch is not None:
                    self._fill(branch, value, out)
            else:
                out[offset] = _unit(domain, value)


def _unit(domain: Int | Float, value: float) -> float:
    low, high = float(domain.low), float(domain.high)
    if high <= low:
        return 0.0
    if domain.log:
        return (math.log(value) - math.log(low)) / (math.log(high) - math.log(low))
    return (float(value) - low) / (high - low)


def refill_pool(pool: Pool, seen: Container[Any], size: int, encoder: Encoder, rng: np.random.Generator) -> Pool:
    """`pool` without the configs whose key is in `seen`, refilled to `size` with fresh samples of the encoder's
    space (drawn from `rng`, encoded once): the random candidates a model-based controller scores."""
    keys, configs, rows = pool
    kept = [i for i, key in enumerate(keys) if key not in seen]
    keys, configs, rows = [keys[i] for i in kept], [configs[i] for i in kept], rows[kept]
    fresh = [encoder.space.sample(rng) for _ in range(size - len(kept))]
    if fresh:
        keys += [config_key(c) for c in fresh]
        configs += fresh
        rows = np.concatenate([rows, encoder.encode_many(fresh)])
    return keys, configs, rows
