"""One place for an experiment's files: their names, atomic writes, the folder lock, local folders and URIs.

An experiment folder holds
- `experiment.json` (the experiment as plain data, when it was given by names and dotted paths) or
  `experiment.pkl` (cloudpickle, when live Python objects were handed to `nasplat.run`: loading it runs code, so
  `resume` and `retrain` refuse it unless told `--trust-pickle` / `allow_pickle=True`);
- `space.json`, the search space as plain data (`nasplat.space.data`), which `report`, `serve` and `status` read;
- `meta.json` (name, metric, mode, controller, executor);
- `results.jsonl`, one row per trial step, append-only: the record of what happened;
- `journal.jsonl`, append-only: when each trial was proposed, counted in rows (`{"ask": 3, "rows": 17}`).
  Rows and journal together are the experiment's state: `nasplat resume` rebuilds the controller by replaying
  them, so writing the state costs the same at trial 10 and at trial 100,000;
- `lock`, held with `flock` by the driver that runs the experiment;
- `checkpoints/trial-<id>/step-<k>/` (trainer states, see `nasplat.storage.checkpoints`).

`storage` may be a local folder or a URI that `pyarrow.fs` opens (`s3://bucket/prefix`, `gs://...`,
`file://...`). With a URI the driver works on a local copy of the folder and uploads what grew (as parts named by
their first byte, so an upload never repeats earlier bytes); `Storage.download` restores the copy on a fresh machine.
"""

from nasplat.storage.files import (
    APPEND_ONLY,
    CHECKPOINTS,
    JOURNAL_FILE,
    LOCK_FILE,
    META_FILE,
    ROWS_FILE,
    SPACE_FILE,
    SPEC_JSON,
    SPEC_PICKLE,
    WHOLE_FILES,
    FolderInUse,
    FolderLock,
    PickleRefused,
    RowLog,
    StorageError,
    fsync_dir,
    is_uri,
    json_default,
    local_copy,
    read_json,
    read_rows,
    scratch_folder,
    write_atomic,
)
from nasplat.storage.folder import ExperimentFolder, read_spec
from nasplat.storage.remote import Storage

__all__ = [
    "APPEND_ONLY", "CHECKPOINTS", "JOURNAL_FILE", "LOCK_FILE", "META_FILE", "ROWS_FILE", "SPACE_FILE", "SPEC_JSON",
    "SPEC_PICKLE", "WHOLE_FILES", "ExperimentFolder", "FolderInUse", "FolderLock", "PickleRefused", "RowLog", "Storage",
    "StorageError", "fsync_dir", "is_uri",
    "json_default", "local_copy", "read_json", "read_rows", "read_spec", "scratch_folder", "write_atomic",
]
