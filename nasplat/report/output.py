"""Where a report page goes: `<folder>/report.html`, or the file the user names (never one of the experiment's own
files); a folder that cannot be written (a read-only mount, no permission) sends it to `./<folder name>-report.html`
in the current folder instead, with a note saying why."""

from __future__ import annotations

import errno
from pathlib import Path

from nasplat.storage import StorageError, write_atomic

REPORT_FILE = "report.html"
NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)


def reason(exc: OSError) -> str:
    """`EROFS (Read-only file system)`: the errno's name and meaning, for a one-line note."""
    name = errno.errorcode.get(exc.errno) if isinstance(exc.errno, int) else None
    return f"{name} ({exc.strerror})" if name else str(exc)


def chosen_output(folder: Path, output: str | Path) -> Path:
    """`output`, unless it lies inside the experiment folder: there the report may replace its own page only."""
    path, inside = Path(output), folder.resolve()
    target = path.resolve()
    if target.is_relative_to(inside) and target != inside / REPORT_FILE:
        raise ValueError(f"-o {output} is inside the experiment folder {folder}: the report may only replace its "
                         f"{REPORT_FILE} there; choose a file outside it")
    return path


def write_page(folder: Path, page: str, output: str | Path | None = None) -> tuple[Path, str]:
    """Write `page` atomically to `output` (see `chosen_output`), by default `<folder>/report.html`, else, when the
    folder cannot be written, to `./<folder name>-report.html`. Returns the path written and a note saying why it
    is not the default ('' when it is)."""
    if output is not None:
        path = chosen_output(folder, output)
        write_atomic(path, page.encode("utf-8"))
        return path, ""
    try:
        write_atomic(folder / REPORT_FILE, page.encode("utf-8"))
        return folder / REPORT_FILE, ""
    except StorageError as exc:
        if exc.errno not in NOT_WRITABLE:
            raise
        why = f"{folder} is not writable: {reason(exc)}"
    elsewhere = Path.cwd() / f"{folder.resolve().name}-{REPORT_FILE}"
    try:
        write_atomic(elsewhere, page.encode("utf-8"))
    except StorageError as exc:
        raise ValueError(f"cannot write the report: {why}, and {elsewhere} neither ({reason(exc)}); give -o FILE, "
                         "or -o - for standard output") from None
    return elsewhere, f"{why}; -o FILE to choose where"
