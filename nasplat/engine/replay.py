"""Resuming an experiment: rebuild the engine and its controller by replaying the recorded rows and journal.

Controllers are deterministic given their seed and the sequence of calls, so handing a fresh controller the same
`ask`s and results in the same order puts it back exactly where the killed driver left it, with nothing pickled.
A trial that was running continues from its latest durable checkpoint: its rows after that step are dropped (they
will be recorded again), and with no checkpoint it starts over. A checkpoint its rows name that is missing or
incomplete in the folder being resumed (deleted, cut short, or left behind by a copy) does not count: the trial
goes back to its previous complete one, or starts over, and a line says so. Replay only reads the rows and journal
and calls the engine's own methods (`nasplat.engine.state.EngineState`): the engine's invariants live there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nasplat.controllers.base import Exploit, Result
from nasplat.core.rows import RESERVED, Status
from nasplat.engine.console import say
from nasplat.engine.loop import Engine
from nasplat.storage.checkpoints import Checkpoint


def resume_engine(engine: Engine, rows: list[dict[str, Any]], journal: list[dict[str, Any]]) -> str:
    """Replay `rows` and `journal` (as read from the folder) into a fresh `engine`; rewrite the folder if rows were
    dropped. Returns one line saying what was kept."""
    rows, journal, dropped, found = _cut_running(rows, journal, engine.locate)
    for trial_id, (checkpoint, missing) in sorted(found.items()):
        if missing:
            then = f"goes back to its checkpoint at step {checkpoint.step}" if checkpoint else "starts over"
            earlier = f" (and {len(missing) - 1} earlier ones)" if len(missing) > 1 else ""
            say(engine.name, f"resume: trial {trial_id}'s checkpoint {missing[-1]} is missing or incomplete{earlier}: "
                f"it {then}")
    mismatches = _replay(engine, rows, journal)
    engine.recount_best()  # without the rows a retry went back over
    engine.rewind_running({trial_id: checkpoint for trial_id, (checkpoint, _) in found.items()})
    engine.reopen_logs(rows, journal, rewrite=bool(dropped))
    ends = [row.get("end") or 0.0 for row in rows] + [entry.get("time") or 0.0 for entry in journal]
    engine.restore_clock(max(ends, default=0.0))
    running = engine.running()
    where = ", ".join(f"trial {r.trial_id} from step {r.step}" if r.step else f"trial {r.trial_id} from the start"
                      for r in running[:8]) + (" ..." if len(running) > 8 else "")
    line = (f"resumed: kept {len(rows)} rows of {len(engine.trials)} trials, dropped {dropped} rows recorded after "
            f"the last checkpoint of a running trial; {len(running)} running trials continue"
            + (f" ({where})" if running else ""))
    if mismatches:
        line += (f"; warning: the controller decided differently from the record at {mismatches} rows (is it "
                 "deterministic given its seed?), the record was kept")
    return line


Found = dict[int, tuple[Checkpoint | None, list[str]]]  # trial -> (its checkpoint to go on from, those missing)


def _cut_running(rows: list[dict[str, Any]], journal: list[dict[str, Any]], locate: Callable[[str], str | None]
                 ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int, Found]:
    """Drop the rows a running trial recorded after its latest checkpointed row whose checkpoint `locate` finds
    complete (failed attempts' rows stay). Returns the rows and journal kept, how many rows went, and for each
    running trial with checkpoints the one it goes on from (None: it starts over) and the missing ones after it."""
    last: dict[int, dict[str, Any]] = {}
    checkpointed: dict[int, list[int]] = {}  # trial -> indices of its rows with a checkpoint
    for index, row in enumerate(rows):
        last[row["trial_id"]] = row
        if row.get("checkpoint"):
            checkpointed.setdefault(row["trial_id"], []).append(index)
    last_index = {row["trial_id"]: index for index, row in enumerate(rows)}
    resumed_late = {entry["resume"] for entry in journal if "resume" in entry
                    and int(entry.get("rows") or 0) > last_index.get(entry["resume"], -1)}
    asked = [entry["ask"] for entry in journal if "ask" in entry]
    running = {t for t in asked if t not in last or last[t].get("status") in (Status.RUNNING, Status.RETRIED)
               or (last[t].get("status") == Status.PAUSED and t in resumed_late)}
    cut: dict[int, int] = {}  # running trial -> index of its last row with a complete checkpoint
    found: Found = {}
    for trial_id in sorted(running & set(checkpointed)):
        missing: list[str] = []
        found[trial_id] = (None, missing)
        for index in reversed(checkpointed[trial_id]):
            row = rows[index]
            uri = locate(row["checkpoint"])
            if uri is not None:
                cut[trial_id], found[trial_id] = index, (Checkpoint(trial_id, row["step"], uri), missing)
                break
            missing.insert(0, f"at step {row['step']} ({row['checkpoint']})")
    keep = [not (row["trial_id"] in running and index > cut.get(row["trial_id"], -1)
                 and row.get("status") != Status.RETRIED) for index, row in enumerate(rows)]
    kept_before = [0]
    for flag in keep:
        kept_before.append(kept_before[-1] + flag)
    remapped = []
    for entry in journal:
        position = min(int(entry.get("rows") or 0), len(rows))
        remapped.append({**entry, "rows": kept_before[position]})
    kept = [row for row, flag in zip(rows, keep) if flag]
    return kept, remapped, len(rows) - len(kept), found


def _replay(engine: Engine, rows: list[dict[str, Any]], journal: list[dict[str, Any]]) -> int:
    """Hand the controller every recorded ask and result in their order; returns how many rows it disagreed on."""
    mismatches, asks = 0, iter(journal)
    pending = next(asks, None)
    for index in range(len(rows) + 1):
        while pending is not None and int(pending["rows"]) <= index:
            if "resume" in pending:
                _promote(engine, pending["resume"])
            else:
                _ask(engine, _trial_id(pending))
            pending = next(asks, None)
        if index < len(rows):
            mismatches += _apply(engine, rows[index], index)
    if mismatches:
        say(engine.name, f"replay: {mismatches} decisions differ from the record")
    return mismatches


def _ask(engine: Engine, trial_id: int) -> None:
    spec = engine.controller.ask()
    if spec is None or spec.trial_id != trial_id:
        got = None if spec is None else spec.trial_id
        raise ValueError(f"cannot resume: the journal says trial {trial_id} was proposed next, but "
                         f"{type(engine.controller).__name__} proposes {got}; a controller must be deterministic "
                         "given its seed for `nasplat resume` to rebuild it")
    engine.add_trial(spec)


def _promote(engine: Engine, trial_id: int) -> None:
    promoted = engine.controller.promote()
    if promoted != trial_id:
        raise ValueError(f"cannot resume: the journal says paused trial {trial_id} was resumed next, but "
                         f"{type(engine.controller).__name__} promotes {promoted}; a controller must be deterministic "
                         "given its seed for `nasplat resume` to rebuild it")
    engine.resume_trial(trial_id)


def _apply(engine: Engine, row: dict[str, Any], index: int) -> int:
    """Replay one row into the engine; returns 1 if the controller decided differently from the record, else 0."""
    trial_id, status, step = row.get("trial_id"), row.get("status"), row.get("step")
    record = engine.trials.get(trial_id) if isinstance(trial_id, int) else None
    if record is None or not isinstance(step, int):
        raise ValueError(f"cannot resume: row {index + 1} of results.jsonl names trial {trial_id!r}, step {step!r}, "
                         "which the journal never proposed")
    mismatch = 0
    if status == Status.RETRIED:
        engine.set_attempt(record.trial_id, int(row.get("attempt", record.attempt)) + 1)
    elif status == Status.FAILED:
        engine.end(record, Status.FAILED, Result({}, step, failed=True, error=row.get("error")))
    elif record.status == Status.RUNNING:
        engine.set_attempt(record.trial_id, int(row.get("attempt", record.attempt)))
        metrics = {key: value for key, value in row.items() if key not in RESERVED}
        replayed, decision = engine.advance(record, metrics, step)
        donor = decision.donor_id if isinstance(decision, Exploit) and replayed == Status.RUNNING else None
        mismatch = int(replayed != status or donor != row.get("donor_id"))
        if replayed == Status.RUNNING and status in (Status.COMPLETED, Status.STOPPED):  # trust the record
            engine.end(record, Status(status), Result(metrics, step))
    engine.replayed(row)
    return mismatch


def _trial_id(entry: dict[str, Any]) -> int:
    trial_id = entry.get("ask")
    if not isinstance(trial_id, int):
        raise ValueError(f"cannot resume: journal.jsonl holds an entry without a trial id: {entry!r}")
    return trial_id
