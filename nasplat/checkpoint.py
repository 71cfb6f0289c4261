"""When to checkpoint trainer states and which checkpoints to keep."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class CheckpointPolicy:
    """`every`: checkpoint each trial every that many steps (None: never by count); `at_end`: when a trial ends
    (completed or stopped); `at_perturbation`: at each step where the controller may later copy the state (PBT's
    perturbation steps, `Controller.snapshot_due`); `keep_best`: besides the latest checkpoint of each running trial,
    keep the checkpoints of this many best trials by the metric and delete the rest."""

    every: int | None = None
    at_end: bool = True
    at_perturbation: bool = True
    keep_best: int = 5

    def __post_init__(self) -> None:
        if self.every is not None and (isinstance(self.every, bool) or not isinstance(self.every, int)
                                       or self.every < 1):
            raise ValueError(f"checkpoint `every` must be an integer >= 1 or None, got {self.every!r}")
        for name in ("at_end", "at_perturbation"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"checkpoint `{name}` must be true or false, got {getattr(self, name)!r}")
        if isinstance(self.keep_best, bool) or not isinstance(self.keep_best, int) or self.keep_best < 0:
            raise ValueError(f"checkpoint `keep_best` must be an integer >= 0, got {self.keep_best!r}")

    @classmethod
    def from_options(cls, options: CheckpointPolicy | Mapping[str, Any] | bool | None) -> CheckpointPolicy | None:
        """A policy from `nasplat.run(checkpoint=...)` / the YAML `checkpoint:` section: a mapping of the fields,
        True (the defaults), False or None (no checkpoints)."""
        if options is None or options is False:
            return None
        if options is True:
            return cls()
        if isinstance(options, CheckpointPolicy):
            return options
        if not isinstance(options, Mapping):
            raise ValueError(f"`checkpoint` must be a mapping with keys from {[f.name for f in fields(cls)]}, "
                             f"true or false, got {options!r}")
        allowed = [f.name for f in fields(cls)]
        unknown = [k for k in options if k not in allowed]
        if unknown:
            raise ValueError(f"checkpoint: unknown key(s) {unknown}; allowed: {allowed}")
        return cls(**options)

    def due(self, step: int, *, perturbation: bool, ending: bool) -> bool:
        """Whether the state after `step` is checkpointed."""
        return bool((self.every is not None and step % self.every == 0) or (self.at_perturbation and perturbation)
                    or (self.at_end and ending))
