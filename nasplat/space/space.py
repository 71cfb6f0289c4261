"""Search spaces: dicts of named domains, nested and conditional, and the operations searches need.

A space is a dict of named domains. A value that is a dict is a fixed sub-space; a `Choice` (`nasplat.space.choice`)
whose options are dicts is a conditional branch: the sub-domains of the chosen option exist only in it.
A space may name rules that forbid configurations (`forbidden={"rule": predicate}`): `sample`, `mutate`
and `perturb` never return a forbidden config, and `validate` names the rule it breaks.
Every random operation takes an explicit `numpy.random.Generator`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Container, Iterator, Mapping
from itertools import islice
from typing import Any

import numpy as np

from nasplat.core.checks import check_real
from nasplat.space.domains import Domain, Float, Int, config_key, copy_config, random_index, same_value
from nasplat.space.walk import DOMAIN_KINDS, walk

Config = dict[str, Any]
Rule = Callable[[Config], bool]  # True: the config is forbidden

MAX_ATTEMPTS = 1000
"""Draws `sample`, `mutate` and `perturb` make before they give up on finding an allowed config."""

__all__ = ["MAX_ATTEMPTS", "Config", "Domain", "Float", "ForbiddenConfigError", "Int", "Rule", "Space"]


class ForbiddenConfigError(ValueError):
    """A space's rules rejected every one of `MAX_ATTEMPTS` draws."""


