"""TensorBoard event files: one run per trial, its metrics per step, its config in the HParams plugin.

On by default for every run with a `storage` folder when the `tensorboard` package is installed
(`pip install nasplat[tensorboard]`); look at them with `tensorboard --logdir <experiment folder>`.
Written with PyTorch's `torch.utils.tensorboard.SummaryWriter`.
"""

from __future__ import annotations

import sys
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
    resumed run starts over) hides the steps it re-runs through the writer's `purge_step`.
    """

    def __init__(self, logdir: str | Path | None = None) -> None:
        require("tensorboard", "tensorboard")
        self.logdir = Path(logdir) if logdir is not None else None
        self._writers: dict[int, tuple[int, Any]] = {}  # trial id -> (attempt, SummaryWriter)

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
        # imported before any trial runs, so that no other thread is importing torch at the same time
        import torch.utils.tensorboard  # noqa: F401

        root = self.root(engine)
        root.mkdir(parents=True, exist_ok=True)
        if engine.progress:
            shown = engine.path if self.logdir is None else root
            print(f"[nasplat {engine.name}] TensorBoard: tensorboard --logdir {shown}", file=sys.stderr, flush=True)

    def on_row(self, engine: Any, row: dict[str, Any]) -> None:
        writer = self._writer(engine, row)
        for key, value in row_metrics(row).items():
            writer.add_scalar(key, value, global_step=row["step"])
        if row["status"] != Status.RUNNING:
            writer.file_writer.add_summary(_session_end(failed=row["status"] == Status.FAILED))
            writer.close()
            del self._writers[row["trial_id"]]
        else:
            writer.flush()

    def on_end(self, engine: Any) -> None:
        for _, writer in self._writers.values():
            writer.close()
        self._writers.clear()

    def _writer(self, engine: Any, row: dict[str, Any]) -> Any:
        """The trial's writer; a new attempt opens a new one that purges the steps it will write again."""
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        trial, attempt = row["trial_id"], row.get("attempt", 0)
        current = self._writers.get(trial)
        if current is not None and current[0] == attempt:
            return current[1]
        if current is not None:
            current[1].close()
        writer = SummaryWriter(log_dir=str(self.root(engine) / f"trial-{trial}"), purge_step=row["step"])
        _, session_start, _ = hparams({k: _hparam(v) for k, v in flatten(row["config"]).items()}, {})
        assert writer.file_writer is not None  # SummaryWriter opens its file writer when made, None once closed
        writer.file_writer.add_summary(session_start)
        self._writers[trial] = (attempt, writer)
        return writer


def _hparam(value: Any) -> bool | int | float | str:
    """A value the HParams plugin shows: numbers, strings and booleans as they are, anything else as text."""
    return value if isinstance(value, (bool, int, float, str)) else repr(value)


def _session_end(*, failed: bool) -> Any:
    """The HParams plugin's session-end summary with the trial's status (success or failure)."""
    from tensorboard.plugins.hparams.api_pb2 import Status
    from tensorboard.plugins.hparams.metadata import PLUGIN_DATA_VERSION, PLUGIN_NAME, SESSION_END_INFO_TAG
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData, SessionEndInfo
    from torch.utils.tensorboard.summary import Summary, SummaryMetadata

    status = Status.Value("STATUS_FAILURE" if failed else "STATUS_SUCCESS")
    content = HParamsPluginData(session_end_info=SessionEndInfo(status=status), version=PLUGIN_DATA_VERSION)
    metadata = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name=PLUGIN_NAME,
                                                                      content=content.SerializeToString()))
    return Summary(value=[Summary.Value(tag=SESSION_END_INFO_TAG, metadata=metadata)])
