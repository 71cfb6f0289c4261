"""The `nasplat` command: run, resume, retrain, status, export, report and serve experiments.

Every error is one line on stderr, `nasplat <command>: error: ...`, and exit code 2; `--debug` shows the
traceback instead. A `run` or `resume` that finished with trials failed and none completed, stopped or paused
(nothing could succeed) exits with code 1 after one line naming the first errors. Trainer and space modules are
found in the current folder, as with `python -m`. `nasplat run`
keeps its experiment under `--storage`, else the file's `storage`, else the default folder (`$NASPLAT_RESULTS`,
else `./nasplat_results`), and prints where at the start; `--no-storage` keeps nothing on disk.

`arguments` declares the command line, `commands` does what each subcommand says; this module runs them.
"""

from __future__ import annotations

import os
import sys
import traceback

from nasplat.cli.arguments import parser
from nasplat.engine.records import ExperimentFailed
from nasplat.space.data import NotData
from nasplat.storage import FolderInUse, PickleRefused, StorageError

__all__ = ["main", "parser"]


def main(argv: list[str] | None = None) -> int:
    """Run the command line `argv`; returns the exit code (2 for any error, after one line on stderr)."""
    args = parser().parse_args(argv)
    _find_user_modules_here()
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(f"nasplat {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 (the command's boundary: any error is one line and exit code 2)
        if args.debug:
            traceback.print_exc()
        else:
            print(f"nasplat {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return 2


def _one_line(exc: BaseException) -> str:
    """The error's message on one line; the exception's type for errors that are not plain bad input."""
    from nasplat.integrations import MissingExtra

    message = " ".join(str(exc).split()) or "(no message)"
    expected = (ValueError, TypeError, FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError)
    if isinstance(exc, (FolderInUse, ExperimentFailed, MissingExtra, PickleRefused, NotData, StorageError)) or (
            isinstance(exc, expected) and type(exc).__module__ == "builtins"):
        return message
    return f"{type(exc).__name__}: {message} (run with --debug for the traceback)"


def _find_user_modules_here() -> None:
    """Put the current folder first on the import path of this process and of the Ray workers it starts, so
    that `trainer: my_trainer:MyTrainer` finds ./my_trainer.py (as `python -m` would)."""
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if here not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([here, *filter(None, paths)])
