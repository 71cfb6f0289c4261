"""Retraining the architecture a search chose: standalone, from scratch, as an experiment of its own.

The chosen architecture is the best trial's config by the experiment's metric (ties go to the earliest trial, said
on stderr), or, where the rows report a derived architecture (`arch`, as DARTS and GDAS do), the trial's last derived
one. Its config carries every setting of the stages before it: the search trial's config and, for a search over a
supernet, the supernet's (`supernet_config` in its rows), the keys the search trainer names in `SETTINGS` where it
names them (the network and its data: `dataset`, `channels`, ...). It is trained by the standalone trainer the
search's trainer names in `RETRAIN_TRAINER` (`trainers.supernet`'s name `trainers.nb201_cell:NB201CellTrainer`), or
by `trainer=`, for `epochs` steps (given, in the config, or the trainer's `DEFAULT_EPOCHS`), checkpointed at its end:
`nasplat export <folder>-retrain --format pt` takes it home.

Before anything is created: a folder that trained a supernet and chose no architecture is refused, and for a search
over a supernet the network the standalone trainer builds must have the parameter count of the searched path (the
search trainer's supernet, built with the same settings, `extract`ed); a retrain that failed before is moved aside
(`<name>.failed-<n>`) so that it never blocks the next try.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nasplat.core.checks import check_int
from nasplat.core.rows import Status
from nasplat.engine.result import ExperimentResult
from nasplat.experiment.run import run, storage_location
from nasplat.storage import ROWS_FILE, is_uri, read_rows, read_spec
from nasplat.trainer import Trainer, WorkerContext, resolve, start


def chosen_architecture(result: ExperimentResult, trial: int | None = None) -> tuple[int, dict[str, Any]]:
    """(trial id, config) of the architecture to retrain: trial `trial`'s, else the best trial's; a derived
    architecture (`arch`, JSON) of the trial's last row in place of its config where there is one."""
    trial_id, row = _chosen_row(result, trial)
    arch = _arch(row, result)
    return trial_id, dict(arch if arch is not None else row["config"])


def _chosen_row(result: ExperimentResult, trial: int | None) -> tuple[int, dict[str, Any]]:
    """The chosen trial's id and last row; a tie for the best is said on stderr (the earliest trial wins)."""
    if trial is None:
        best = result.best
        if best is None:
            raise ValueError(f"{result.location}: no trial reported {result.metric!r}: nothing to retrain")
        trial = int(best["trial_id"])
        tied = result.tied_best()
        if len(tied) > 1:
            print(f"nasplat retrain: trials {tied} tie for the best {result.metric}={best[result.metric]}; the "
                  f"earliest, trial {trial}, is retrained (ties go to the earliest trial)", file=sys.stderr)
    rows = [r for r in result.rows if r["trial_id"] == trial]
    if not rows:
        known = sorted({r["trial_id"] for r in result.rows})
        raise ValueError(f"`trial` must be a trial of {result.location}, got trial={trial!r} (trials: {known})")
    return trial, rows[-1]


def _arch(row: Mapping[str, Any], result: ExperimentResult) -> dict[str, Any] | None:
    """The derived architecture a row reports (`arch`: a JSON object, or a mapping), or None."""
    arch = row.get("arch")
    if arch is None:
        return None
    try:
        value = json.loads(arch) if isinstance(arch, str) else arch
    except ValueError as exc:
        value, arch = None, f"{arch[:60]!r} ({exc})"
    if not isinstance(value, dict):
        raise ValueError(f"{result.location}: trial {row['trial_id']}'s `arch` must be a JSON object of the "
                         f"architecture's decisions, got {arch if isinstance(arch, str) else repr(arch)[:60]}")
    return value


def retrain_trainer(folder: Path, trainer: Any = None, *, allow_pickle: bool = False) -> Any:
    """The standalone trainer: `trainer` (a class or dotted path), else the search trainer's `RETRAIN_TRAINER`."""
    return resolve(_standalone(folder, trainer, allow_pickle), what="`trainer`")


def _standalone(folder: Path, trainer: Any, allow_pickle: bool) -> Any:
    """The standalone trainer as given (a dotted path stays one, so that the retrain's folder is plain JSON)."""
    if trainer is None:
        searched = _searched(folder, allow_pickle)
        trainer = searched.RETRAIN_TRAINER if isinstance(searched, type) and issubclass(searched, Trainer) else None
        if trainer is None:
            raise ValueError(f"{folder}: its trainer {getattr(searched, '__name__', searched)!r} names no standalone "
                             "trainer (RETRAIN_TRAINER): give one with --trainer module:Class")
    return trainer


def _searched(folder: Path, allow_pickle: bool) -> Any:
    return resolve(read_spec(folder, allow_pickle=allow_pickle).get("trainer"), what="the experiment's trainer")


def retrain_config(searched: Any, row: Mapping[str, Any], arch: Mapping[str, Any] | None) -> dict[str, Any]:
    """The retrain's config from the chosen row: the settings of the stages before it (the supernet's under the
    search trial's, only the search trainer's `SETTINGS` where it declares them), then the chosen decisions."""
    from nasplat.oneshot.reference import REFERENCE_KEYS  # here: nasplat.oneshot imports torch, `nasplat` must not

    supernet = row.get("supernet_config")
    settings = {**(json.loads(supernet) if isinstance(supernet, str) else {}), **row["config"]}
    declared = getattr(searched, "SETTINGS", None)
    if arch is not None:
        kept = {k: v for k, v in settings.items() if (k in declared if declared else k not in REFERENCE_KEYS)}
        return {**kept, **arch}
    kept = {k: v for k, v in settings.items() if declared and k in declared}
    return {**kept, **{k: v for k, v in row["config"].items() if k not in REFERENCE_KEYS}}


