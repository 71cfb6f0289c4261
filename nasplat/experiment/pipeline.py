"""A one-shot pipeline in one experiment file: supernet training, the search over its weights, the retrain.

```yaml
name: digits-oneshot
storage: results                      # optional: as for an experiment (--storage, $NASPLAT_RESULTS, ...)
pipeline:
  supernet: {trainer: trainers.supernet:NB201SupernetTrainer, space: {dataset: digits, channels: 8, epochs: 3},
             metric: valid_acc, controller: random, budget: {max_trials: 1, max_steps: 3}}
  search:   {trainer: trainers.supernet:NB201PathTrainer, space: search_spaces.nb201:space,
             metric: valid_acc, controller: random, budget: {max_trials: 8}}
  retrain:  {epochs: 3}               # trainer, trial, epochs, max_steps, config, seed, executor: as `nasplat retrain`
```

`supernet` and `search` are experiments (every key of an experiment file but `name` and `storage`); each stage is
its own experiment folder beside the others, `<storage>/<name>/supernet`, `.../search`, `.../retrain`, and
`<storage>/<name>/pipeline.json` records the pipeline and which stages finished. The supernet stage keeps
checkpoints (`checkpoint: {every: 1}` unless given); the search names it by reference (`supernet: <its folder>`
added to its space, so its folder is plain JSON too); the retrain gets every setting of both (`nasplat.retrain`).
Running the file again, or `nasplat resume <storage>/<name>` (`resume_pipeline`, from the recipe in
`pipeline.json`), skips the finished stages and resumes the unfinished one (`nasplat resume` of a stage's folder
works as well); a retrain that failed is started afresh.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from nasplat.core.checks import check_name
from nasplat.core.rows import Status
from nasplat.engine.result import ExperimentResult
from nasplat.experiment.file import experiment_spec, read_experiment_file
from nasplat.experiment.retrain import retrain
from nasplat.experiment.run import default_storage, resume, run_spec, storage_location
from nasplat.storage import ROWS_FILE, is_uri, read_json, read_rows, write_atomic

PIPELINE_FILE = "pipeline.json"
STAGES = ("supernet", "search", "retrain")
TOP_KEYS = ("name", "storage", "pipeline")
RETRAIN_KEYS = ("trainer", "trial", "epochs", "max_steps", "config", "seed", "executor")


def is_pipeline(spec: Mapping[str, Any]) -> bool:
    """Whether an experiment file's mapping is a pipeline (it has a `pipeline` section)."""
    return "pipeline" in spec


def check_pipeline(spec: Mapping[str, Any], source: str) -> dict[str, Any]:
    """The pipeline mapping checked before anything runs: its keys, each stage's, and the two experiments (each
    mistake one line naming the file, the stage and the key)."""
    unknown = [k for k in spec if k not in TOP_KEYS]
    if unknown:
        raise ValueError(f"{source}: unknown key(s) {unknown} beside `pipeline`; allowed: {list(TOP_KEYS)}")
    if "name" not in spec:
        raise ValueError(f"{source}: a pipeline needs a `name` (its stages' folders go under <storage>/<name>)")
    check_name(spec["name"])
    stages = spec["pipeline"]
    if not isinstance(stages, Mapping) or sorted(stages) != sorted(STAGES):
        raise ValueError(f"{source}: `pipeline` must be a mapping of the stages {list(STAGES)}, got "
                         f"{list(stages) if isinstance(stages, Mapping) else stages!r}")
    for stage in ("supernet", "search"):
        given = stages[stage]
        if not isinstance(given, Mapping) or "name" in given or "storage" in given:
            raise ValueError(f"{source}: pipeline stage {stage!r} must be an experiment mapping without `name` and "
                             f"`storage` (the pipeline's), got {given!r}")
        experiment_spec({**given, "storage": "."}, source=f"{source}: pipeline stage {stage!r}")
    again = stages["retrain"] or {}
    if not isinstance(again, Mapping) or [k for k in again if k not in RETRAIN_KEYS]:
        raise ValueError(f"{source}: pipeline stage 'retrain' must be a mapping of {list(RETRAIN_KEYS)}, got "
                         f"{again!r}")
    return {"name": spec["name"], "storage": spec.get("storage"), "pipeline": dict(stages)}


