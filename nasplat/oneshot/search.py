"""Searching over one trained supernet: its weights loaded once, every trial a path judged by them.

A path search names its supernet in its config by reference (`supernet`: the supernet experiment's folder or URI,
`supernet_trial`, `supernet_step`: `nasplat.oneshot.reference`), so that it is plain data (YAML, `experiment.json`);
for Python users `search_trainer(PathTrainer subclass, weights, config)` makes a trial class carrying
`SharedWeights` (`nasplat.oneshot.shared`) instead.

`PathTrainer`: a trial whose config is a path of the supernet's space; its one step returns `evaluate_path`'s
metrics (batch norm recalibrated on a copy: the shared tensors are never written). `ProxyTrainer`: a trial that
reports the zero-cost proxies of its path, untrained, so that any controller can search on them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
import weakref
from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from nasplat.core.checks import check_bool, check_int
from nasplat.oneshot.evaluation import evaluate_path
from nasplat.oneshot.proxies import PROXIES, score
from nasplat.oneshot.reference import (
    REFERENCE_KEYS,
    LoadedSupernet,
    SupernetReference,
    check_weights_fit,
    load_supernet,
)
from nasplat.oneshot.shared import SharedWeights, _from_ref  # noqa: F401 - _from_ref: pickles made before the move
from nasplat.oneshot.supernet import Supernet, check_same_decisions
from nasplat.oneshot.training import OneShotTrainer
from nasplat.space import Config, Space
from nasplat.trainer import WorkerContext, start

Settings = tuple[tuple[str, str], ...]  # a trial config's keys besides its path, as sorted (key, repr) pairs


# A search class's loaded supernet in this process, with the settings it was built with (the config's non-path
# keys): kept beside the class, not on it, so that pickling the class (to Ray workers) never carries a network.
_REUSED: weakref.WeakKeyDictionary[type, tuple[SharedWeights, frozenset[str], Settings, Supernet]] = \
    weakref.WeakKeyDictionary()


class PathTrainer(OneShotTrainer):
    """A trial that judges the path its config names by a trained supernet's weights; one step, `done: True`.

    The supernet: by reference in the config (`supernet`, `supernet_trial`, `supernet_step`: see
    `nasplat.oneshot.reference`), or the class's `weights` (made with `search_trainer`); its trial's config (or
    the class's `supernet_config`) goes under the trial's own, so that the network is built as it was trained.
    Subclasses give `load_data` and `build_supernet` (as for `SupernetTrainer`: the same mixin). Config: the path's
    decisions, `bn_batches` (4), `report_test` (True; False skips the test split, a search's cheaper setting).
    Reports `valid_acc`, `valid_loss`, `params`, `test_acc` / `test_loss` where the data have a test split and
    `report_test` holds (to report only), `eval_ms`, `inherited: 1.0` (the mark by which the report knows the
    accuracies for inherited ones), and the supernet it used: `supernet_config` (its settings, JSON), with
    `supernet_trial` and `supernet_step` when named by reference. `check_experiment` refuses, before the search
    runs, a space whose decisions are not the supernet's paths and weights that do not fit the supernet."""

    weights: ClassVar[SharedWeights | None] = None
    supernet_config: ClassVar[Mapping[str, Any]] = {}
    deterministic = True  # a path's score is its shared weights' (an equal config is answered from the record)
    CONFIG_KEYS = ("bn_batches", "report_test", *REFERENCE_KEYS)

    @classmethod
    def source(cls, config: Config) -> LoadedSupernet:
        """The supernet `config` names by reference, else the class's own weights; else one line saying how to
        give one."""
        reference = SupernetReference.from_config(config)
        if reference is not None:
            return load_supernet(reference)
        if cls.weights is None:
            raise ValueError(f"{cls.__name__} needs the supernet it searches: give `supernet: <its experiment "
                             f"folder>` in the config (the space), or make the class with "
                             f"search_trainer({cls.__name__}, weights)")
        return LoadedSupernet(cls.weights, dict(cls.supernet_config))

    @classmethod
    def check_experiment(cls, space: Space, *, max_steps: int) -> None:
        """Refuse a search whose space's decisions are not the supernet's paths (keys or options), or whose
        supernet's weights do not fit the network its settings build."""
        config = space.default()
        loaded = cls.source(config)
        settings = {**loaded.settings, **config}
        probe = cls()
        data = probe.load_data(settings)
        torch.manual_seed(0)
        net = probe.build_supernet(settings, data)
        paths = check_same_decisions(probe.path_space(settings, net), net)
        missing = [key for key in paths.domains if key not in space.domains]
        if missing:
            raise ValueError(f"{cls.__name__}: the search space has no decisions {missing} of the supernet "
                             f"(its paths' decisions: {list(paths.domains)}; the space's keys: {list(space.domains)})")
        for key, domain in paths.domains.items():
            given = getattr(space.domains[key], "options", [space.domains[key]])
            foreign = [option for option in given if option not in domain.options]
            if foreign:
                raise ValueError(f"{cls.__name__}: the search space's {key!r} offers {foreign}, which the supernet "
                                 f"does not have (its options: {domain.options})")
        check_weights_fit(net, loaded.weights, settings)

    def setup(self, config: Config, ctx: WorkerContext) -> None:
        self.loaded = self.source(config)
        config = {**self.loaded.settings, **config}
        self.setup_common(config, ctx)
        self.space.validate({key: config[key] for key in self.space.domains})
        self.bn_batches = check_int("bn_batches", config.get("bn_batches", 4), minimum=0)
        if not check_bool("report_test", config.get("report_test", True)):
            self.splits = ("valid",)

    def supernet_for(self, config: Config) -> Supernet:
        """The supernet on the shared weights' memory (`assign`: not a copy), built once per process and search
        class: later trials with the same settings besides their path reuse it (it is only read; a path is judged
        on an extracted copy)."""
        cached = _REUSED.get(type(self))
        if cached is not None:
            weights, decisions, settings, net = cached
            if weights is self.loaded.weights and settings == self._settings(config, decisions):
                return net
        net = super().supernet_for(config)
        check_weights_fit(net, self.loaded.weights, config)
        net.load_state_dict(self.loaded.weights.tensors(), assign=True)
        net.requires_grad_(False)
        decisions = frozenset(net.space().domains)
        _REUSED[type(self)] = (self.loaded.weights, decisions, self._settings(config, decisions), net)
        return net

    def _settings(self, config: Config, decisions: frozenset[str]) -> Settings:
        return (("device", str(self.ctx.device)),
                *sorted((key, repr(value)) for key, value in config.items() if key not in decisions))

    def step(self) -> dict[str, Any]:
        start = time.perf_counter()
        metrics: dict[str, Any] = evaluate_path(self.net, self.config, self.data, splits=self.splits,
                                                bn_batches=self.bn_batches)
        metrics["eval_ms"] = 1000 * (time.perf_counter() - start)
        metrics["inherited"], metrics["done"] = 1.0, True
        metrics["supernet_config"] = json.dumps(self.loaded.settings, sort_keys=True, default=str)
        if self.loaded.trial is not None:
            metrics["supernet_trial"], metrics["supernet_step"] = self.loaded.trial, self.loaded.step
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {}  # nothing trained: the weights are the supernet's

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class ProxyTrainer(OneShotTrainer):
    """A trial that scores its path untrained by zero-cost proxies; one step, `done: True`.

    The supernet is initialised from `init_seed` (0: the same weights in every trial, so scores compare paths, not
    draws) and scored on the first `proxy_batch` (64) training samples. Config: the path's decisions, `proxies`
    (names of `PROXIES`; default all). Reports each proxy by name (higher = predicted better; an infinite score,
    NASWOT's log det of a singular kernel, as -1e300 or 1e300: ranked last or first, not a failed trial), `params`
    and `proxy_ms`."""

    deterministic = True  # the init is fixed: a path's scores are its own (an equal config is answered from the record)
    CONFIG_KEYS = ("init_seed", "proxies", "proxy_batch")

    def setup(self, config: Config, ctx: WorkerContext) -> None:
        seed = check_int("init_seed", config.get("init_seed", 0))
        self.setup_common(config, dataclasses.replace(ctx, seed=seed))
        self.ctx = ctx
        self.names = [str(n) for n in config.get("proxies", list(PROXIES))]
        for name in self.names:
            PROXIES.lookup(name)
        n = check_int("proxy_batch", config.get("proxy_batch", 64), minimum=2)
        self.x, self.y = self.x_train[:n], self.y_train[:n]
        self.space.validate({key: config[key] for key in self.space.domains})

    def step(self) -> dict[str, Any]:
        start = time.perf_counter()
        metrics: dict[str, Any] = {name: score(name, self.net, self.x, self.y, config=self.config)
                                   for name in self.names}
        for name, value in metrics.items():
            if math.isinf(value):  # NASWOT's log det of a singular kernel: the worst score, not a missing one
                metrics[name] = math.copysign(1e300, value)
        metrics["params"] = float(sum(p.numel() for p in self.net.extract(self.config).parameters()))
        metrics["proxy_ms"] = 1000 * (time.perf_counter() - start)
        metrics["done"] = True
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class ProxyFeatures:
    """Zero-cost proxies of a path as a function `config -> [scores]`: the `features` of the predictor controller
    (`Predictor(space, features=ProxyFeatures(NB201ProxyTrainer))`). One untrained supernet of `trainer` (a
    `ProxyTrainer` subclass, built with `config` and `init_seed` 0 as its trials are) scores every path on the same
    batch, so a path's features are a function of the path; each is computed once."""

    def __init__(self, trainer: type[ProxyTrainer], config: Mapping[str, Any] | None = None,
                 proxies: list[str] | None = None) -> None:
        self.trainer, self.config = trainer, dict(config or {})
        self.names = list(proxies or PROXIES)
        self.scorer: ProxyTrainer | None = None
        self.cache: dict[str, list[float]] = {}

    def __call__(self, path: Mapping[str, Any]) -> list[float]:
        key = repr(sorted(path.items()))
        if key not in self.cache:
            if self.scorer is None:
                self.scorer = self.trainer()
                start(self.scorer, {**self.config, **path, "proxies": self.names}, WorkerContext(seed=0))
            self.scorer.config = {**self.config, **path, "proxies": self.names}
            metrics = self.scorer.step()
            self.cache[key] = [float(metrics[name]) for name in self.names]
        return self.cache[key]

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "scorer": None}  # rebuilt where it is used; the cache goes along


def search_trainer(base: type[PathTrainer], weights: SharedWeights,
                   config: Mapping[str, Any] | None = None) -> type[PathTrainer]:
    """A subclass of `base` carrying `weights` and the supernet's `config` (its `channels`, `dataset`...): the
    trainer to hand `nasplat.run` for a search over that supernet, on any executor."""
    name = f"{base.__name__}Shared"
    return type(name, (base,), {"weights": weights, "supernet_config": dict(config or {}),
                                "__module__": base.__module__, "__qualname__": name})
