"""Trainer checkpoints: when to write them and which to keep (`CheckpointPolicy`), their files, and the writer.

A checkpoint of trial `t` at step `k` is the folder `checkpoints/trial-<t>/step-<k>/` of the experiment's storage,
holding `state.pt` (the trainer's `state_dict`, `torch.save`d) and `manifest.json` (trial, step, config, the
`files` with their sizes, time), written last: a checkpoint is complete iff its manifest parses and every file it
names is there with its size, so a reader never takes half of one (nor a manifest cut short) for a checkpoint.

A state is read back as data (`nasplat.storage.states`); which checkpoint a row names, and where it lies in a folder
that was copied or moved, is `nasplat.storage.locate`.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from nasplat.core.checks import check_bool, check_int
from nasplat.storage import Storage, StorageError, json_default
from nasplat.storage.states import load_state_bytes


@dataclass(frozen=True)
class Checkpoint:
    """A trainer state written to storage: trial `trial_id` as it entered step `step + 1` (after step `step`, and
    after an exploit's load where one came with that step). `uri` is where it lies once durable, `error` why the
    write failed (then `uri` is None)."""

    trial_id: int
    step: int
    uri: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class CheckpointPolicy:
    """`every`: checkpoint each trial every that many steps (None: never by count); `at_end`: when a trial ends
    (completed or stopped); `at_perturbation`: at each step where the controller may later copy the state (PBT's
    perturbation steps, `Controller.snapshot_due`); `keep_best`: besides the latest checkpoint of each running trial,
    keep the checkpoints of this many best trials by the metric and delete the rest."""

    every: int | None = None
    at_end: bool = True
    at_perturbation: bool = True
    keep_best: int = 5

    def __post_init__(self) -> None:
        check_int("every", self.every, minimum=1, optional=True, where="checkpoint")
        check_bool("at_end", self.at_end, where="checkpoint")
        check_bool("at_perturbation", self.at_perturbation, where="checkpoint")
        check_int("keep_best", self.keep_best, minimum=0, where="checkpoint")

    @classmethod
    def from_options(cls, options: CheckpointPolicy | Mapping[str, Any] | bool | None) -> CheckpointPolicy | None:
        """A policy from `nasplat.run(checkpoint=...)` / the YAML `checkpoint:` section: a mapping of the fields,
        True (the defaults), False or None (no checkpoints)."""
        if options is None or options is False:
            return None
        if options is True:
            return cls()
        if isinstance(options, CheckpointPolicy):
            return options
        if not isinstance(options, Mapping):
            raise ValueError(f"`checkpoint` must be a mapping with keys from {[f.name for f in fields(cls)]}, "
                             f"true or false, got {options!r}")
        allowed = [f.name for f in fields(cls)]
        unknown = [k for k in options if k not in allowed]
        if unknown:
            raise ValueError(f"checkpoint: unknown key(s) {unknown}; allowed: {allowed}")
        return cls(**options)

    def due(self, step: int, *, perturbation: bool, ending: bool) -> bool:
        """Whether the state after `step` is checkpointed."""
        return bool((self.every is not None and step % self.every == 0) or (self.at_perturbation and perturbation)
                    or (self.at_end and ending))


# -- checkpoint files ---------------------------------------------------------------------------------------------
STATE_FILE, MANIFEST_FILE = "state.pt", "manifest.json"
WRITER_NICE = 10  # the writer thread's niceness, relative to nothing: it only ever lowers its priority


def checkpoint_name(trial_id: int, step: int) -> str:
    """Where trial `trial_id`'s checkpoint of step `step` lies inside the checkpoints folder."""
    return f"trial-{trial_id}/step-{step}"


def write_checkpoint(storage: Storage, trial_id: int, step: int, state: Any, config: Any = None) -> Checkpoint:
    """`torch.save` `state` straight into `storage` as trial `trial_id`'s checkpoint of step `step`: the state
    first, then the manifest (trial, step, config, `files`: name -> bytes, time), which marks the checkpoint
    complete. A full disk or another storage failure raises `StorageError` naming the errno and the file."""
    import torch

    name = checkpoint_name(trial_id, step)
    size = storage.write(f"{name}/{STATE_FILE}", lambda out: torch.save(state, out))  # streamed, no copy
    manifest = {"trial_id": trial_id, "step": step, "config": config, "files": {STATE_FILE: size}, "time": time.time()}
    storage.write(f"{name}/{MANIFEST_FILE}", json.dumps(manifest, default=json_default).encode("utf-8"))
    return Checkpoint(trial_id, step, storage.uri(name))


def checkpoint_problem(uri: str) -> str | None:
    """Why the checkpoint at `uri` (a path or URI) is not complete, or None if it is: its manifest must parse as a
    JSON object naming its files (`files`; manifests before it name `state.pt`'s `bytes`), each there with that
    size. An unreachable location is a problem like any other."""
    try:
        folder = Storage(uri)
        if not folder.exists(MANIFEST_FILE):
            return f"no {MANIFEST_FILE} in it"
        manifest = json.loads(folder.read(MANIFEST_FILE))
    except (OSError, ValueError) as exc:
        return f"its {MANIFEST_FILE} cannot be read ({type(exc).__name__}: {' '.join(str(exc).split())})"
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if files is None and isinstance(manifest, dict) and "bytes" in manifest:
        files = {STATE_FILE: manifest["bytes"]}
    if not isinstance(files, dict) or STATE_FILE not in files:
        return f"its {MANIFEST_FILE} names no files"
    for name, size in files.items():
        try:
            found = folder.size(name) if isinstance(name, str) and "/" not in name and name else None
        except (OSError, ValueError):
            found = None
        if found is None:
            return f"{name} is missing"
        if found != size:
            return f"{name} holds {found} bytes, its {MANIFEST_FILE} says {size}"
    return None


def is_complete(uri: str) -> bool:
    """Whether a complete checkpoint lies at `uri` (see `checkpoint_problem`)."""
    return checkpoint_problem(uri) is None


def load_checkpoint(uri: str, *, allow_pickle: bool = False) -> Any:
    """The trainer state of the complete checkpoint at `uri` (a path or URI), read as data: tensors, numpy arrays,
    numbers, strings and containers of them (`torch.load(weights_only=True)`), so a crafted checkpoint runs no
    code. A state holding other Python objects is refused in one line (`PickleRefused`) unless `allow_pickle`."""
    problem = checkpoint_problem(uri)
    if problem is not None:
        raise FileNotFoundError(f"{uri} is not a complete checkpoint ({problem})")
    return load_state_bytes(Storage(uri).read(STATE_FILE), f"{uri.rstrip('/')}/{STATE_FILE}",
                            allow_pickle=allow_pickle)


def read_manifest(uri: str) -> dict[str, Any]:
    """The manifest of the checkpoint at `uri`."""
    return json.loads(Storage(uri).read(MANIFEST_FILE))


def list_checkpoints(storage: Storage, trial_id: int) -> list[Checkpoint]:
    """The complete checkpoints of trial `trial_id` in `storage`, by step (a write cut short, or a manifest that
    does not parse or name its files, is left out)."""
    found = []
    for entry in storage.list(f"trial-{trial_id}"):
        prefix, _, step = entry.partition("-")
        if prefix == "step" and step.isdigit():
            uri = storage.uri(checkpoint_name(trial_id, int(step)))
            if is_complete(uri):
                found.append(Checkpoint(trial_id, int(step), uri))
    return sorted(found, key=lambda c: c.step)


class CheckpointWriter:
    """Writes checkpoints to `storage` off the training path: `submit` queues a copied state, a thread serialises
    and writes it, `collect` returns the finished writes (durable or failed), each once. Where writes fall behind
    the steps, `supersede` takes back a trial's queued write for its newer state (the latest wins, memory stays
    bounded, the training never waits). Without `background` the write happens inside `submit`."""

    def __init__(self, storage: Storage, *, background: bool = True) -> None:
        self.storage = storage
        self.done: list[Checkpoint] = []
        self.jobs: deque[tuple[Any, ...]] = deque()  # queued, not started: (trial, step, state, config, release)
        self.writing, self.closed = 0, False
        self.condition = threading.Condition()
        self.background = background
        self.thread: threading.Thread | None = None  # started with the first write: a run that writes none (a
        # `processes` worker of a search without checkpoints) never imports torch for it

    def _start(self) -> None:
        """Start the writer thread. torch is imported first, in the caller's thread: two threads importing torch for
        the first time at once (the writer's torch.save, a TensorBoard writer in the driver) can leave it
        half-initialised."""
        import torch  # noqa: F401

        self.thread = threading.Thread(target=self._run, name="nasplat-checkpoint-writer", daemon=True)
        self.thread.start()

    def submit(self, trial_id: int, step: int, state: Any, config: Any = None,
               release: Callable[[Any], None] | None = None) -> None:
        """Write `state` (already a copy the caller no longer touches) as trial `trial_id`'s checkpoint of `step`;
        then hand `state` to `release` (its memory may be reused)."""
        if self.background and self.thread is None and not self.closed:
            self._start()
        with self.condition:
            if self.thread is None:
                self.writing += 1
            else:
                self.jobs.append((trial_id, step, state, config, release))
                self.condition.notify_all()
        if self.thread is None:
            self._write(trial_id, step, state, config, release)

    def supersede(self, trial_id: int) -> Any:
        """Take back trial `trial_id`'s queued write, not yet started (reported failed: a newer checkpoint of the
        trial replaces it); returns its state, whose memory the newer copy may reuse, or None if there is none."""
        with self.condition:
            for job in self.jobs:
                if job[0] == trial_id:
                    self.jobs.remove(job)
                    self.done.append(Checkpoint(trial_id, job[1], None, "superseded: the trial's next checkpoint "
                                                "came before this one could be written"))
                    self.condition.notify_all()
                    return job[2]
        return None

    def fail(self, trial_id: int, step: int, error: str) -> None:
        """Report the save of trial `trial_id`'s step `step` as failed with `error` (its state could not be had)."""
        with self.condition:
            self.done.append(Checkpoint(trial_id, step, None, error))
            self.condition.notify_all()

    def _run(self) -> None:
        try:  # background work: where CPUs are short, the training thread goes first (Linux: a thread's own nice)
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WRITER_NICE)
        except (AttributeError, OSError):
            pass
        while True:
            with self.condition:
                self.condition.wait_for(lambda: self.jobs or self.closed)
                if not self.jobs:
                    return
                job = self.jobs.popleft()
                self.writing += 1
            self._write(*job)

    def _write(self, trial_id: int, step: int, state: Any, config: Any,
               release: Callable[[Any], None] | None) -> None:
        try:
            result = write_checkpoint(self.storage, trial_id, step, state, config)
        except Exception as exc:  # noqa: BLE001 (whatever the write raised goes to the engine; the trial goes on)
            error = str(exc) if isinstance(exc, StorageError) else f"{type(exc).__name__}: {exc}"
            result = Checkpoint(trial_id, step, None, error)
        if release is not None:
            release(state)
        with self.condition:
            self.done.append(result)
            self.writing -= 1
            self.condition.notify_all()

    def collect(self, trial_id: int | None = None, *, wait: bool = False) -> list[Checkpoint]:
        """The finished writes (of `trial_id` only, if given) not yet collected; with `wait`, first wait until no
        write is queued or going on."""
        with self.condition:
            if wait:
                self.condition.wait_for(lambda: not self.jobs and self.writing == 0)
            taken = [c for c in self.done if trial_id is None or c.trial_id == trial_id]
            self.done = [c for c in self.done if not (trial_id is None or c.trial_id == trial_id)]
        return taken

    def close(self) -> None:
        """Finish the queued writes and end the thread."""
        if self.thread is not None:
            with self.condition:
                self.closed = True
                self.condition.notify_all()
            self.thread.join()
            self.thread = None
