"""Backends, their options, and the WorkerContext a rank of a multi-worker gang hands its trainer."""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from nasplat.trainer import WorkerContext

if TYPE_CHECKING:
    import torch

BACKENDS = ("allreduce", "async", "gossip")
GROUP_BACKENDS = ("allreduce", "gossip")  # those that need a torch.distributed process group

# Every option each backend accepts, with its default. `timeout_s`: how long a collective (allreduce, gossip) or a
# parameter-server call, including the wait for a restarted server (async), may block before the trial fails.
OPTION_DEFAULTS: dict[str, dict[str, Any]] = {
    "allreduce": {"timeout_s": 300.0, "find_unused_parameters": False},
    "async": {"num_servers": 1, "max_staleness": None, "topk": None, "snapshot_every": 20, "timeout_s": 300.0},
    "gossip": {"period": 1, "timeout_s": 300.0},
}


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; allowed: {list(BACKENDS)}")
    return backend


def check_options(backend: str, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`options` checked against what `backend` accepts and completed with the defaults."""
    allowed = OPTION_DEFAULTS[check_backend(backend)]
    options = dict(options or {})
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"unknown backend_options {unknown} for backend {backend!r}; allowed: {sorted(allowed)}")
    merged = {**allowed, **options}
    for key in ("num_servers", "snapshot_every", "period"):
        if key in merged:
            _check_int(key, merged[key], minimum=1)
    if merged.get("max_staleness") is not None:
        _check_int("max_staleness", merged["max_staleness"], minimum=0)
    topk = merged.get("topk")
    if topk is not None and (isinstance(topk, bool) or not isinstance(topk, numbers.Real) or not 0 < topk <= 1):
        raise ValueError(f"`topk` must be None or the fraction of gradient entries kept, in (0, 1], got {topk=!r}")
    timeout = merged["timeout_s"]
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or timeout <= 0:
        raise ValueError(f"`timeout_s` must be a number of seconds > 0, got {timeout=!r}")
    return merged


def _check_int(key: str, value: Any, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"`{key}` must be an integer >= {minimum}, got {key}={value!r}")


def rank_seed(seed: int, rank: int) -> int:
    """The seed of `rank`: the trial's seed for rank 0 (so one worker matches the local executor), an
    independent stream for every other rank."""
    if rank == 0:
        return int(seed)
    return int(np.random.SeedSequence([int(seed) % 2**63, rank]).generate_state(1)[0])


def worker_device(kind: str) -> torch.device:
    """The device of a rank: `cuda` is the first GPU Ray made visible to the actor."""
    import torch

    if kind == "cpu":
        return torch.device("cpu")
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("a gang with gpus_per_worker > 0 needs CUDA, but torch.cuda.is_available() is False "
                               f"in this worker (torch {torch.__version__})")
        return torch.device("cuda", 0)
    raise ValueError(f"unknown device kind {kind!r}; allowed: ['cpu', 'cuda']")


class Backend:
    """How a rank takes part in data-parallel training. This base is the single-worker case: it changes nothing.

    The Worker calls `begin` before each launch/exploit, the trainer calls `prepare` (through the context) during
    `setup`, the Worker calls `on_load` after loading a state and `end_step` after every trainer step (every
    rank at once, so backends may run collectives there); `end_step` returns metrics to merge into the step's.
    """

    name = "local"

    def __init__(self, rank: int = 0, world_size: int = 1, device: torch.device | str = "cpu",
                 options: Mapping[str, Any] | None = None) -> None:
        self.rank, self.world_size = rank, world_size
        self.device = device
        self.options = dict(options or {})
        self.epoch = 0

    def begin(self, epoch: int, *, new_trial: bool) -> None:
        """A launch (`new_trial`) or an exploit numbered `epoch` by the gang starts on every rank."""
        self.epoch = epoch

    def prepare(self, model: Any, optimizer: Any) -> tuple[Any, Any]:
        return model, optimizer

    def on_load(self) -> None:
        """The trainer's state was just replaced (the same state on every rank)."""

    def end_step(self) -> dict[str, float]:
        return {}


def make_backend(backend: str, rank: int, world_size: int, device: torch.device | str,
                 options: Mapping[str, Any] | None) -> Backend:
    """The backend object of one rank; one worker always gets the no-op `Backend`."""
    options = check_options(backend, options)
    if world_size == 1:
        return Backend(rank, world_size, device, options)
    if backend == "allreduce":
        from nasplat.distributed.allreduce import AllreduceBackend
        return AllreduceBackend(rank, world_size, device, options)
    if backend == "async":
        from nasplat.distributed.async_sgd import AsyncBackend
        return AsyncBackend(rank, world_size, device, options)
    from nasplat.distributed.gossip import GossipBackend
    return GossipBackend(rank, world_size, device, options)


@dataclass
class DistributedContext(WorkerContext):
    """A WorkerContext whose `prepare` wires the gang's backend into the trainer's model and optimizer."""

    backend: str = "allreduce"
    impl: Backend = field(default_factory=Backend, repr=False, compare=False)

    def prepare(self, model: Any, optimizer: Any = None) -> tuple[Any, Any]:
        return self.impl.prepare(model, optimizer)
