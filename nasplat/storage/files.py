"""File names of an experiment folder, atomic writes, the folder lock, reading JSON and JSON lines."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import stat
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

ROWS_FILE, JOURNAL_FILE, META_FILE, LOCK_FILE = "results.jsonl", "journal.jsonl", "meta.json", "lock"
SPEC_JSON, SPEC_PICKLE = "experiment.json", "experiment.pkl"
SPACE_FILE = "space.json"  # the search space as plain data (`nasplat.space.data`), for the commands that read a folder
CHECKPOINTS = "checkpoints"
APPEND_ONLY = (ROWS_FILE, JOURNAL_FILE)
WHOLE_FILES = (SPEC_JSON, SPEC_PICKLE, META_FILE, SPACE_FILE)


def is_uri(location: str | Path) -> bool:
    """Whether `location` names a filesystem by scheme (`s3://...`) rather than a local path."""
    return "://" in str(location)


class PickleRefused(ValueError):
    """A folder's file that only a pickle can load (so loading it would run code from the folder), refused because
    the user did not say they trust it (`--trust-pickle`, `allow_pickle=True`)."""


class StorageError(OSError):
    """A write to storage failed: one line naming the errno (`ENOSPC`, `EACCES`, ...) and the path, e.g.
    `ENOSPC (No space left on device): cannot write /data/exp/checkpoints/trial-0/step-1/state.pt`."""

    def __init__(self, code: int | None, reason: str, path: str, action: str = "write", hint: str = "") -> None:
        super().__init__(code, reason, path)
        self.action, self.hint = action, hint

    @classmethod
    def of(cls, path: str | Path, cause: BaseException, action: str = "write", hint: str = "") -> StorageError:
        """The error `cause` (an `OSError`, or what a library made of one) of `action` on `path`."""
        if isinstance(cause, StorageError):
            return cause
        code = getattr(cause, "errno", None)
        reason = os.strerror(code) if isinstance(code, int) else " ".join(str(cause).split()) or type(cause).__name__
        return cls(code if isinstance(code, int) else None, reason, str(path), action, hint)

    def __str__(self) -> str:
        name = errno.errorcode.get(self.errno) if isinstance(self.errno, int) else None
        what = f"{name} ({self.strerror})" if name else str(self.strerror)
        return f"{what}: cannot {self.action} {self.filename}" + (f"; {self.hint}" if self.hint else "")

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.errno, self.strerror, self.filename, self.action, self.hint)


class _Sink:
    """A file object that remembers the first `OSError` its writes raised: libraries that write into a file (torch's
    zip writer) turn it into their own error ("unexpected pos 64 vs 0"), losing the errno."""

    def __init__(self, file: BinaryIO) -> None:
        self.file = file
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return self.file.write(data)
        except OSError as exc:
            self.error = self.error or exc
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self.file, name)


def written(payload: bytes | Callable[[BinaryIO], Any], out: BinaryIO, folder: str | Path | None = None) -> None:
    """Write `payload` into `out`; an error the writes caused is raised as the `OSError` they raised (a full local
    `folder` counts as `ENOSPC` where the writer hid it)."""
    sink = _Sink(out)
    try:
        payload(sink) if callable(payload) else sink.write(payload)  # type: ignore[arg-type]
    except OSError:
        raise
    except Exception as exc:
        if sink.error is not None:
            raise sink.error from exc
        if folder is not None and _full(folder):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)) from exc
        raise


def _full(folder: str | Path) -> bool:
    """Whether the filesystem holding `folder` has no block left for this user."""
    try:
        return os.statvfs(folder).f_bavail == 0
    except OSError:
        return False


def write_atomic(path: str | Path, payload: bytes | Callable[[BinaryIO], Any], *, replace: bool = True) -> int:
    """Write `payload` (bytes, or a function that writes into the open file: no copy of the bytes in memory) to a
    uniquely named temp file beside `path`, fsync, rename: readers see the old file or the new one, whole. Returns
    the size written. A failure of the storage itself (a full disk, no permission) raises `StorageError` naming
    the errno and `path`, and leaves an existing `path` as it was. With `replace=False` an existing `path` (or one
    made meanwhile) is never replaced: `FileExistsError`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        with open(tmp, "xb") as f:
            written(payload, f, path.parent)
            size = f.tell()
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)  # fails where `path` exists, however it came there
        fsync_dir(path.parent)
    except FileExistsError:
        if replace:
            raise StorageError.of(path, OSError(errno.EEXIST, os.strerror(errno.EEXIST))) from None
        raise FileExistsError(f"{path} exists already; nasplat does not overwrite it") from None
    except OSError as exc:
        raise StorageError.of(path, exc) from None
    finally:
        if tmp.exists():
            tmp.unlink()
    return size


def fsync_dir(folder: str | Path) -> None:
    """Make a rename or a new file in `folder` durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_plain(path: Path, flags: int) -> int:
    """`os.open(path, flags)` for a file of an experiment folder, never through a symbolic link (a folder from
    elsewhere may hold one pointing at any file): one-line `ValueError` naming it; other failures `StorageError`."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError(f"{path} is a symbolic link; nasplat writes an experiment's files only as plain files "
                             "of its folder, never through a link: remove the link") from None
        raise StorageError.of(path, exc, "open") from None


