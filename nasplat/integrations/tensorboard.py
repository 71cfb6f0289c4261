"""TensorBoard event files: one run per trial, its metrics per step, its config in the HParams plugin.

On by default for every run with a `storage` folder when the `tensorboard` package is installed
(`pip install nasplat[tensorboard]`); look at them with `tensorboard --logdir <experiment folder>`.
Written with the `tensorboard` package's own record format and protocol buffers, in this thread (one small file
write a row): the driver never imports torch for them, and no writer thread is started per trial.
"""

from __future__ import annotations

import itertools
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from nasplat.core.rows import Status
from nasplat.core.trees import flatten
from nasplat.engine.listener import Listener
from nasplat.integrations.extras import require, row_metrics

TB_FOLDER = "tensorboard"


class TensorBoardLogger(Listener):
    """An engine listener writing `<logdir>/trial-<id>/` event files (default logdir: `<experiment>/tensorboard`).

    Each trial's run holds one scalar per metric per step and, in the HParams plugin, the trial's config
    (nested decisions as `depth.n`, ...) with the trial's end status. A retried attempt (or a trial that a
    resumed run starts over) opens a new file that hides the steps it re-runs (a purge at its first step).
    """

    def __init__(self, logdir: str | Path | None = None) -> None:
        require("tensorboard", "tensorboard")
        self.logdir = Path(logdir) if logdir is not None else None
        self._writers: dict[int, tuple[int, EventFile]] = {}  # trial id -> (attempt, its open event file)

    def __getstate__(self) -> dict[str, Any]:
        return {"logdir": self.logdir, "_writers": {}}  # open writers stay in the driver

    def root(self, engine: Any) -> Path:
        """The folder holding the trials' runs."""
        if self.logdir is not None:
            return self.logdir
        if engine.path is None:
            raise ValueError("TensorBoardLogger needs `logdir=` when the run has no `storage` folder, got neither")
        return Path(engine.path) / TB_FOLDER

    def on_start(self, engine: Any) -> None:
        root = self.root(engine)
        root.mkdir(parents=True, exist_ok=True)
        if engine.progress:
            shown = engine.path if self.logdir is None else root
            print(f"[nasplat {engine.name}] TensorBoard: tensorboard --logdir {shown}", file=sys.stderr, flush=True)

    def on_row(self, engine: Any, row: dict[str, Any]) -> None:
        writer = self._writer(engine, row)
        writer.scalars(row_metrics(row), row["step"])
        if row["status"] != Status.RUNNING:
            writer.plugin_data(session_end=_session_end(failed=row["status"] == Status.FAILED))
            writer.close()
            del self._writers[row["trial_id"]]
        else:
            writer.flush()

    def on_end(self, engine: Any) -> None:
        for _, writer in self._writers.values():
            writer.close()
        self._writers.clear()

    def _writer(self, engine: Any, row: dict[str, Any]) -> EventFile:
        """The trial's event file; a new attempt opens a new one that purges the steps it will write again."""
        trial, attempt = row["trial_id"], row.get("attempt", 0)
        current = self._writers.get(trial)
        if current is not None and current[0] == attempt:
            return current[1]
        if current is not None:
            current[1].close()
        writer = EventFile(self.root(engine) / f"trial-{trial}", purge_step=row["step"])
        writer.plugin_data(session_start=_session_start(flatten(row["config"])))
        self._writers[trial] = (attempt, writer)
        return writer


_files = itertools.count()  # tells apart the files one process opens within one second; they sort in that order
_HOST = socket.gethostname()


class EventFile:
    """One TensorBoard event file (`events.out.tfevents.<time>.<host>.<pid>.<n>` in `folder`), written in this
    thread. With `purge_step`, TensorBoard drops the steps from `purge_step` on that earlier files of the run hold
    (a new run's folder has none)."""

    def __init__(self, folder: Path, purge_step: int | None = None) -> None:
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        from tensorboard.summary.writer.record_writer import RecordWriter

        try:
            folder.mkdir(parents=True)
            purge_step = None  # nothing earlier to hide
        except FileExistsError:
            pass
        name = f"events.out.tfevents.{int(time.time()):010d}.{_HOST}.{os.getpid()}.{next(_files):06d}"
        self.records = RecordWriter(open(folder / name, "wb"))  # noqa: SIM115 (open until `close`, row after row)
        self.event = Event
        self.write(Event(wall_time=time.time(), file_version="brain.Event:2"))
        if purge_step is not None:  # how TensorBoard marks a restart: later steps from here on replace earlier ones
            self.write(Event(wall_time=time.time(), step=purge_step, file_version="brain.Event:2"))
            self.write(Event(wall_time=time.time(), step=purge_step, session_log=SessionLog(status=SessionLog.START)))

    def write(self, event: Any) -> None:
        self.records.write(event.SerializeToString())

    def scalars(self, values: dict[str, float], step: int) -> None:
        """One event holding every value of `values` as a scalar at `step`."""
        from tensorboard.compat.proto.summary_pb2 import Summary

        if values:
            summary = Summary(value=[Summary.Value(tag=key, simple_value=value) for key, value in values.items()])
            self.write(self.event(wall_time=time.time(), step=step, summary=summary))

    def plugin_data(self, **info: Any) -> None:
        """The HParams plugin's `session_start` or `session_end` info, as its summary."""
        from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
        from tensorboard.plugins.hparams import metadata as hparams
        from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

        (kind, value), = info.items()
        tag = {"session_start": hparams.SESSION_START_INFO_TAG, "session_end": hparams.SESSION_END_INFO_TAG}[kind]
        content = HParamsPluginData(version=hparams.PLUGIN_DATA_VERSION, **{f"{kind}_info": value})
        metadata = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name=hparams.PLUGIN_NAME,
                                                                          content=content.SerializeToString()))
        self.write(self.event(wall_time=time.time(), summary=Summary(value=[Summary.Value(tag=tag,
                                                                                          metadata=metadata)])))

    def flush(self) -> None:
        self.records.flush()

    def close(self) -> None:
        self.records.close()


def _session_start(config: dict[str, Any]) -> Any:
    """The HParams plugin's session-start info: the trial's flattened config (numbers, strings, booleans as they are,
    anything else as text)."""
    from tensorboard.plugins.hparams.plugin_data_pb2 import SessionStartInfo

    info = SessionStartInfo()
    for key, value in config.items():
        if isinstance(value, bool):
            info.hparams[key].bool_value = value
        elif isinstance(value, (int, float)):
            info.hparams[key].number_value = value
        else:
            info.hparams[key].string_value = value if isinstance(value, str) else repr(value)
    return info


def _session_end(*, failed: bool) -> Any:
    """The HParams plugin's session-end info with the trial's status (success or failure)."""
    from tensorboard.plugins.hparams.api_pb2 import Status
    from tensorboard.plugins.hparams.plugin_data_pb2 import SessionEndInfo

    return SessionEndInfo(status=Status.Value("STATUS_FAILURE" if failed else "STATUS_SUCCESS"))
