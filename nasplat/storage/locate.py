"""Which checkpoint of a trial the rows name, and where it lies: rows record a checkpoint relative to the
experiment folder (`checkpoints/trial-3/step-4`), and a reader resolves it against the folder it reads
(`checkpoint_locations`), so a folder copied or moved elsewhere reads its own; `latest_checkpoint` never takes an
older state than the one asked for without being asked (`CheckpointLost`)."""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from typing import Any

from nasplat.storage.checkpoints import Checkpoint, is_complete
from nasplat.storage.files import CHECKPOINTS, is_uri


class CheckpointLost(LookupError):
    """The checkpoint asked for (a trial's latest by default) was due and not written, or is gone, while an older
    one of the trial is there: that one is not used unless asked for by its step."""


def latest_checkpoint(rows: Iterable[Mapping[str, Any]], home: str | None, trial_id: Any,
                      step: int | None = None) -> Checkpoint:
    """The latest checkpoint of trial `trial_id` at or before `step` (default: any) that `rows` name (a retried
    attempt's rows left out) and that is still in storage and complete, looked up under `home` (the experiment's
    location) first: `checkpoint_locations`. Without `step`, a trial whose last row's checkpoint was due and is not
    there raises `CheckpointLost` (an older state is never taken unasked); none at all raises `LookupError`."""
    live = [row for row in rows if row.get("trial_id") == trial_id and row.get("status") != "retried"]
    recorded = sorted({(row["step"], row["checkpoint"]) for row in live
                       if row.get("checkpoint") and (step is None or row["step"] <= step)}, reverse=True)
    durable = next((Checkpoint(trial_id, found_step, location) for found_step, uri in recorded
                    for location in checkpoint_locations(home, uri) if is_complete(location)), None)
    last = live[-1] if live else {}
    if step is None and durable is not None and durable.step != last.get("step") and (
            last.get("checkpoint") or last.get("checkpoint_error")):
        why = (f"was not written ({last['checkpoint_error']})" if last.get("checkpoint_error")
               else "is missing or incomplete in storage")
        older = durable.step
        raise CheckpointLost(f"trial {trial_id}'s checkpoint at its last step {last.get('step')} {why}; the newest "
                             f"one left is at step {older}: ask for it with step={older} (nasplat export --step "
                             f"{older}) if an older state will do")
    if durable is not None:
        return durable
    where = f"at or before step {step}" if step is not None else "at any step"
    raise LookupError(f"trial {trial_id} has no checkpoint {where} in storage (rows name "
                      f"{len(recorded)}; the rest were never written or deleted by `keep_best`); run with "
                      "`checkpoint:` set to keep trained states")


def relative_location(home: str, uri: str) -> str:
    """`uri` as a row records it: relative to the experiment folder `home` where it lies inside
    (`checkpoints/trial-3/step-4`), else as it is."""
    return uri.removeprefix(home.rstrip("/") + "/")


def checkpoint_locations(home: str | None, recorded: str) -> list[str]:
    """Where the checkpoint a row records as `recorded` may lie, in the order to try, for the experiment folder
    `home` being read (a path or URI; None: as recorded). A relative location lies inside `home`. An absolute path
    or URI (rows before locations were relative) is tried first beside `home` (its part from `checkpoints/` on: the
    folder was copied, moved or downloaded), then as recorded."""
    if home is None:
        return [recorded]
    base = home.rstrip("/")
    if not (is_uri(recorded) or posixpath.isabs(recorded)):
        return [f"{base}/{recorded}"]
    at = recorded.rfind(f"/{CHECKPOINTS}/")
    beside = [f"{base}/{recorded[at + 1:]}"] if at >= 0 else []
    return list(dict.fromkeys([*beside, recorded]))


def locate_checkpoint(home: str | None, recorded: str) -> str | None:
    """The first of `checkpoint_locations` that holds a complete checkpoint, or None."""
    return next((uri for uri in checkpoint_locations(home, recorded) if is_complete(uri)), None)
