"""What the user gave, as one typed value: `ExperimentSpec`, checked once before anything is imported or created.

Its fields are the keyword arguments of `nasplat.run` (but `progress`), in the order they are stored as
`experiment.json` (plain data) or `experiment.pkl` (live objects) in the experiment folder; `ExperimentSpec.
from_dict` reads that back, from folders of every earlier version too (keys added since default).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from types import FunctionType
from typing import Any

import cloudpickle

from nasplat.controllers import CONTROLLERS, Controller, RandomSearch, check_controller_options
from nasplat.controllers.base import Searcher
from nasplat.core.checks import check_real, check_run_options
from nasplat.core.pareto import parse_constraints
from nasplat.executors import DEFAULT_EXECUTOR, EXECUTORS
from nasplat.executors.base import Executor
from nasplat.integrations import CALLBACKS
from nasplat.schedulers import check_scheduler, make_scheduler
from nasplat.space import Choice, Domain, Space
from nasplat.space.data import SPACE_DATA, NotData, space_to_data
from nasplat.storage import ROWS_FILE, SPEC_JSON, SPEC_PICKLE
from nasplat.storage.checkpoints import CheckpointPolicy


@dataclass(frozen=True)
class ExperimentSpec:
    """An experiment as given: names, dotted paths and numbers (from YAML), or live Python objects (from
    `nasplat.run`). See `nasplat.run` for what each field means; `check` says whether they fit together."""

    trainer: type | str
    controller: str | type | Searcher = "random"
    space: Any = None
    metric: str | Sequence[str] | None = None
    mode: str | Sequence[str] = "max"
    constraints: Any = None
    executor: str | Executor = DEFAULT_EXECUTOR
    concurrency: int | None = None
    max_trials: int | None = None
    time_budget_s: float | None = None
    step_timeout_s: float | None = None
    max_steps: int = 1
    max_failures: int = 0
    max_failed_trials: int | None = 10
    seed: int = 0
    name: str | None = None
    storage: str | None = None
    checkpoint: CheckpointPolicy | Mapping[str, Any] | bool | None = None
    controller_options: Mapping[str, Any] = field(default_factory=dict)
    executor_options: Mapping[str, Any] = field(default_factory=dict)
    callbacks: Sequence[Any] = field(default_factory=list)
    scheduler: Any = None
    warm_start: str | None = None

    def check(self) -> ExperimentSpec:
        """This spec, after checking every plain value and plug-in name (nothing is imported or created); each
        mistake is one line naming the key, the value received and what is allowed."""
        check_run_options(metric=self.metric, mode=self.mode, max_trials=self.max_trials,
                          time_budget_s=self.time_budget_s, max_steps=self.max_steps, concurrency=self.concurrency,
                          max_failures=self.max_failures, max_failed_trials=self.max_failed_trials, seed=self.seed,
                          name=self.name, executor_options=self.executor_options)
        check_real("step_timeout_s", self.step_timeout_s, minimum=0, strict=True, optional=True)
        parse_constraints(self.constraints)
        if self.storage is not None and (not isinstance(self.storage, str) or not self.storage):
            raise ValueError(f"`storage` must be a folder path or a URI (a string), got storage={self.storage!r}")
        if CheckpointPolicy.from_options(self.checkpoint) is not None and self.storage is None:
            raise ValueError("`checkpoint` needs `storage`: checkpoints are written into the experiment's storage")
        if isinstance(self.executor, str):
            EXECUTORS.check(self.executor)
        elif not isinstance(self.executor, Executor):
            raise ValueError(f"`executor` must be one of {list(EXECUTORS)} or an Executor instance, "
                             f"got executor={self.executor!r}")
        if self.warm_start is not None and not (isinstance(self.warm_start, str)
                                                and (Path(self.warm_start) / ROWS_FILE).is_file()):
            raise ValueError(f"`warm_start` must be the folder of an earlier experiment (with its {ROWS_FILE}), got "
                             f"warm_start={self.warm_start!r}")
        self._check_controller()
        if self.scheduler is not None:
            self._check_scheduler()
        self._check_callbacks()
        return self

    def _check_controller(self) -> None:
        options = self.controller_options
        if not isinstance(options, Mapping):
            raise ValueError(f"`controller_options` must be a mapping, got controller_options={options!r}")
        controller = CONTROLLERS.lookup(self.controller) if isinstance(self.controller, str) else self.controller
        if isinstance(controller, Searcher):  # a ready controller (or scheduler)
            if options:
                raise ValueError(f"controller options {dict(options)!r} given with a ready controller instance")
        elif isinstance(controller, type) and issubclass(controller, Controller):
            check_controller_options(controller, options)

    def _check_scheduler(self) -> None:
        """A named scheduler is made once around a stand-in controller (the experiment's objectives, a space of one
        decision), so that its options' values, and its rungs against `max_steps`, are checked before anything runs;
        a ready one is checked against `max_steps`. Mistakes start with `scheduler: `."""
        try:
            if check_scheduler(self.scheduler) is None:
                self.scheduler.check_max_steps(self.max_steps)
            else:
                metric = self.metric or ""
                stand_in = RandomSearch({"x": Choice([0, 1])}, metric=metric, mode=self.mode,
                                        constraints=self.constraints)
                make_scheduler(self.scheduler, stand_in, max_steps=self.max_steps)
        except ValueError as exc:
            raise ValueError(f"scheduler: {exc}") from None

    def _check_callbacks(self) -> None:
        if isinstance(self.callbacks, (str, Mapping)) or not isinstance(self.callbacks, Sequence):
            raise ValueError(f"`callbacks` must be a list of listeners, names or mappings, got {self.callbacks!r}")
        for callback in self.callbacks:
            if isinstance(callback, (str, Mapping)):
                CALLBACKS.split(callback)  # the name; its options are checked by the listener's constructor

    def to_dict(self) -> dict[str, Any]:
        """The fields as a dict: `nasplat.run`'s keyword arguments, and what the experiment folder stores."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "experiment") -> ExperimentSpec:
        """A spec from `to_dict`'s form (an experiment folder's `experiment.json` or `.pkl`), unchecked; keys that
        earlier versions did not store take their defaults."""
        if not isinstance(data, Mapping):
            raise ValueError(f"{source}: an experiment spec must be a mapping, got {type(data).__name__}")
        known = [f.name for f in fields(cls)]
        unknown = [k for k in data if k not in known]
        if unknown or "trainer" not in data:
            raise ValueError(f"{source}: not an experiment spec: unknown key(s) {unknown} or no 'trainer'; "
                             f"allowed: {known}")
        values = dict(data)
        for key in ("controller_options", "executor_options"):
            values[key] = dict(values.get(key) or {})
        if values.get("callbacks") is None:
            values["callbacks"] = []
        return cls(**values)

    def named(self, name: str) -> ExperimentSpec:
        """This spec with `name` (the one the experiment got when the user gave none)."""
        return replace(self, name=name)

    def files(self) -> dict[str, bytes]:
        """The spec as the experiment folder stores it: `experiment.json` when it is plain data (names, dotted
        paths, numbers; classes and functions importable by name are stored by their dotted path, a space of
        plain domains as data), else `experiment.pkl`; objects that cannot be pickled are named before anything
        is written."""
        data = {key: as_data(value) for key, value in self.to_dict().items()}
        try:
            text = json.dumps(data, indent=2, allow_nan=False)
            if json.loads(text) == data:
                return {SPEC_JSON: text.encode()}
        except (TypeError, ValueError):
            pass
        try:
            return {SPEC_PICKLE: cloudpickle.dumps(self.to_dict())}
        except Exception as exc:  # noqa: BLE001 (whatever pickling raises becomes the one-line refusal below)
            raise ValueError(f"the experiment cannot be saved to `storage`: {type(exc).__name__}: {exc}; give the "
                             "trainer, space and controller by dotted path and name, or objects that pickle") from None


def as_data(value: Any) -> Any:
    """`value` as the experiment folder can store it as JSON where that keeps its meaning: a class or function
    that its module holds under its name becomes that dotted path ('package.module:Name'), a space of plain domains
    becomes `{SPACE_DATA: ...}` (`nasplat.space.data`), a checkpoint policy its fields; anything else is kept (and
    makes the experiment a pickle if it is not JSON)."""
    if isinstance(value, (type, FunctionType)):
        return dotted_name(value) or value
    if isinstance(value, CheckpointPolicy):
        return asdict(value)
    if isinstance(value, Mapping) and not isinstance(value, Space) and any(isinstance(v, Domain) for v in
                                                                            value.values()):
        value = Space(value)
    if isinstance(value, Space) and not value.forbidden:
        try:
            return {SPACE_DATA: space_to_data(value)}
        except NotData:
            return value
    return value


def dotted_name(obj: Any) -> str | None:
    """'module:qualname' when importing that gives back `obj` itself, else None (`__main__`, a local class)."""
    module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
    if not module or module == "__main__" or "<" in name or "." in name:
        return None
    found = getattr(sys.modules.get(module), name, None)
    return f"{module}:{name}" if found is obj else None
