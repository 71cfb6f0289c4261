"""Searching over one trained supernet: its weights published once, every trial a path judged by them.

`SharedWeights` holds a supernet's `state_dict` as read-only numpy arrays. Where it goes with the trainer class it
stays one copy: forked workers (`processes`, and `local`) see the driver's pages (copy-on-write, nothing copied
while nobody writes), and on `ray` the first time it is pickled in a driver with Ray running it is put in the object
store once (`ray.put` of the dict of arrays) and travels as that one `ObjectRef`; a Ray worker reads zero-copy,
read-only views of the store's memory. `search_trainer(PathTrainer subclass, weights, config)` makes the trial
class that carries it.

`PathTrainer`: a trial whose config is a path of the supernet's space; its one step returns `evaluate_path`'s
metrics (batch norm recalibrated on a copy: the shared tensors are never written). `ProxyTrainer`: a trial that
reports the zero-cost proxies of its path, untrained, so that any controller can search on them.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
import warnings
import weakref
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import torch

from nasplat.core.checks import check_bool, check_int
from nasplat.oneshot.proxies import PROXIES, score
from nasplat.oneshot.supernet import Supernet
from nasplat.oneshot.training import OneShotTrainer, evaluate_path
from nasplat.space import Config
from nasplat.storage.checkpoints import load_checkpoint
from nasplat.trainer import WorkerContext, start

Settings = tuple[tuple[str, str], ...]  # a trial config's keys besides its path, as sorted (key, repr) pairs


def _array(value: Any) -> np.ndarray:
    array = np.ascontiguousarray(value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value)
    array.setflags(write=False)
    return array


class SharedWeights:
    """A supernet's weights, held once for a whole search (see the module's docstring).

    `state`: a `state_dict` (tensors or arrays), or a trainer state holding one under `"model"`. `puts` counts the
    `ray.put`s this object made (at most one); `ref` is the `ObjectRef` once it has one."""

    def __init__(self, state: Mapping[str, Any], source: str | None = None) -> None:
        if "model" in state and isinstance(state["model"], Mapping):
            state = state["model"]
        self._arrays: dict[str, np.ndarray] | None = {key: _array(value) for key, value in state.items()}
        self.ref: Any = None
        self.puts = 0
        self.source = source  # the checkpoint it was loaded from, to load again where the object is gone

    @classmethod
    def load(cls, source: Any, trial_id: int | None = None) -> SharedWeights:
        """From a supernet trial's checkpoint (a path or URI: `load_checkpoint`), or from an experiment's result
        (an `nasplat.ExperimentResult`, or anything with its `load_state(trial_id)`: the best trial by default)."""
        if isinstance(source, (str, os.PathLike)):
            return cls(load_checkpoint(os.fspath(source)), os.fspath(source))
        return cls(source.load_state(trial_id))

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        """The read-only arrays: the driver's own, or (in a Ray worker) views of the object store, fetched once."""
        if self._arrays is None:
            import ray

            try:
                self._arrays = ray.get(self.ref)
            except Exception:  # noqa: BLE001 - the Ray session that held it ended (a resumed search)
                if self.source is None:
                    raise
                self._arrays = SharedWeights.load(self.source)._arrays
        assert self._arrays is not None
        return self._arrays

    def tensors(self) -> dict[str, torch.Tensor]:
        """Tensors on the arrays' memory (`torch.from_numpy`: no copy). They must not be written."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*not writable.*")
            return {key: torch.from_numpy(array) for key, array in self.arrays.items()}

    def share(self) -> Any:
        """Put the arrays in Ray's object store (once) and return the `ObjectRef`."""
        if self.ref is None:
            import ray

            self.ref, self.puts = ray.put(self.arrays), self.puts + 1
        return self.ref

    def __reduce__(self) -> Any:
        """Pickled by reference to the object store where this process runs Ray (shipping to Ray workers), else by
        value. The object lives as long as its Ray session: weights loaded from a checkpoint (`load`) are loaded
        from it again where the object is gone (a search resumed in another session); others must be given again."""
        if self.ref is None:
            ray = sys.modules.get("ray")  # Ray runs only where it was imported: no import here
            if ray is None or not ray.is_initialized():
                return (SharedWeights, (self.arrays, self.source))
            self.share()
        return (_from_ref, (self.ref, self.source))


def _from_ref(ref: Any, source: str | None = None) -> SharedWeights:
    """A worker's handle on the object `ref`: its arrays are fetched (zero-copy) when first used."""
    weights = SharedWeights.__new__(SharedWeights)
    weights._arrays, weights.ref, weights.puts, weights.source = None, ref, 0, source
    return weights


# A search class's loaded supernet in this process, with the settings it was built with (the config's non-path
# keys): kept beside the class, not on it, so that pickling the class (to Ray workers) never carries a network.
_REUSED: weakref.WeakKeyDictionary[type, tuple[SharedWeights, frozenset[str], Settings, Supernet]] = \
    weakref.WeakKeyDictionary()


class PathTrainer(OneShotTrainer):
    """A trial that judges the path its config names by the shared supernet's weights; one step, `done: True`.

    Made with `search_trainer` (which gives `weights` and the supernet's `supernet_config`, the keys it was built
    and trained with, under the trial's own); subclasses give `load_data` and `build_supernet` (as for
    `SupernetTrainer`: the same mixin). Config: the path's decisions, `bn_batches` (4), `report_test` (True;
    False skips the test split, a search's cheaper setting). Reports `valid_acc`, `valid_loss`, `params`,
    `test_acc` / `test_loss` where the data have a test split and `report_test` holds (to report only), `eval_ms`,
    and `inherited: 1.0` (the mark by which the report knows the accuracies for inherited ones)."""

    weights: ClassVar[SharedWeights | None] = None
    supernet_config: ClassVar[Mapping[str, Any]] = {}
    deterministic = True  # a path's score is its shared weights' (an equal config is answered from the record)

    def setup(self, config: Config, ctx: WorkerContext) -> None:
        config = {**self.supernet_config, **config}
        if self.weights is None:
            raise TypeError(f"{type(self).__name__} has no shared weights: make the class with "
                            f"search_trainer({type(self).__name__}, weights)")
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
            if weights is self.weights and settings == self._settings(config, decisions):
                return net
        net = super().supernet_for(config)
        net.load_state_dict(self.weights.tensors(), assign=True)
        net.requires_grad_(False)
        decisions = frozenset(net.space().domains)
        _REUSED[type(self)] = (self.weights, decisions, self._settings(config, decisions), net)
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
                self.scorer = start(self.trainer(), {**self.config, **path, "proxies": self.names},
                                    WorkerContext(seed=0))
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
