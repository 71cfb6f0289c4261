"""The driver's side of an experiment folder: the lock, the append-only rows and journal, the upload to a URI."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import cloudpickle

from nasplat.storage.files import (
    CHECKPOINTS,
    JOURNAL_FILE,
    ROWS_FILE,
    SPEC_JSON,
    SPEC_PICKLE,
    FolderLock,
    PickleRefused,
    RowLog,
    StorageError,
    fsync_dir,
    is_uri,
    local_copy,
    read_rows,
    write_atomic,
)
from nasplat.storage.remote import Storage


class ExperimentFolder:
    """An experiment's folder at `location` (a local path or a URI), held by one driver at a time.

    Rows and journal entries are appended and flushed as they come; `sync` fsyncs them and, for a URI, uploads what
    grew. Syncing is paced so that it never takes more than a tenth of the run (`sync_interval_s` apart at least,
    and ten times its own last duration), which keeps its cost per trial flat however long the experiment is.
    """

    def __init__(self, location: str | Path, *, sync_interval_s: float = 1.0) -> None:
        self.location = str(location)
        self.remote = Storage(self.location) if is_uri(self.location) else None
        self.path = local_copy(self.location) if self.remote is not None else Path(location).expanduser().resolve()
        self.lock = FolderLock(self.path)
        self.rows: RowLog | None = None
        self.journal: RowLog | None = None
        self.uploaded: dict[str, int] = {}
        self.sync_interval_s = sync_interval_s
        self._last_sync, self._sync_cost = time.monotonic(), 0.0

    def __repr__(self) -> str:
        return f"ExperimentFolder({self.location!r})"

    @property
    def home(self) -> str:
        """The experiment's own location, as checkpoint locations are made from it: the URI (checkpoints live
        there, beside the uploaded rows), else the local folder's absolute path. Rows record a checkpoint relative
        to it (`checkpoints/trial-3/step-4`), so a copied or moved folder reads its own."""
        return self.location.rstrip("/") if self.remote is not None else str(self.path)

    @property
    def checkpoints(self) -> Storage:
        """Where trainer checkpoints go: beside the rows, on the URI itself when there is one (workers write there)."""
        return Storage(self.location).child(CHECKPOINTS) if self.remote else Storage(self.path / CHECKPOINTS)

    def exists(self) -> bool:
        """Whether an experiment was started here (its rows file exists, locally or on the URI)."""
        if (self.path / ROWS_FILE).exists():
            return True
        return self.remote is not None and self.remote.exists(f"{ROWS_FILE}.parts")

    def create(self, files: dict[str, bytes]) -> None:
        """Start a new experiment here in one step under the lock: take it, check that no experiment is here (one
        that another driver finished while this one waited counts), write `files` (spec, meta), then create empty
        journal and rows exclusively (an existing one is never truncated; the rows file, made last, marks the
        experiment as there)."""
        self.path.mkdir(parents=True, exist_ok=True)
        self.lock.acquire()
        try:
            if self.exists():
                raise FileExistsError(f"{self.location} already holds an experiment; continue it with "
                                      f"`nasplat resume {self.location}` or choose another `name`")
            for name, payload in files.items():
                write_atomic(self.path / name, payload)
            for name in (JOURNAL_FILE, ROWS_FILE):
                if name == JOURNAL_FILE and _empty_file(self.path / name):
                    continue  # left by a create killed before it made the rows: nothing in it to lose
                try:
                    with open(self.path / name, "xb") as created:
                        os.fsync(created.fileno())
                except FileExistsError:
                    raise FileExistsError(f"{self.path / name} exists already: {self.location} is not a fresh "
                                          "experiment folder; choose another `name` or remove the file") from None
                except OSError as exc:
                    raise StorageError.of(self.path / name, exc, "create") from None
                fsync_dir(self.path)
            self.open_logs()
            self.sync(force=True)
        except BaseException:
            self.close()
            raise

    def open_existing(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Take the lock of an existing experiment and return its rows and journal entries (a line cut short by a
        kill is dropped). From a URI the local copy is downloaded first, unless this machine holds one already."""
        if self.remote is not None and not (self.path / ROWS_FILE).exists():
            self.uploaded = self.remote.download(self.path)
        if not (self.path / ROWS_FILE).exists():
            raise FileNotFoundError(f"{self.location} is not a nasplat experiment folder (no {ROWS_FILE})")
        self.lock.acquire()
        try:
            rows = read_rows(self.path / ROWS_FILE, complete=True)
            journal = read_rows(self.path / JOURNAL_FILE, complete=True) if (self.path / JOURNAL_FILE).exists() else []
        except BaseException:
            self.lock.release()
            raise
        return rows, journal

    def rewrite(self, rows: list[dict[str, Any]], journal: list[dict[str, Any]]) -> None:
        """Replace the rows and journal (resume dropped some) atomically, then open them for appending."""
        import json

        from nasplat.storage.files import json_default

        for name, items in ((ROWS_FILE, rows), (JOURNAL_FILE, journal)):
            text = "".join(json.dumps(item, default=json_default, allow_nan=True) + "\n" for item in items)
            write_atomic(self.path / name, text.encode("utf-8"))
            if self.remote is not None:
                self.uploaded[name] = self.remote.replace_parts(self.path, name)
        self.open_logs()

    def open_logs(self) -> None:
        """Open rows and journal for appending."""
        self.rows, self.journal = RowLog(self.path / ROWS_FILE), RowLog(self.path / JOURNAL_FILE)

    def append_row(self, row: dict[str, Any]) -> None:
        assert self.rows is not None, "the experiment folder is not open"
        self.rows.append(row)

    def append_journal(self, entry: dict[str, Any]) -> None:
        assert self.journal is not None, "the experiment folder is not open"
        self.journal.append(entry)

    def sync(self, force: bool = False) -> bool:
        """fsync rows and journal and upload what grew to the URI, if due (or `force`); whether it synced."""
        now = time.monotonic()
        if not force and now - self._last_sync < max(self.sync_interval_s, 10 * self._sync_cost):
            return False
        for log in (self.rows, self.journal):
            if log is not None:
                log.sync()
        if self.remote is not None:
            self.remote.upload(self.path, self.uploaded)
        self._last_sync = time.monotonic()
        self._sync_cost = self._last_sync - now
        return True

    def close(self) -> None:
        """Sync everything and let go of the lock; a second call does nothing."""
        try:
            if self.rows is not None:
                self.sync(force=True)
        finally:
            logs, self.rows, self.journal = (self.rows, self.journal), None, None
            try:
                for log in logs:
                    if log is not None:
                        try:
                            log.close()
                        except StorageError:  # the storage refused the last sync: raised by it already
                            pass
            finally:
                self.lock.release()


