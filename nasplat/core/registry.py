"""The one shape of every kind of plug-in (controllers, schedulers, executors, callbacks, backends): a name maps to
a class, given directly or as `"module:attribute"` imported when first used (so that a plug-in whose package is
heavy or optional costs nothing until it is named). YAML, `nasplat.run` and the command line's help read the same
registry."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterator, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def constructor_options(cls: type, *, base: type = object, skip: tuple[str, ...] = ()) -> list[str] | None:
    """The option names `cls` takes, from its constructor's signature and those of the classes its `**kwargs`
    reach, up to `base`; None when the chain ends in a `**kwargs` that accepts anything. Names in `skip` (set
    by the caller itself, never as options) are left out."""
    names: list[str] = []
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        parameters = list(inspect.signature(init).parameters.values())[1:]  # without self
        names += [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                  and p.name not in names]
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            return [name for name in names if name not in skip]
        if klass is base:
            break
    return None


class Registry(Mapping[str, T], Generic[T]):
    """Names of one `kind` of plug-in, in the order listed; `registry[name]` is the plug-in (imported on first use)."""

    def __init__(self, kind: str, entries: Mapping[str, T | str]) -> None:
        self.kind = kind
        self._entries: dict[str, T | str] = dict(entries)

    def __getitem__(self, name: str) -> T:
        entry = self._entries[name]
        if isinstance(entry, str):
            module, _, attribute = entry.partition(":")
            entry = self._entries[name] = getattr(importlib.import_module(module), attribute)
        return entry

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries  # without importing anything

    def check(self, name: Any) -> str:
        """`name`, if a plug-in is registered under it (nothing is imported); anything else is one line naming the
        kind, the value and the names allowed."""
        if not isinstance(name, str) or name not in self._entries:
            raise ValueError(f"unknown {self.kind} {name!r}; allowed: {list(self._entries)}")
        return name

    def lookup(self, name: Any) -> T:
        """The plug-in called `name` (see `check`)."""
        return self[self.check(name)]

    def name_of(self, plugin: Any) -> str | None:
        """The name `plugin` (a class or an instance of one) is registered under, without importing the others."""
        cls = plugin if isinstance(plugin, type) else type(plugin)
        for name, entry in self._entries.items():
            if entry is cls or (isinstance(entry, str) and entry == f"{cls.__module__}:{cls.__qualname__}"):
                return name
        return None

    def split(self, spec: Any) -> tuple[str, dict[str, Any]]:
        """A YAML-style spec, a name or a mapping of `name` and options, as (name, options); the name is checked."""
        options = dict(spec) if isinstance(spec, Mapping) else {"name": spec}
        name = options.pop("name", None)
        if name not in self._entries:
            raise ValueError(f"unknown {self.kind} {name!r} in {spec!r}; allowed: {list(self._entries)} (a name, or a "
                             "mapping with 'name' and options)")
        return name, options

    def help(self) -> str:
        """The names, comma-separated, for a command line's help."""
        return ", ".join(self._entries)