class FolderInUse(RuntimeError):
    """Another live driver holds the experiment folder."""


class FolderLock:
    """An exclusive `flock` on `<folder>/lock` naming its holder (host and pid). The kernel drops it when the holder
    dies, so a stale lock left by a killed driver is taken over by the next one. The file is opened without following
    a link (`open_plain`) and truncated only once it is held: a `lock` that is a symbolic link, a hard link or no
    regular file (a folder from elsewhere may hold one naming any file) is refused in one line."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / LOCK_FILE
        self.file: Any = None

    def acquire(self) -> None:
        """Take the lock, or raise `FolderInUse` naming its holder (`ValueError` for a lock file that is a link)."""
        fd = open_plain(self.path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            os.close(fd)
            what = "a hard link to another file" if stat.S_ISREG(info.st_mode) else "not a regular file"
            raise ValueError(f"{self.path} is {what}; an experiment's lock must be a plain file of its own: remove it")
        file = os.fdopen(fd, "r+", encoding="utf-8")
        try:
            fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = file.read().strip() or "unknown"
            file.close()
            raise FolderInUse(f"{self.path.parent} is in use by another nasplat driver ({holder}); wait for it to "
                               "end or stop it, then `nasplat resume` this folder") from None
        file.truncate()
        file.write(f"host {socket.gethostname()} pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        file.flush()
        self.file = file

    def release(self) -> None:
        """Let go of the lock (a second call does nothing)."""
        if self.file is not None:
            fcntl.flock(self.file.fileno(), fcntl.LOCK_UN)
            self.file.close()
            self.file = None


def local_copy(uri: str) -> Path:
    """Where the driver keeps its working copy of the remote experiment `uri` (`$NASPLAT_CACHE`, default
    `~/.cache/nasplat`)."""
    base = Path(os.environ.get("NASPLAT_CACHE", Path.home() / ".cache" / "nasplat"))
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in uri)
    return base / safe


def read_json(path: Path) -> Any:
    """A JSON file; a broken one gets an error naming the file."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read it as JSON ({exc})") from None


def scratch_folder(prefix: str) -> Path:
    """A fresh temporary folder (for parameter-server snapshots of runs without storage)."""
    return Path(tempfile.mkdtemp(prefix=prefix))


class RowLog:
    """An append-only JSON-lines file: every line is written and flushed as it comes (a killed process loses
    none), and fsynced by `sync` (an OS crash loses at most what came since).

    A line the storage refuses (a full disk) raises `StorageError` naming the errno and the file, and so does every
    later `append`: the lines before it stay whole on disk (a part of the refused one, like a line cut short by a
    kill, is dropped when the file is read back), so the experiment stops there and `nasplat resume` goes on."""

    HINT = "the run stops here with the rows recorded so far; free space, then `nasplat resume` the folder"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file: Any = os.fdopen(open_plain(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "a", encoding="utf-8")
        self.lines = 0
        self.error: StorageError | None = None

    def append(self, item: dict[str, Any]) -> None:
        if self.error is not None:
            raise self.error
        try:
            self.file.write(json.dumps(item, default=json_default, allow_nan=True) + "\n")
            self.file.flush()
        except OSError as exc:
            self.error = StorageError.of(self.path, exc, "append to", self.HINT)
            raise self.error from None
        self.lines += 1

    def sync(self) -> None:
        if self.file is not None:
            try:
                self.file.flush()
                os.fsync(self.file.fileno())
            except OSError as exc:
                self.error = self.error or StorageError.of(self.path, exc, "append to", self.HINT)
                raise self.error from None

    def close(self) -> None:
        """Sync and close the file; it is closed even where the sync fails (that error is raised after)."""
        if self.file is None:
            return
        try:
            if self.error is None:
                self.sync()
        finally:
            file, self.file = self.file, None
            try:
                file.close()
            except OSError:  # what a refused line left in the buffer: that line is lost, the file is closed
                pass


def read_rows(path: Path, *, complete: bool = False) -> list[dict[str, Any]]:
    """The JSON lines of `path`. A last line without its newline (a write cut short by a kill) is left out, or with
    `complete` the file is cut back to the last whole line. Any other bad line raises an error naming file and line."""
    rows: list[dict[str, Any]] = []
    with open(path, "rb") as f:
        data = f.read()
    end = data.rfind(b"\n") + 1
    for number, line in enumerate(data[:end].splitlines(), start=1):
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"{path}, line {number}: not a JSON object ({exc}); fix or delete that line") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}, line {number}: expected a JSON object, got {type(row).__name__}")
        rows.append(row)
    if complete and end < len(data):
        with os.fdopen(open_plain(path, os.O_RDWR), "r+b") as f:
            f.truncate(end)
            os.fsync(f.fileno())
    return rows


def json_default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return repr(value)
