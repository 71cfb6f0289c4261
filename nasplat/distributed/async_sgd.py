"""Asynchronous data parallelism, worker side: push gradients to the parameter servers, pull the weights back.

Each rank works at its own pace: `optimizer.step()` sends this rank's gradients (optionally top-k compressed with
error feedback) to every server holding a shard, and loads the weights each answers with. Servers are reached with
retries, so a server that Ray restarts from its snapshot costs a retried push, not the trial.
"""

from __future__ import annotations

import math
import time
from itertools import chain
from typing import Any

import numpy as np
import ray
import torch
from ray.exceptions import GetTimeoutError, RayActorError

from nasplat.distributed.backend import Backend
from nasplat.distributed.parameter_server import Generation, shard_parameters
from nasplat.trainer import hyperparameters


class AsyncOptimizer(torch.optim.Optimizer):
    """Stands in for the trainer's optimizer, over the same parameters and hyperparameters.

    `step()` pushes gradients and pulls weights (the servers run the trainer's optimizer class); the hyperparameters
    in `param_groups` travel with every push, so an lr changed in place or by a scheduler takes effect;
    `state_dict()` gathers the servers' optimizer state in the trainer's optimizer's own format.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, backend: AsyncBackend) -> None:
        groups = [{**hyperparameters(group), "params": list(group["params"])} for group in optimizer.param_groups]
        super().__init__(groups, dict(optimizer.defaults))
        self.optimizer_cls, self.backend = type(optimizer), backend
        self.pending: dict[int, Any] | None = None  # a loaded state, for the servers at the next `on_load`

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.backend.push_pull()
        return loss

    def state_dict(self) -> dict[str, Any]:
        return self.backend.gather_state()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved = state_dict["param_groups"]
        if [len(g["params"]) for g in saved] != [len(g["params"]) for g in self.param_groups]:
            raise ValueError(f"optimizer state has param groups of sizes {[len(g['params']) for g in saved]}; this "
                             f"optimizer's are {[len(g['params']) for g in self.param_groups]}")
        for group, old in zip(self.param_groups, saved):
            group.update(hyperparameters(old))
        position = {old: new for new, old in enumerate(chain.from_iterable(g["params"] for g in saved))}
        self.pending = {position[key]: {name: value.detach().cpu() if torch.is_tensor(value) else value
                                        for name, value in entry.items()}
                        for key, entry in state_dict["state"].items()}


class AsyncBackend(Backend):
    """Options: `num_servers` (parameters sharded across them), `max_staleness` (None: unbounded), `topk`
    (fraction of gradient entries sent, None: dense), `snapshot_every`, `timeout_s`."""

    name = "async"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.servers: list[Any] = []
        self.optimizer: AsyncOptimizer | None = None
        self.sub = self.clock = self.retries = 0

    def attach(self, servers: list[Any]) -> None:
        self.servers = list(servers)

    @property
    def prepared(self) -> AsyncOptimizer:
        """The optimizer `prepare` made for this trial; an error before the trainer called `prepare`."""
        if self.optimizer is None:
            raise RuntimeError("the async backend has no optimizer yet; the trainer calls ctx.prepare(model, "
                               "optimizer) in setup")
        return self.optimizer

    def begin(self, epoch: int, *, new_trial: bool) -> None:
        super().begin(epoch, new_trial=new_trial)
        self.sub = 0
        if new_trial:
            self.optimizer = None

    @property
    def generation(self) -> Generation:
        """The (epoch, sub-generation) the servers must run for this rank's pushes."""
        return self.epoch, self.sub

    def prepare(self, model: Any, optimizer: Any) -> tuple[Any, Any]:
        if not self.servers:
            raise RuntimeError("the async backend has no parameter servers; call Gang.ready() first")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ValueError(f"the async backend runs the trainer's optimizer on the servers, so `prepare` needs a "
                             f"torch.optim.Optimizer; got optimizer={optimizer!r}")
        self.optimizer = AsyncOptimizer(optimizer, self)
        groups = self.optimizer.param_groups
        self.params = [p for group in groups for p in group["params"]]
        self.group_of = [g for g, group in enumerate(groups) for _ in group["params"]]
        shards = shard_parameters([p.numel() for p in self.params], len(self.servers))
        self.shards = [(server, indices) for server, indices in zip(self.servers, shards) if indices]
        self.residuals = [torch.zeros(sum(self.params[i].numel() for i in indices)) for _, indices in self.shards]
        self.reinitialise(None)
        return model, self.optimizer

    def on_load(self) -> None:
        if self.optimizer is not None:
            self.reinitialise(self.optimizer.pending)
            self.optimizer.pending = None

    def reinitialise(self, state: dict[int, Any] | None) -> None:
        """A new generation: rank 0 sends its parameters (and `state`) to the servers; every rank pulls them."""
        self.sub, self.clock = self.sub + 1, 0
        if self.rank == 0:
            hparams = [hyperparameters(group) for group in self.prepared.param_groups]
            calls = []
            for server, indices in self.shards:
                spec = {"generation": self.generation, "world_size": self.world_size, "indices": indices,
                        "groups": [self.group_of[i] for i in indices],
                        "shapes": [tuple(self.params[i].shape) for i in indices],
                        "optimizer_cls": self.prepared.optimizer_cls, "defaults": self.prepared.defaults,
                        "hparams": hparams, "max_staleness": self.options["max_staleness"],
                        "snapshot_every": self.options["snapshot_every"]}
                weights = torch.cat([self.params[i].detach().reshape(-1) for i in indices]).cpu().numpy()
                part = {i: state[i] for i in indices if i in state} if state else None
                calls.append((server, "init", (spec, weights, part)))
            self._gather(calls)
        flats = self._gather([(server, "pull", (self.generation,)) for server, _ in self.shards])
        self._assign(flats)

    @torch.no_grad()
    def push_pull(self) -> None:
        """One asynchronous update: push this rank's gradients, load the weights the servers answer with."""
        self.clock += 1
        hparams = [hyperparameters(group) for group in self.prepared.param_groups]
        calls = []
        for shard, (server, indices) in enumerate(self.shards):
            grad = torch.cat([(self.params[i].grad if self.params[i].grad is not None
                               else torch.zeros_like(self.params[i])).reshape(-1) for i in indices])
            grad = grad.to("cpu", torch.float32)
            payload = self._compress(shard, grad) if self.options["topk"] else grad.numpy()
            calls.append((server, "push", (self.generation, self.rank, self.clock, payload, hparams)))
        self._assign(self._gather(calls))

    def _compress(self, shard: int, grad: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """Top-k entries of gradient + carried-over error; what is not sent is carried to the next push."""
        corrected = grad + self.residuals[shard]
        k = max(1, math.ceil(self.options["topk"] * corrected.numel()))
        index = corrected.abs().topk(k, sorted=False).indices
        values = corrected[index]
        corrected[index] = 0.0
        self.residuals[shard] = corrected
        return index.numpy(), values.numpy()

    @torch.no_grad()
    def _assign(self, flats: list[np.ndarray]) -> None:
        for (_, indices), flat in zip(self.shards, flats):
            chunks = torch.split(torch.tensor(flat), [self.params[i].numel() for i in indices])
            for i, chunk in zip(indices, chunks):
                self.params[i].copy_(chunk.view_as(self.params[i]))

    def gather_state(self) -> dict[str, Any]:
        """The servers' optimizer state as the trainer's optimizer's `state_dict()` would have it."""
        state: dict[int, Any] = {}
        for part in self._gather([(server, "state", ()) for server, _ in self.shards]):
            state.update(part)
        groups = [{**hyperparameters(group), "params": [i for i, g in enumerate(self.group_of) if g == index]}
                  for index, group in enumerate(self.prepared.param_groups)]
        return {"state": dict(sorted(state.items())), "param_groups": groups}

    def end_step(self) -> dict[str, float]:
        if self.optimizer is None:
            return {}
        self._gather([(server, "rest", (self.generation, self.rank)) for server, _ in self.shards])
        return {"ps_retries": float(self.retries)}

    def _gather(self, calls: list[tuple[Any, str, tuple]]) -> list[Any]:
        """Call every (server, method, args) at once; a call to a server that died is repeated once Ray has
        restarted it from its snapshot, until `timeout_s` has passed."""
        timeout = float(self.options["timeout_s"])
        deadline = time.monotonic() + timeout
        refs = [getattr(server, method).remote(*args) for server, method, args in calls]
        results = []
        for (server, method, args), ref in zip(calls, refs):
            while True:
                try:
                    results.append(ray.get(ref, timeout=max(deadline - time.monotonic(), 0.01)))
                    break
                except RayActorError as error:
                    if time.monotonic() >= deadline:
                        raise RuntimeError(f"parameter server call {method!r} kept failing for timeout_s={timeout}: "
                                           f"{error}") from error
                    self.retries += 1
                    time.sleep(0.05)
                    ref = getattr(server, method).remote(*args)
                except GetTimeoutError as error:
                    raise RuntimeError(f"parameter server call {method!r} did not answer within timeout_s={timeout}"
                                       ) from error
        return results
