"""Parameter-server actors for the `async` backend: each holds a shard of the trial's parameters and applies the
gradients workers push with the trial's own optimizer class and hyperparameters.

A server is an async Ray actor: a push is applied at once and answered with the shard's new weights; with
`max_staleness` set, the answer to a worker that leads the slowest working rank by more than that many pushes
waits until the slowest catches up (stale synchronous parallel; a rank between trainer steps does not hold others
back). Every `snapshot_every` updates, and whenever a trial (re)initialises it, the server writes a snapshot into
its folder (in the experiment's checkpoint storage, or a scratch folder on its node); Ray restarts a dead server
with the same arguments and `__init__` resumes from that snapshot, so the workers retry their push and the trial
goes on (losing at most the updates since the snapshot). A snapshot is data (`torch.save`, read back with
`weights_only`): the optimizer is named by its dotted path, so one whose class cannot be imported by name (defined
in a script's `__main__`) is not restored and the trial's rank 0 initialises the server again.
"""

from __future__ import annotations

import asyncio
import io
import os
import socket
from typing import Any

import numpy as np
import torch

from nasplat.storage import Storage
from nasplat.storage.states import load_state_bytes
from nasplat.trainer import resolve

Generation = tuple[int, int]  # (gang epoch: one per launch/exploit, re-initialisation within it)


def shard_parameters(sizes: list[int], num_servers: int) -> list[list[int]]:
    """Parameter indices per server, balancing element counts (largest first onto the least loaded server)."""
    loads, shards = [0] * num_servers, [list[int]() for _ in range(num_servers)]
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        target = min(range(num_servers), key=lambda s: (loads[s], s))
        shards[target].append(index)
        loads[target] += sizes[index]
    return [sorted(shard) for shard in shards]


def densify(grad: Any, numel: int) -> torch.Tensor:
    """A pushed gradient, dense: either a flat array or a top-k pair (indices, values)."""
    if isinstance(grad, tuple):
        indices, values = grad
        dense = torch.zeros(numel, dtype=torch.float32)
        dense[torch.tensor(indices)] = torch.tensor(values)
        return dense
    return torch.tensor(grad)  # a copy: arrays from the object store are read-only


