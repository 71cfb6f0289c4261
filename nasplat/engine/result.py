"""The results store (one JSON line per trial step) and the experiment's result object."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nasplat.core import pareto
from nasplat.core.rows import RESERVED, Status, mark_retried
from nasplat.core.trees import flatten
from nasplat.storage import META_FILE, ROWS_FILE, Storage, is_uri, local_copy, read_json, read_rows
from nasplat.storage.checkpoints import Checkpoint, load_checkpoint
from nasplat.storage.locate import CheckpointLost, latest_checkpoint

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class ExperimentResult:
    """The rows of a finished (or loaded) experiment, and its best trial by `metric`. `path` is the local folder
    (the working copy, for a URI), `location` the experiment's own (the URI, for one; default: `path`): what to
    show the user, and what the rows' checkpoint locations are relative to."""

    rows: list[dict[str, Any]]
    metric: str
    mode: str = "max"  # "max" or "min"
    path: Path | None = None
    trials: dict[int, Any] = field(default_factory=dict)
    metrics: tuple[str, ...] = ()  # every objective, `metric` first (default: `metric` alone)
    modes: tuple[str, ...] = ()  # one per objective (default: `mode`)
    constraints: tuple[pareto.Constraint, ...] = ()
    location: str | None = None

    def __post_init__(self) -> None:
        self.rows = mark_retried(self.rows)  # a retry went back over them: `retried`, like the failed step's row
        if self.location is None and self.path is not None:
            self.location = str(Path(self.path).resolve())
        self.metrics = tuple(self.metrics) or ((self.metric,) if self.metric else ())
        self.modes = tuple(self.modes) or (self.mode,) * len(self.metrics)
        self.constraints = pareto.parse_constraints(self.constraints)

    @classmethod
    def load(cls, folder: str | Path) -> ExperimentResult:
        """Read an experiment folder written by `nasplat.run(storage=...)`."""
        location = None
        if is_uri(folder):
            location = str(folder).rstrip("/")
            Storage(location).download(local := local_copy(location))
            folder = local
        folder = Path(folder)
        if not (folder / ROWS_FILE).exists():
            raise FileNotFoundError(f"{folder} is not an experiment folder: no {ROWS_FILE} in it")
        meta = read_json(folder / META_FILE) if (folder / META_FILE).exists() else {}
        metrics, modes = meta.get("metric", ""), meta.get("mode", "max")  # lists for several objectives
        metrics, modes = (metrics, modes) if isinstance(metrics, list) else ([metrics] if metrics else [], [modes])
        return cls(read_rows(folder / ROWS_FILE), metrics[0] if metrics else "", modes[0], folder,
                   metrics=tuple(metrics), modes=tuple(modes),
                   constraints=pareto.parse_constraints(meta.get("constraints")), location=location)

    def pareto_front(self) -> list[dict[str, Any]]:
        """Each trial's latest successful row on the Pareto front of `metrics`, best first by `metric`: the
        non-dominated rows that satisfy every constraint, or if none does, those that break them least."""
        return [dict(r) for r in pareto.front_rows(self.rows, self.metrics, self.modes, self.constraints)]

    def hypervolume(self, reference_point: list[float]) -> float:
        """The hypervolume that the feasible trials dominate, in metric units, up to `reference_point` (one
        value per metric, worse than every front member: below it for `max`, above it for `min`)."""
        return pareto.rows_hypervolume(self.rows, self.metrics, self.modes, reference_point, self.constraints)

    def dataframe(self, *, flatten_config: bool = False) -> pd.DataFrame:
        """One row per trial step: trial id, step, status, config, metrics, parent/donor id, times, node, pid. A
        retried attempt's rows have the status `retried`: each step of a trial's final attempt has one other row.

        `flatten_config=True` replaces the `config` column by one column per decision, `config.<path>`
        (`config.depth.n`, ...); a decision absent from a row's config (a branch not taken) is missing (NaN) there.
        """
        import pandas as pd  # imported here: trial workers never pay for it

        frame = pd.DataFrame(self.rows)
        for column in RESERVED:
            if column not in frame:
                frame[column] = None
        if flatten_config:
            configs = pd.DataFrame([flatten(c, "config.") for c in frame["config"]], index=frame.index)
            at = frame.columns.get_loc("config")
            frame = pd.concat([frame.iloc[:, :at], configs, frame.iloc[:, at + 1:]], axis=1)
        return frame

    def ranked(self) -> list[dict[str, Any]]:
        """The best row of each trial by `metric`, best trial first (failed rows and missing metrics left out);
        with constraints, trials that break them come last, by total violation; ties go to the earliest trial
        (`nasplat.core.pareto.ranked_rows`, the one tie rule)."""
        return [dict(r) for r in pareto.ranked_rows(self.rows, self.metric, self.mode, self.constraints)]

    def tied_best(self) -> list[int]:
        """The trials tied with the best on `metric` (the best first; one trial when there is no tie, none when
        nothing succeeded): `best` is the earliest of them."""
        return [int(t) for t in pareto.tied_best(self.ranked(), self.metric, self.constraints)]

    @property
    def best(self) -> dict[str, Any] | None:
        """The row with the best `metric` over every trial step (constraint breakers last), or None if nothing
        succeeded."""
        ranked = self.ranked()
        return ranked[0] if ranked else None

    @property
    def checkpoint(self) -> Checkpoint | None:
        """The best trial's latest checkpoint still in storage (what `load_state()` loads), or None; raises
        `CheckpointLost` where its last step's checkpoint was not written or is gone and only an older one is left."""
        try:
            return self.find_checkpoint()
        except CheckpointLost:
            raise
        except LookupError:
            return None

    def find_checkpoint(self, trial_id: int | None = None, step: int | None = None) -> Checkpoint:
        """The latest checkpoint of trial `trial_id` (default: the best trial) at or before `step` (default: any)
        that is still in storage, complete, and looked up in this folder first (`checkpoint_locations`: a copied
        folder reads its own); raises `LookupError` naming what was looked for if there is none. Without `step`,
        where the trial's last row says its checkpoint could not be written, or names one that is gone, an older
        one is not taken silently: `CheckpointLost` names the step to ask for."""
        if trial_id is None:
            if self.best is None:
                raise LookupError("no trial reported a finite metric, so there is no best trial to load")
            trial_id = self.best["trial_id"]
        return latest_checkpoint(self.rows, self.location, trial_id, step)

    def lost_checkpoints(self) -> list[tuple[int, int, str]]:
        """(trial, step, why) of each trial whose last row's checkpoint was due and could not be written: its last
        state is not in storage."""
        last: dict[int, dict[str, Any]] = {}
        for row in self.rows:
            if row.get("status") != Status.RETRIED:
                last[row["trial_id"]] = row
        return [(t, row["step"], str(row["checkpoint_error"])) for t, row in last.items()
                if row.get("checkpoint_error")]

    def load_state(self, trial_id: int | None = None, step: int | None = None) -> Any:
        """The trainer state (`state_dict`) of trial `trial_id` (default: the best) from its latest checkpoint at
        or before `step` (default: its latest)."""
        checkpoint = self.find_checkpoint(trial_id, step)
        assert checkpoint.uri is not None  # latest_checkpoint finds only durable checkpoints: each has its uri
        return load_checkpoint(checkpoint.uri)

    def final_status(self) -> dict[int, str]:
        """Each trial's status after its latest row."""
        return {row["trial_id"]: row.get("status", Status.RUNNING) for row in self.rows}

    def counts(self) -> dict[str, int]:
        """Trials per final status."""
        out: dict[str, int] = {}
        for status in self.final_status().values():
            out[status] = out.get(status, 0) + 1
        return out
