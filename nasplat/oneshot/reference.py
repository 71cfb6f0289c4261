"""A trained supernet named by reference in a trial's config: its experiment's folder or URI, trial and step.

A path search names the supernet it judges paths by with plain data: `supernet` (the supernet experiment's folder or
URI), `supernet_trial` (default: its best trial, ties to the earliest: `nasplat.core.pareto.ranked_rows`) and
`supernet_step` (default: that trial's newest durable checkpoint). `load_supernet` reads the rows, the trial's
config (the settings the supernet was built and trained with: data set, channels, ...) and the checkpoint's
weights, once per process: later trials and a forked worker reuse them. Nothing in the search's own folder is code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from nasplat.core.checks import check_int
from nasplat.core.pareto import parse_constraints, ranked_rows
from nasplat.oneshot.shared import SharedWeights
from nasplat.storage import META_FILE, ROWS_FILE, Storage, is_uri, local_copy, read_json, read_rows
from nasplat.storage.checkpoints import load_checkpoint
from nasplat.storage.locate import latest_checkpoint

REFERENCE_KEYS = ("supernet", "supernet_trial", "supernet_step")


@dataclass(frozen=True)
class SupernetReference:
    """Which supernet: `location` (an experiment folder or URI), `trial` (None: the best), `step` (None: the trial's
    newest durable checkpoint)."""

    location: str
    trial: int | None = None
    step: int | None = None

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> SupernetReference | None:
        """The reference a trial's config holds (`supernet`, `supernet_trial`, `supernet_step`), or None without
        `supernet`; a malformed one is one line naming the key."""
        location = config.get("supernet")
        if location is None:
            return None
        if not isinstance(location, str) or not location:
            raise ValueError(f"`supernet` must be the supernet experiment's folder or URI (a string), got "
                             f"supernet={location!r}")
        return cls(location, check_int("supernet_trial", config.get("supernet_trial"), minimum=0, optional=True),
                   check_int("supernet_step", config.get("supernet_step"), minimum=1, optional=True))


@dataclass
class LoadedSupernet:
    """A supernet's weights with where they came from: the settings its trial was configured with (`settings`),
    and, when loaded by reference, the experiment, trial and step."""

    weights: SharedWeights
    settings: dict[str, Any] = field(default_factory=dict)
    location: str | None = None
    trial: int | None = None
    step: int | None = None


_LOADED: dict[SupernetReference, LoadedSupernet] = {}  # this process's supernets, by reference


def load_supernet(reference: SupernetReference) -> LoadedSupernet:
    """The weights and settings `reference` names, read once per process (a ValueError of one line where the
    folder, the trial or a durable checkpoint is not there)."""
    if reference not in _LOADED:
        _LOADED[reference] = _load(reference)
    return _LOADED[reference]


def _load(reference: SupernetReference) -> LoadedSupernet:
    where = f"`supernet`: {reference.location}"
    if is_uri(reference.location):
        path = local_copy(reference.location)
        Storage(reference.location).download(path)
        home = reference.location.rstrip("/")
    else:
        path = Path(reference.location).expanduser().resolve()
        home = str(path)
    if not (path / ROWS_FILE).exists():
        raise ValueError(f"{where} is not an experiment folder (no {ROWS_FILE} in it)")
    meta = read_json(path / META_FILE) if (path / META_FILE).exists() else {}
    metric, mode = meta.get("metric", ""), meta.get("mode", "max")
    metric, mode = (metric[0], mode[0]) if isinstance(metric, list) else (metric, mode)
    rows = read_rows(path / ROWS_FILE)
    trial = reference.trial
    if trial is None:
        ranked = ranked_rows(rows, metric, mode, parse_constraints(meta.get("constraints")))
        if not ranked:
            raise ValueError(f"{where}: no trial reported {metric!r}, so there is no best supernet to search")
        trial = int(ranked[0]["trial_id"])
    configs = [row["config"] for row in rows if row.get("trial_id") == trial and isinstance(row.get("config"), dict)]
    if not configs:
        known = sorted({row["trial_id"] for row in rows})
        raise ValueError(f"{where}: `supernet_trial` must be one of its trials {known}, got {trial}")
    try:
        checkpoint = latest_checkpoint(rows, home, trial, reference.step)
    except LookupError as exc:
        raise ValueError(f"{where}: {exc}") from None
    assert checkpoint.uri is not None  # latest_checkpoint finds only durable checkpoints: each has its uri
    weights = SharedWeights(load_checkpoint(checkpoint.uri), checkpoint.uri)
    return LoadedSupernet(weights, dict(configs[-1]), reference.location, trial, checkpoint.step)


def check_weights_fit(net: nn.Module, weights: SharedWeights, settings: Mapping[str, Any]) -> None:
    """A ValueError of one line unless `weights` has exactly `net`'s tensors, with their shapes: the supernet
    built with `settings` is the one the weights were trained as."""
    own = {key: tuple(value.shape) or (1,) for key, value in net.state_dict().items()}  # scalars: held as (1,)
    theirs = {key: tuple(array.shape) or (1,) for key, array in weights.arrays.items()}
    if own == theirs:
        return
    missing, extra = sorted(set(own) - set(theirs)), sorted(set(theirs) - set(own))
    shapes = [f"{k}: {theirs[k]} against {own[k]}" for k in own if k in theirs and own[k] != theirs[k]]
    detail = (f"{len(shapes)} shapes differ (first {shapes[0]})" if shapes else
              f"tensors missing from the weights {missing[:3]}, extra ones {extra[:3]}")
    given = {k: v for k, v in sorted(settings.items()) if not isinstance(v, (dict, list))}
    raise ValueError(f"the supernet weights {weights.source or ''} do not fit the supernet built with {given}: "
                     f"{detail}")
