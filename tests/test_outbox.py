"""`nasplat.engine.outbox`: rows and journal entries go out in the order they came, a row waiting for its checkpoint
holds back everything behind it, and a journal entry records how many rows came before it; so what reaches the folder
is always a prefix of what happened."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nasplat.engine.outbox import Outbox
from nasplat.storage import JOURNAL_FILE, ROWS_FILE, ExperimentFolder, read_rows


def outbox(folder: ExperimentFolder | None = None) -> tuple[Outbox, list[dict[str, Any]]]:
    """An outbox, and the rows its `on_row` saw, in order."""
    heard: list[dict[str, Any]] = []
    return Outbox(folder, heard.append), heard


def step(trial: int, step: int) -> dict[str, Any]:
    return {"trial_id": trial, "step": step, "status": "running"}


def test_entries_go_out_in_order_and_a_journal_entry_counts_the_rows_before_it():
    box, heard = outbox()
    entries = [{"ask": 0, "rows": None}, {"ask": 1, "rows": None}, {"resume": 0, "rows": None}]
    box.ask(entries[0])
    box.row(step(0, 1))
    box.ask(entries[1])
    box.row(step(1, 1))
    box.row(step(0, 2))
    box.ask(entries[2])
    assert box.rows == heard == [step(0, 1), step(1, 1), step(0, 2)]
    assert [entry["rows"] for entry in entries] == [0, 1, 3] and not box.queue and not box.waiting


def test_a_row_waiting_for_its_checkpoint_holds_back_everything_behind_it_until_saved():
    box, heard = outbox()
    box.row(step(0, 1))
    box.row(step(0, 2), wait=(0, 2))
    later_ask = {"ask": 1, "rows": None}
    box.ask(later_ask)
    box.row(step(1, 1))
    assert heard == [step(0, 1)] and later_ask["rows"] is None and box.waiting == {(0, 2)}

    box.saved((1, 1), "ck/trial-1/step-1")  # another checkpoint: nothing moves, nothing is marked
    box.flush()
    assert heard == [step(0, 1)] and all("checkpoint" not in item for _, item, _ in box.queue)

    box.saved((0, 2), "ck/trial-0/step-2")
    assert heard == box.rows == [step(0, 1), {**step(0, 2), "checkpoint": "ck/trial-0/step-2"}, step(1, 1)]
    assert later_ask["rows"] == 2 and not box.queue and box.waiting == set()


def test_a_failed_save_lets_the_row_go_without_a_checkpoint():
    box, heard = outbox()
    box.row(step(0, 3), wait=(0, 3))
    box.row(step(1, 1))
    assert heard == []
    box.saved((0, 3), None)
    assert heard == [step(0, 3), step(1, 1)]  # no "checkpoint" key: a resume restarts the trial from an earlier one


def test_checkpoints_reported_out_of_order_release_rows_only_in_order():
    box, heard = outbox()
    box.row(step(0, 1), wait=(0, 1))
    box.row(step(1, 1), wait=(1, 1))
    box.saved((1, 1), "ck/trial-1/step-1")
    assert heard == [] and box.waiting == {(0, 1)}
    box.saved((0, 1), "ck/trial-0/step-1")
    assert heard == [{**step(0, 1), "checkpoint": "ck/trial-0/step-1"},
                     {**step(1, 1), "checkpoint": "ck/trial-1/step-1"}]


def test_forgetting_a_trial_releases_its_rows_only_and_forgetting_all_releases_everything():
    box, heard = outbox()
    box.row(step(0, 1), wait=(0, 1))
    box.row(step(1, 1), wait=(1, 1))
    box.row(step(2, 1))
    box.forget(1)  # trial 1's attempt failed: its checkpoint will never be reported
    assert heard == [] and box.waiting == {(0, 1)}
    box.forget(0)
    assert heard == [step(0, 1), step(1, 1), step(2, 1)] and box.waiting == set()

    box.row(step(3, 1), wait=(3, 1))
    box.row(step(4, 1), wait=(4, 1))
    box.forget()  # closing
    assert heard[3:] == [step(3, 1), step(4, 1)]


def test_replayed_rows_are_counted_but_not_written_or_heard(tmp_path: Path):
    folder = ExperimentFolder(tmp_path / "exp")
    folder.create({})
    box, heard = outbox(folder)
    box.replayed(step(0, 1))
    entry = {"ask": 1, "rows": None}
    box.ask(entry)
    folder.close()
    assert box.rows == [step(0, 1)] and heard == [] and entry["rows"] == 1
    assert read_rows(tmp_path / "exp" / ROWS_FILE) == [] and read_rows(tmp_path / "exp" / JOURNAL_FILE) == [entry]


def test_the_folder_holds_a_prefix_of_what_happened_at_every_moment(tmp_path: Path):
    folder = ExperimentFolder(tmp_path / "exp")
    folder.create({})
    box, _ = outbox(folder)

    def on_disk() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return read_rows(tmp_path / "exp" / ROWS_FILE), read_rows(tmp_path / "exp" / JOURNAL_FILE)

    box.ask({"ask": 0, "rows": None, "time": 0.0})
    box.row(step(0, 1))
    box.ask({"ask": 1, "rows": None, "time": 0.5})
    box.row(step(0, 2), wait=(0, 2))
    box.row(step(1, 1))
    box.ask({"ask": 2, "rows": None, "time": 1.0})
    assert on_disk() == ([step(0, 1)], [{"ask": 0, "rows": 0, "time": 0.0}, {"ask": 1, "rows": 1, "time": 0.5}])

    box.saved((0, 2), "ck/trial-0/step-2")
    box.row(step(2, 1))
    folder.close()
    assert on_disk() == (
        [step(0, 1), {**step(0, 2), "checkpoint": "ck/trial-0/step-2"}, step(1, 1), step(2, 1)],
        [{"ask": 0, "rows": 0, "time": 0.0}, {"ask": 1, "rows": 1, "time": 0.5}, {"ask": 2, "rows": 3, "time": 1.0}])