def _empty_file(path: Path) -> bool:
    """Whether `path` is an empty regular file (not a link)."""
    try:
        info = path.lstat()
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_size == 0


def read_spec(path: Path, *, allow_pickle: bool = False) -> dict[str, Any]:
    """The experiment as `nasplat.run` got it: plain JSON, or (for live objects handed to the Python API) a pickle.
    Loading a pickle runs code from the folder, so it is refused (`PickleRefused`, one line saying how to allow it)
    unless `allow_pickle`."""
    if (path / SPEC_JSON).exists():
        try:
            return json.loads((path / SPEC_JSON).read_text(encoding="utf-8"))
        except ValueError as exc:
            raise ValueError(f"{path / SPEC_JSON}: cannot read it as JSON ({exc})") from None
    if (path / SPEC_PICKLE).exists():
        if not allow_pickle:
            raise PickleRefused(
                f"{path / SPEC_PICKLE}: this experiment was given as live Python objects (a trainer, space or "
                f"callable defined in code), stored as a pickle that runs code when loaded; refusing to load it. If "
                f"you trust whoever made this folder, pass --trust-pickle (Python: allow_pickle=True)")
        try:
            return cloudpickle.loads((path / SPEC_PICKLE).read_bytes())
        except Exception as exc:  # noqa: BLE001 (unpickling runs any code: whatever it raises is one line)
            raise ValueError(f"{path / SPEC_PICKLE}: cannot load it ({type(exc).__name__}: {exc})") from None
    raise FileNotFoundError(f"{path} is not a nasplat experiment folder (no {SPEC_JSON} or {SPEC_PICKLE})")
