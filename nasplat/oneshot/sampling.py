"""Which path each training batch of a supernet trains: uniform (SPOS) or fair (FairNAS) sampling.

A sampler is a pure function of `(seed, step)`: `sampler.path(step)` is the path of the `step`-th batch (counted
from the start of training, across epochs and resumes), so every rank of a data-parallel gang that shares the seed
trains the same path at the same step, and a resumed trial goes on with the paths it would have trained. Paths are
configs of the sampler's space and never break its rules (`Space(forbidden=...)`): a forbidden path is never trained.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from nasplat.core.checks import check_int
from nasplat.core.registry import Registry
from nasplat.space import Choice, Config, Space
from nasplat.space.domains import Domain, copy_config

GROUP_ATTEMPTS = 100
"""Draws of a FairNAS group before its forbidden paths are replaced one by one (see `FairSampler`)."""


def rng_for(seed: int, *index: int) -> np.random.Generator:
    """The generator of `(seed, *index)`: independent streams for each index, identical for equal arguments."""
    return np.random.default_rng(np.random.SeedSequence([int(seed) % 2**63, *(int(i) for i in index)]))


class PathSampler(ABC):
    """The path of every training step, a function of `(seed, step)` only; paths are allowed configs of `space`."""

    name = ""

    def __init__(self, space: Space, seed: int = 0) -> None:
        if not isinstance(space, Space):
            raise TypeError(f"a path sampler needs a nasplat Space, got {type(space).__name__}")
        self.space = space
        self.seed = check_int("seed", seed)

    @abstractmethod
    def path(self, step: int) -> Config:
        """The path the batch of training step `step` (>= 0) trains."""


class UniformSampler(PathSampler):
    """Single-path one-shot with uniform sampling (SPOS, Guo et al. 2020): each step a path drawn uniformly from the
    allowed configs of the space (`Space.sample`, which redraws forbidden ones)."""

    name = "spos"

    def path(self, step: int) -> Config:
        return self.space.sample(rng_for(self.seed, check_int("step", step, minimum=0)))


class FairSampler(PathSampler):
    """Fair sampling (FairNAS, Chu et al. 2021): steps come in groups of `group_size` = the largest number of options
    of a decision; within a group, every decision takes each of its options exactly once (a fresh random permutation
    per decision and group), so every candidate of every layer is trained once per group.

    A decision with fewer options takes each one at most once more than another (the permutation repeated). Under a
    space's rules a group is redrawn until none of its paths is forbidden; after `GROUP_ATTEMPTS` draws the forbidden
    paths of the last draw are replaced by uniform allowed ones (counted in `repaired`), which keeps every trained
    path allowed at the cost of exact fairness (rules that forbid some option outright make it impossible anyway).
    Decisions that are no `Choice` (numbers) are drawn at random per path; constants are copied."""

    name = "fairnas"

    def __init__(self, space: Space, seed: int = 0) -> None:
        super().__init__(space, seed)
        for key, domain in space.domains.items():
            if isinstance(domain, Space) or (isinstance(domain, Choice) and domain.branches):
                raise ValueError(f"FairSampler needs a flat space (a supernet's): {key!r} is a sub-space")
        sizes = [d.cardinality for d in space.domains.values() if isinstance(d, Choice)]
        self.group_size = max(sizes, default=1)
        self.repaired = 0
        self._cache: tuple[int, list[Config]] | None = None

    def path(self, step: int) -> Config:
        step = check_int("step", step, minimum=0)
        return copy_config(self.group(step // self.group_size)[step % self.group_size])

    def group(self, index: int) -> list[Config]:
        """The `group_size` paths of group `index` (steps `index * group_size` to `(index + 1) * group_size - 1`)."""
        if self._cache is not None and self._cache[0] == index:
            return self._cache[1]
        rng = rng_for(self.seed, index)
        paths = self._draw(rng)
        for _ in range(GROUP_ATTEMPTS - 1):
            if not self.space.constrained or all(self.space.allows(p) for p in paths):
                break
            paths = self._draw(rng)
        else:
            for i, p in enumerate(paths):
                if not self.space.allows(p):
                    paths[i] = self.space.sample(rng)
                    self.repaired += 1
        self._cache = (index, paths)
        return paths

    def _draw(self, rng: np.random.Generator) -> list[Config]:
        k = self.group_size
        columns: dict[str, list[Any]] = {}
        for key, domain in self.space.domains.items():
            if isinstance(domain, Choice):
                n = domain.cardinality
                order = np.concatenate([rng.permutation(n) for _ in range(-(-k // n))])[:k]
                columns[key] = [domain.decode(int(i)) for i in order]
            elif isinstance(domain, Domain):
                columns[key] = [domain.sample(rng) for _ in range(k)]
            else:
                columns[key] = [copy_config(domain) for _ in range(k)]
        return [{key: values[t] for key, values in columns.items()} for t in range(k)]


SAMPLERS: Registry[type[PathSampler]] = Registry("path sampler", {"spos": UniformSampler, "fairnas": FairSampler})
"""Samplers by name: `spos` (uniform) and `fairnas` (fair)."""


def make_sampler(name: str, space: Space, seed: int = 0) -> PathSampler:
    """The sampler called `name` (see `SAMPLERS`) over `space`."""
    return SAMPLERS.lookup(name)(space, seed)
