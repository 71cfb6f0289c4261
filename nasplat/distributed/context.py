"""Backends, their options, and the WorkerContext a rank of a multi-worker gang hands its trainer."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from nasplat.core.checks import check_int, check_real, is_real, received
from nasplat.core.registry import Registry
from nasplat.distributed.backend import Backend
from nasplat.trainer import WorkerContext

if TYPE_CHECKING:
    import torch

BACKENDS: Registry[type[Backend]] = Registry("backend", {
    "allreduce": "nasplat.distributed.allreduce:AllreduceBackend",  # synchronous allreduce of gradients (DDP)
    "async": "nasplat.distributed.async_sgd:AsyncBackend",  # asynchronous SGD through parameter servers
    "gossip": "nasplat.distributed.gossip:GossipBackend",  # decentralized averaging with ring neighbours
})
GROUP_BACKENDS = ("allreduce", "gossip")  # those that need a torch.distributed process group

# Every option each backend accepts, with its default. `timeout_s`: how long a collective (allreduce, gossip) or a
# parameter-server call, including the wait for a restarted server (async), may block before the trial fails.
OPTION_DEFAULTS: dict[str, dict[str, Any]] = {
    "allreduce": {"timeout_s": 300.0, "find_unused_parameters": False},
    "async": {"num_servers": 1, "max_staleness": None, "topk": None, "snapshot_every": 20, "timeout_s": 300.0},
    "gossip": {"period": 1, "timeout_s": 300.0},
}


def check_backend(backend: str) -> str:
    """`backend`, if it names one of `BACKENDS`."""
    return BACKENDS.check(backend)


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
            check_int(key, merged[key], minimum=1)
    if merged.get("max_staleness") is not None:  # None: no bound
        check_int("max_staleness", merged["max_staleness"], minimum=0)
    topk = merged.get("topk")
    if topk is not None and not (is_real(topk) and 0 < topk <= 1):
        raise ValueError(f"`topk` must be None or the fraction of gradient entries kept, in (0, 1], "
                         f"{received('topk', topk)}")
    check_real("timeout_s", merged["timeout_s"], minimum=0, strict=True, finite=False, note="seconds")
    return merged


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


def make_backend(backend: str, rank: int, world_size: int, device: torch.device | str,
                 options: Mapping[str, Any] | None) -> Backend:
    """The backend object of one rank; one worker always gets the no-op `Backend`."""
    options = check_options(backend, options)
    if world_size == 1:
        return Backend(rank, world_size, device, options)
    return BACKENDS[backend](rank, world_size, device, options)


@dataclass
class DistributedContext(WorkerContext):
    """A WorkerContext whose `prepare` wires the gang's backend into the trainer's model and optimizer."""

    backend: str = "allreduce"
    impl: Backend = field(default_factory=Backend, repr=False, compare=False)

    def prepare(self, model: Any, optimizer: Any = None) -> tuple[Any, Any]:
        return self.impl.prepare(model, optimizer)