def check_searched_path(searched: Any, row: Mapping[str, Any], arch: Mapping[str, Any] | None,
                        trainer: Any, config: Mapping[str, Any], seed: int) -> int | None:
    """For a search over a supernet (a search trainer with `build_supernet`): the parameter count of the searched
    path (the supernet built with the search's settings, `extract`ed), refused in one line unless the network
    `trainer` builds from `config` has the same; None for other searches."""
    if not hasattr(searched, "build_supernet"):
        return None
    import torch

    supernet = row.get("supernet_config")
    settings = {**(json.loads(supernet) if isinstance(supernet, str) else {}), **row["config"], **(arch or {})}
    probe = searched()
    torch.manual_seed(0)
    subnet = probe.build_supernet(settings, probe.load_data(settings)).extract(settings)
    searched_count = sum(p.numel() for p in subnet.parameters())
    built = start(trainer(), dict(config), WorkerContext(seed=seed))
    net = getattr(built, "net", None)
    if not isinstance(net, torch.nn.Module):
        raise ValueError(f"{trainer.__name__} keeps no network in `net` (a torch module): the retrain cannot check "
                         "that it builds the searched path")
    count = sum(p.numel() for p in net.parameters())
    if count != searched_count:
        raise ValueError(f"{trainer.__name__} built a network of {count:,} parameters from {dict(config)}, but the "
                         f"searched path has {searched_count:,}: the retrain would not train the searched network")
    return count


def retrain(folder: str | Path, *, trainer: Any = None, trial: int | None = None, epochs: int | None = None,
            max_steps: int | None = None, config: Mapping[str, Any] | None = None, storage: str | Path | None = None,
            name: str | None = None, seed: int = 0, executor: str = "local", progress: bool = False,
            allow_pickle: bool = False) -> ExperimentResult:
    """Train the architecture chosen in the experiment `folder` standalone from scratch (see the module's
    docstring); `config` adds or replaces settings, `epochs` sets its `epochs`; the run is bounded by `max_steps`
    (default: the epochs). The new experiment is `<storage>/<name>`, by default beside `folder` as
    `<its name>-retrain`; it reports the trainer's metrics (its test accuracy only to report). A folder whose
    experiment is a pickle is refused unless `allow_pickle` (loading it runs code)."""
    result = ExperimentResult.load(folder)
    home = Path(result.path or folder)
    searched = _searched(home, allow_pickle)
    _, row = _chosen_row(result, trial)
    arch = _arch(row, result)
    if getattr(searched, "TRAINS_SUPERNET", False) and arch is None:
        raise ValueError(f"{result.location} trained a supernet ({searched.__name__}), it chose no architecture: "
                         "search its paths first (a path trainer with `supernet: <this folder>`) and retrain that")
    given = _standalone(home, trainer, allow_pickle)
    standalone = resolve(given, what="`trainer`")
    settings = {**retrain_config(searched, row, arch), **dict(config or {})}
    if epochs is not None:
        settings["epochs"] = check_int("epochs", epochs, minimum=1)
    steps = _max_steps(standalone, settings, max_steps)
    check_searched_path(searched, row, arch, standalone, settings, seed)
    storage = storage if storage is not None else home.parent
    name = name or f"{home.name}-retrain"
    _move_failed(storage_location(str(storage), name))
    return run(trainer=given, space=settings, metric=result.metric or "valid_acc", mode=result.mode,
               max_trials=1, max_steps=steps, seed=seed, executor=executor, storage=storage, name=name,
               checkpoint={"at_end": True}, progress=progress)


def _max_steps(trainer: Any, config: Mapping[str, Any], given: int | None) -> int:
    """The retrain's `max_steps`: given, else its `epochs` (the config's, else the trainer's `DEFAULT_EPOCHS`)."""
    if given is not None:
        return check_int("max_steps", given, minimum=1)
    epochs = config.get("epochs", getattr(trainer, "DEFAULT_EPOCHS", None))
    if epochs is None:
        raise ValueError(f"cannot tell how many steps the retrain runs: {trainer.__name__} declares no "
                         "DEFAULT_EPOCHS and no epochs were given; give --epochs or --max-steps")
    return check_int("epochs", epochs, minimum=1)


def _move_failed(location: str) -> None:
    """A local folder at `location` whose retrain failed (trials that failed, none that succeeded) is moved aside
    to `<location>.failed-<n>`, said on stderr, so that a retry starts afresh."""
    path = Path(location)
    if is_uri(location) or not (path / ROWS_FILE).exists():
        return
    final = {r["trial_id"]: r.get("status") for r in read_rows(path / ROWS_FILE)}
    if not final or any(status != Status.FAILED for status in final.values()):
        return
    n = 1
    while path.with_name(f"{path.name}.failed-{n}").exists():
        n += 1
    aside = path.with_name(f"{path.name}.failed-{n}")
    shutil.move(str(path), str(aside))
    print(f"nasplat retrain: the earlier retrain in {path} failed; moved to {aside}", file=sys.stderr)