class ParameterServer:
    """One shard of a trial's parameters, reused by the gang's later trials (each `init` starts afresh).

    `spec` (from the worker of rank 0): generation, world_size, indices (global parameter indices, ascending,
    so group-major like the trainer's optimizer), groups and shapes of those parameters, optimizer_cls, defaults,
    hparams (per param group), max_staleness, snapshot_every.
    """

    def __init__(self, index: int, folder: str) -> None:
        """Server `index` of a gang, snapshotting to `folder` (a path or URI) as `shard-<index>.pt`."""
        self.index, self.folder, self.name = index, Storage(folder), f"shard-{index}.pt"
        self.spec: dict[str, Any] = {"generation": (-1, -1)}
        self.params: list[torch.Tensor] = []
        self.clocks: list[int] = []
        self.active: set[int] = set()
        self.updates, self.restored = 0, False
        self.condition = asyncio.Condition()
        if self.folder.exists(self.name):
            self._restore(load_state_bytes(self.folder.read(self.name), f"{folder}/{self.name}"))

    def _restore(self, snapshot: dict[str, Any]) -> None:
        """Take up `snapshot` (see `snapshot`), unless its optimizer class cannot be imported by its name."""
        try:
            optimizer_cls = resolve(snapshot["spec"]["optimizer_cls"], what="the snapshot's optimizer")
        except ValueError:
            return
        self._build({**snapshot["spec"], "optimizer_cls": optimizer_cls}, snapshot["weights"])
        self.optimizer.load_state_dict(snapshot["optimizer"])
        self.clocks, self.updates, self.restored = snapshot["clocks"], snapshot["updates"], True

    @property
    def generation(self) -> Generation:
        """The (epoch, sub-generation) of the trial state the server holds."""
        return tuple(self.spec["generation"])

    def info(self) -> dict[str, Any]:
        """Where the server runs, its generation, how many updates it applied, and whether it restored a snapshot."""
        return {"node": socket.gethostname(), "pid": os.getpid(), "generation": self.generation,
                "updates": self.updates, "restored": self.restored}

    async def init(self, spec: dict[str, Any], weights: np.ndarray, state: dict[int, Any] | None) -> None:
        """Start `spec["generation"]` from flat `weights` and optimizer `state` (keyed by global index, or None)."""
        self._build(spec, weights)
        if state:
            position = {i: k for k, i in enumerate(spec["indices"])}
            local = self.optimizer.state_dict()
            local["state"] = {position[i]: value for i, value in state.items() if i in position}
            self.optimizer.load_state_dict(local)
        self.clocks, self.updates, self.active = [0] * spec["world_size"], 0, set()
        self.snapshot()
        async with self.condition:
            self.condition.notify_all()

    def _build(self, spec: dict[str, Any], weights: np.ndarray) -> None:
        self.spec, self.active = dict(spec), set()
        self.sizes = [int(np.prod(shape)) for shape in spec["shapes"]]
        flat = torch.tensor(np.asarray(weights), dtype=torch.float32)  # a copy: object-store arrays are read-only
        self.params = [chunk.reshape(shape).clone().requires_grad_()
                       for chunk, shape in zip(torch.split(flat, self.sizes), spec["shapes"])]
        groups = [{**hparams, "params": [p for p, g in zip(self.params, spec["groups"]) if g == group]}
                  for group, hparams in enumerate(spec["hparams"])]
        self.optimizer = spec["optimizer_cls"](groups, **spec["defaults"])

    def weights(self) -> np.ndarray:
        """The server's shard of the parameters, flat."""
        with torch.no_grad():
            return torch.cat([p.reshape(-1) for p in self.params]).numpy()

    async def _reach(self, sent: Generation) -> None:
        """Wait until rank 0 has initialised generation `sent`; a push from an older one is an error."""
        generation: Generation = (sent[0], sent[1])  # a tuple whatever sequence it came as: compared with tuples
        async with self.condition:
            await self.condition.wait_for(lambda: self.generation >= generation)
        if self.generation != generation:
            raise RuntimeError(f"parameter server {self.index} runs generation {self.generation}; a worker pushed "
                               f"for the older generation {generation} (a trial that was already replaced)")

    async def pull(self, generation: Generation) -> np.ndarray:
        """The shard's weights, once `generation` is initialised."""
        await self._reach(generation)
        return self.weights()

    async def push(self, generation: Generation, rank: int, clock: int, grad: Any,
                   hparams: list[dict[str, Any]]) -> np.ndarray:
        """Apply `rank`'s gradient (its `clock`-th push), then answer with the new weights once the staleness
        bound lets `rank` go on."""
        await self._reach(generation)
        dense = densify(grad, sum(self.sizes))
        for param, chunk in zip(self.params, torch.split(dense, self.sizes)):
            param.grad = chunk.reshape(param.shape)
        for group, values in zip(self.optimizer.param_groups, hparams):  # the trainer may change lr between steps
            group.update(values)
        self.optimizer.step()
        self.updates += 1
        self.clocks[rank] = max(self.clocks[rank], clock)
        self.active.add(rank)
        if self.updates % self.spec["snapshot_every"] == 0:
            self.snapshot()
        async with self.condition:
            self.condition.notify_all()
            bound = self.spec["max_staleness"]
            if bound is not None:
                await self.condition.wait_for(lambda: self.generation != generation or all(
                    self.clocks[other] >= clock - bound for other in self.active if other != rank))
        if self.generation != generation:
            raise RuntimeError(f"parameter server {self.index}: generation {generation} was replaced by "
                               f"{self.generation} while rank {rank} waited")
        return self.weights()

    async def rest(self, generation: Generation, rank: int) -> None:
        """`rank` finished a trainer step: until it pushes again it holds nobody back."""
        async with self.condition:
            if self.generation == tuple(generation):
                self.active.discard(rank)
                self.condition.notify_all()

    def state(self) -> dict[int, Any]:
        """The optimizer state, keyed by global parameter index."""
        local = self.optimizer.state_dict()["state"]
        return {self.spec["indices"][k]: value for k, value in local.items()}

    def snapshot(self) -> None:
        """Write the shard, optimizer state and clocks to the folder, atomically."""
        cls = self.spec["optimizer_cls"]
        spec = {**self.spec, "optimizer_cls": f"{cls.__module__}:{cls.__qualname__}"}
        snapshot = {"spec": spec, "weights": self.weights(), "optimizer": self.optimizer.state_dict(),
                    "clocks": list(self.clocks), "updates": self.updates}
        buffer = io.BytesIO()
        torch.save(snapshot, buffer)
        self.folder.write(self.name, buffer.getvalue())

    def close(self) -> None:
        """Remove the snapshot (the gang is going away), and the gang's folder once its last server has closed."""
        self.folder.delete(self.name)
        if not self.folder.list():
            self.folder.delete("")