class Space:
    """A dict of named domains, constants and sub-spaces, and the rules that forbid some of its configs.

    `forbidden` maps a rule's name to a predicate over a whole config of this space: a config for which any
    predicate returns True is invalid. Rules of a sub-space see the sub-config. `Space(space)` keeps the rules.
    """

    node_kind = "space"  # to `walk`

    def __init__(self, domains: Mapping[str, Any], *, forbidden: Mapping[str, Rule] | None = None) -> None:
        rules = dict(forbidden or {})
        if isinstance(domains, Space):
            rules = {**domains.forbidden, **rules}
            domains = domains.domains
        for name, rule in rules.items():
            if not isinstance(name, str) or not name or not callable(rule):
                raise TypeError(f"`forbidden` maps rule names (non-empty strings) to predicates config -> bool, "
                                f"got {name!r}: {rule!r}")
        self.forbidden: dict[str, Rule] = rules
        if not isinstance(domains, Mapping):
            raise TypeError(f"a space must be a dict of named domains, got {type(domains).__name__}: {domains!r}")
        self.domains: dict[str, Any] = {}
        for key, value in domains.items():
            if not isinstance(key, str):
                raise TypeError(f"space keys must be strings, got {key!r}")
            self.domains[key] = Space(value) if isinstance(value, Mapping) else value
        self.constrained: bool = bool(rules) or any(isinstance(d, (Domain, Space)) and d.constrained
                                                    for d in self.domains.values())

    def __repr__(self) -> str:
        rules = f", forbidden={sorted(self.forbidden)!r}" if self.forbidden else ""
        return f"Space({self.domains!r}{rules})"

    # -- rules -----------------------------------------------------------------------------
    def broken_rule(self, config: Config) -> str | None:
        """The name of the first rule `config` breaks (sub-spaces' rules too, dotted by key), or None."""
        if not self.constrained:
            return None
        for name, rule in self.forbidden.items():
            if rule(config):
                return name
        for node in walk(self, config):
            if node.kind == "space" and node.domain.forbidden:
                for name, rule in node.domain.forbidden.items():
                    if rule(node.value):
                        return f"{node.path}.{name}"
        return None

    def allows(self, config: Config) -> bool:
        """Whether `config` (assumed well-formed) breaks none of the rules."""
        return self.broken_rule(config) is None

    def _draw_allowed(self, draw: Callable[[], Config], what: str) -> Config:
        """`draw()` until it returns an allowed config, at most `MAX_ATTEMPTS` times."""
        config = draw()
        if not self.constrained:
            return config
        broken: Counter[str] = Counter()
        for _ in range(MAX_ATTEMPTS):
            rule = self.broken_rule(config)
            if rule is None:
                return config
            broken[rule] += 1
            config = draw()
        raise ForbiddenConfigError(f"{what}: {MAX_ATTEMPTS} draws in a row were forbidden by the space's rules "
                                   f"(times each rule fired: {dict(broken)}); the rules must allow some configs")

    # -- sampling and checking -------------------------------------------------------------
    def sample(self, rng: np.random.Generator) -> Config:
        """A random config that breaks none of the rules."""
        return self._draw_allowed(lambda: {k: _sample(d, rng) for k, d in self.domains.items()}, "sample")

    def sample_unseen(self, rng: np.random.Generator, seen: Container[Any]) -> Config:
        """A random config whose `config_key` is not in `seen` (in a space nearly exhausted: any random config)."""
        config = self.sample(rng)
        for _ in range(MAX_ATTEMPTS):
            if config_key(config) not in seen:
                break
            config = self.sample(rng)
        return config

    def default(self) -> Config:
        """A deterministic config: `decode` of all-zero tokens (first options, the first bin's middle for numbers)."""
        return self.decode([0] * len(self.cardinalities()))

    def validate(self, config: Any, *, prefix: str = "") -> None:
        """Raise a `ValueError`/`TypeError` naming the key, the value and what is allowed, or the rule broken."""
        self._check_domains(config, prefix)
        broken = self.broken_rule(config)
        if broken is not None:
            where = f" {prefix[:-1]!r}" if prefix else ""
            raise ValueError(f"config{where} is forbidden by the rule {broken!r}: {config!r}")

    def _check_domains(self, config: Any, prefix: str) -> None:
        """Every value allowed by its domain (a branch by its `Choice`), every key known, none missing."""
        self._check_keys(config, prefix)
        for node in walk(self, config, prefix, branches="none"):
            domain, value = node.domain, node.value
            if node.kind == "space":
                domain._check_keys(value, node.path + ".")
            elif node.kind != "constant":
                domain.check(node.path, value)
            elif not same_value(domain, value):
                raise ValueError(f"{node.path!r} is fixed to {domain!r}, got {value!r}")

    def _check_keys(self, config: Any, prefix: str) -> None:
        if not isinstance(config, Mapping):
            raise TypeError(f"config{' ' + repr(prefix[:-1]) if prefix else ''} must be a dict, got {config!r}")
        unknown = {prefix + str(k): config[k] for k in config if k not in self.domains}
        missing = [prefix + k for k in self.domains if k not in config]
        if unknown or missing:
            problems = ([f"unknown keys {unknown!r}"] if unknown else []) + (
                [f"missing keys {missing!r}"] if missing else [])
            raise ValueError(f"config at {repr(prefix[:-1]) if prefix else 'top level'} has "
                             f"{' and '.join(problems)}; allowed keys: {sorted(self.domains)}")

    def accepts(self, config: Mapping[str, Any]) -> bool:
        """Whether `validate` passes: every value allowed by its domain, no rule broken."""
        try:
            self.validate(config)
        except (ValueError, TypeError):
            return False
        return True

    def fits(self, config: Mapping[str, Any]) -> bool:
        """Whether every value of `config` is allowed by its domain (the rules not consulted)."""
        try:
            self._check_domains(config, "")
        except (ValueError, TypeError):
            return False
        return True

    # -- decisions -------------------------------------------------------------------------
    def decisions(self, config: Config, prefix: str = "") -> Iterator[tuple[str, Domain, Any, Config]]:
        """The active decisions in `config`: (path, domain, value, the dict holding it)."""
        for node in walk(self, config, prefix):
            if node.decides:
                yield node.path, node.domain, node.value, node.config

    def mutate(self, config: Config, rng: np.random.Generator) -> Config:
        """A copy of `config` with exactly one decision changed (regularized evolution's mutation), allowed by
        the rules."""
        return self._draw_allowed(lambda: self._mutate(config, rng), "mutate")

    def _mutate(self, config: Config, rng: np.random.Generator) -> Config:
        child = copy_config(config)
        options = [node for node in walk(self, child) if node.decides and node.domain.changeable]
        if options:
            node = options[random_index(rng, len(options))]
            node.config[node.key] = node.domain.resample_other(node.value, rng)
        return child

    def neighbours(self, config: Config, rng: np.random.Generator) -> list[Config]:
        """The allowed configs one decision away from `config`, decision by decision (local search).

        A `Choice` gives each other option (a dict option with a fresh sample), `Int` and `Float` a step
        down and a step up (a `Float`'s a tenth of its range, on its linear or log scale); `rng` is used only to
        sample newly entered sub-spaces.
        """
        out: list[Config] = []
        for i, node in enumerate(n for n in walk(self, config) if n.decides):
            for new in node.domain.neighbours(node.value, rng):
                child = copy_config(config)
                place = next(islice((n for n in walk(self, child) if n.decides), i, None))
                place.config[place.key] = new
                if self.allows(child):
                    out.append(child)
        return out

    def perturb(self, config: Config, rng: np.random.Generator, *, resample_probability: float = 0.25) -> Config:
        """PBT's explore: each decision is resampled with `resample_probability`, else nudged.

        A conditional choice that lands on another option takes that option's fresh sample; the
        decisions of the option it left are not perturbed (they no longer exist). The result is allowed by
        the rules.
        """
        check_real("resample_probability", resample_probability, minimum=0, maximum=1)

        def draw() -> Config:
            child = copy_config(config)
            for node in walk(self, child):
                if not node.decides:
                    continue
                domain, value = node.domain, node.value
                resample = rng.random() < resample_probability
                node.config[node.key] = new = domain.sample(rng) if resample else domain.nudge(value, rng)
                if new is not value:
                    node.taken = None  # a fresh value: the walk enters none of its sub-decisions
            return child
        return self._draw_allowed(draw, "perturb")

    # -- token encoding (RL controller) ------------------------------------------------------
    def cardinalities(self) -> list[int]:
        """Token count of each position of `encode`'s fixed-length output (all branches, in order)."""
        return [node.domain.cardinality for node in walk(self, None, branches="all") if node.kind in DOMAIN_KINDS]

    def encode(self, config: Config) -> list[int]:
        """One token per position; positions of branches not taken are 0."""
        tokens: list[int] = []
        for node in walk(self, config, branches="all"):
            if node.kind in DOMAIN_KINDS:  # the walk enters the option of the token (no second look-up)
                node.taken = token = 0 if node.holder is None else node.domain.encode(node.value)
                tokens.append(token)
        return tokens

    def decode(self, tokens: list[int]) -> Config:
        """Inverse of `encode` (binned ints and floats come back as their bin's middle)."""
        expected = len(self.cardinalities())
        if len(tokens) != expected:
            raise ValueError(f"decode needs {expected} tokens for this space, got {len(tokens)}: {tokens!r}")
        left = iter(tokens)
        config: Config = {}
        for node in walk(self, config, branches="all"):  # every position takes its token, branches not taken too
            domain = node.domain
            if node.kind in DOMAIN_KINDS:
                node.taken = token = next(left)
                value = domain.decode(token)
            else:
                value = {} if node.kind == "space" else copy_config(domain)
            if node.holder is not None:
                node.holder[node.key] = value
        return config


def _sample(domain: Any, rng: np.random.Generator) -> Any:
    if isinstance(domain, (Domain, Space)):
        return domain.sample(rng)
    return copy_config(domain)
