"""Retraining the architecture a search chose: standalone, from scratch, as an experiment of its own.

The chosen architecture is the best trial's config by the experiment's metric (a search over a supernet's paths,
or any search), or, where the rows report a derived architecture (`arch`, as DARTS and GDAS do), the trial's last
derived one. It is trained by the standalone trainer the search's trainer names in `RETRAIN_TRAINER` (a dotted
path; `trainers.supernet`'s trainers name `trainers.nb201_cell:NB201CellTrainer`), or by `trainer=`, for as many
steps as it runs (its `done`), checkpointed at its end: `nasplat export <folder>-retrain --format pt` takes it home.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nasplat.core.checks import check_int
from nasplat.engine.result import ExperimentResult
from nasplat.experiment.run import run
from nasplat.storage import read_spec
from nasplat.trainer import Trainer, resolve

MAX_STEPS = 10_000  # the retrain ends when its trainer reports `done` (its own `epochs`)


def chosen_architecture(result: ExperimentResult, trial: int | None = None) -> tuple[int, dict[str, Any]]:
    """(trial id, config) of the architecture to retrain: trial `trial`'s, else the best trial's; a derived
    architecture (`arch`, JSON) of the trial's last row in place of its config where there is one."""
    if trial is None:
        best = result.best
        if best is None:
            raise ValueError(f"{result.location}: no trial reported {result.metric!r}: nothing to retrain")
        trial = int(best["trial_id"])
    rows = [r for r in result.rows if r["trial_id"] == trial]
    if not rows:
        known = sorted({r["trial_id"] for r in result.rows})
        raise ValueError(f"`trial` must be a trial of {result.location}, got trial={trial!r} (trials: {known})")
    last = rows[-1]
    arch = last.get("arch")
    config = json.loads(arch) if isinstance(arch, str) else arch if isinstance(arch, dict) else last["config"]
    return trial, dict(config)


def retrain_trainer(folder: Path, trainer: Any = None) -> Any:
    """The standalone trainer: `trainer` (a class or dotted path), else the search trainer's `RETRAIN_TRAINER`."""
    if trainer is None:
        searched = resolve(read_spec(folder).get("trainer"), what="the experiment's trainer")
        trainer = searched.RETRAIN_TRAINER if isinstance(searched, type) and issubclass(searched, Trainer) else None
        if trainer is None:
            raise ValueError(f"{folder}: its trainer {getattr(searched, '__name__', searched)!r} names no standalone "
                             "trainer (RETRAIN_TRAINER): give one with --trainer module:Class")
    return resolve(trainer, what="`trainer`")


def retrain(folder: str | Path, *, trainer: Any = None, trial: int | None = None, epochs: int | None = None,
            storage: str | Path | None = None, name: str | None = None, seed: int = 0, executor: str = "local",
            progress: bool = False) -> ExperimentResult:
    """Train the architecture chosen in the experiment `folder` standalone from scratch (see the module's
    docstring); `epochs` sets its config's `epochs`. The new experiment is `<storage>/<name>`, by default beside
    `folder` as `<its name>-retrain`; it reports the trainer's metrics (its test accuracy only to report)."""
    result = ExperimentResult.load(folder)
    home = Path(result.path or folder)
    trial_id, config = chosen_architecture(result, trial)
    if epochs is not None:
        config["epochs"] = check_int("epochs", epochs, minimum=1)
    return run(trainer=retrain_trainer(home, trainer), space=config, metric=result.metric or "valid_acc",
               mode=result.mode, max_trials=1, max_steps=MAX_STEPS, seed=seed, executor=executor,
               storage=storage if storage is not None else home.parent, name=name or f"{home.name}-retrain",
               checkpoint={"at_end": True}, progress=progress)