def run_pipeline(spec: Mapping[str, Any] | str | Path, *, storage: str | None = None, source: str = "pipeline",
                 progress: bool = False, announce: Callable[[str], None] | None = None) -> dict[str, ExperimentResult]:
    """Run (or go on with) the pipeline `spec` (a pipeline file, or its mapping) under `<storage>/<name>`
    (`storage`: else the spec's, else the default storage): each stage not finished yet is resumed where its folder
    holds one, else started; returns each stage's result. `announce` gets a line per stage (its folder, and
    whether it was skipped, resumed or started)."""
    if isinstance(spec, (str, Path)):
        source, spec = str(spec), read_experiment_file(spec)
    checked = check_pipeline(spec, source)
    storage = storage or checked["storage"] or default_storage()
    if is_uri(storage):
        raise ValueError(f"{source}: a pipeline's storage must be a local folder, got {storage!r}")
    home = Path(storage_location(storage, checked["name"]))
    record = _record(home, checked, source)
    stages, results = checked["pipeline"], {}
    for stage in STAGES:
        folder = home / stage
        if record["finished"].get(stage):
            _say(announce, stage, folder, "finished: skipped")
            results[stage] = ExperimentResult.load(folder)
            continue
        if _unfinished(folder):
            _say(announce, stage, folder, "resumed")
            results[stage] = resume(folder, progress=progress)
        elif stage == "retrain":
            _say(announce, stage, folder, "started")
            results[stage] = retrain(home / "search", storage=home, name="retrain", progress=progress,
                                     **dict(stages["retrain"] or {}))
        else:
            _say(announce, stage, folder, "started")
            results[stage] = run_spec(_stage_spec(stage, stages[stage], home, source), progress=progress)
        if not any(r.get("status") == Status.COMPLETED for r in results[stage].rows):
            raise ValueError(f"{source}: pipeline stage {stage!r} completed no trial ({folder}): fix it and run the "
                             "file again")
        record["finished"][stage] = True
        write_atomic(home / PIPELINE_FILE, json.dumps(record, indent=2).encode())
    return results


def pipeline_home(location: str | Path) -> Path | None:
    """The pipeline folder `location` is (one holding `pipeline.json`), else None."""
    path = Path(location)
    return path if not is_uri(str(location)) and (path / PIPELINE_FILE).is_file() else None


def resume_pipeline(home: Path, *, progress: bool = False,
                    announce: Callable[[str], None] | None = None) -> dict[str, ExperimentResult]:
    """Go on with the pipeline whose folder is `home` (`nasplat resume <storage>/<name>`), from the recipe its
    `pipeline.json` holds: finished stages skipped, the unfinished one resumed, the rest started."""
    record = read_json(home / PIPELINE_FILE)
    if not isinstance(record, dict) or not isinstance(record.get("pipeline"), Mapping):
        raise ValueError(f"{home / PIPELINE_FILE}: not a pipeline record (no `pipeline` mapping)")
    spec = {"name": home.resolve().name, "pipeline": record["pipeline"]}
    return run_pipeline(spec, storage=str(home.resolve().parent), source=str(home / PIPELINE_FILE),
                        progress=progress, announce=announce)


def _record(home: Path, checked: dict[str, Any], source: str) -> dict[str, Any]:
    """`pipeline.json`: the pipeline as first run and the finished stages; a file whose stages changed since a
    stage started is refused (its folders hold the earlier ones)."""
    path = home / PIPELINE_FILE
    started = any((home / stage).exists() for stage in STAGES)
    if path.exists() and started:
        record = read_json(path)
        if record.get("pipeline") != checked["pipeline"]:
            raise ValueError(f"{source}: the pipeline differs from the one {home} was run with ({path}); give "
                             "another `name`, or the file as it was")
        return record
    home.mkdir(parents=True, exist_ok=True)
    record = {"name": checked["name"], "pipeline": checked["pipeline"], "stages": list(STAGES), "finished": {}}
    write_atomic(path, json.dumps(record, indent=2).encode())
    return record


def _stage_spec(stage: str, given: Mapping[str, Any], home: Path, source: str) -> Any:
    """A stage's experiment: its mapping, named after the stage, stored under the pipeline's folder; the supernet
    keeps checkpoints, the search names the supernet stage's folder in its space."""
    spec = {**given, "name": stage, "storage": str(home)}
    if stage == "supernet":
        spec.setdefault("checkpoint", {"every": 1})
    else:
        space = given["space"]
        spec["space"] = [*(space if isinstance(space, list) else [space]), {"supernet": str(home / "supernet")}]
    return experiment_spec(spec, source=f"{source}: pipeline stage {stage!r}")


def _unfinished(folder: Path) -> bool:
    """Whether a stage's folder holds an experiment to resume: rows that are not all of failed trials (a failed
    retrain is started afresh: `nasplat.retrain` moves it aside)."""
    if not (folder / ROWS_FILE).exists():
        return False
    final = {row["trial_id"]: row.get("status") for row in read_rows(folder / ROWS_FILE)}
    return not final or any(status != Status.FAILED for status in final.values())


def _say(announce: Callable[[str], None] | None, stage: str, folder: Path, what: str) -> None:
    if announce is not None:
        announce(f"pipeline stage {stage}: {folder} ({what})")
