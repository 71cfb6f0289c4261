"""Decentralised training: every `period` optimizer steps each rank averages its parameters with its ring neighbours.

The averaging is point-to-point only (`batch_isend_irecv` with the two ring neighbours, one when there are two
ranks) and the mixing weights are uniform over the rank and its distinct neighbours: a symmetric, doubly
stochastic matrix, so the ranks' mean is preserved and their spread shrinks geometrically when nothing trains.
No global collective touches the parameters; `consensus_distance`, reported after every trainer step, is a
measurement (one allreduce of the parameters and one of a scalar) and changes nothing.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from nasplat.distributed.backend import Backend


def ring_neighbours(rank: int, world_size: int) -> list[int]:
    """The distinct ranks beside `rank` on the ring 0, 1, ..., world_size - 1, 0."""
    return sorted({(rank - 1) % world_size, (rank + 1) % world_size} - {rank})


class GossipBackend(Backend):
    """`prepare` keeps the model and the trainer's own optimizer; a step post-hook gossips every `period` steps."""

    name = "gossip"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.period = int(self.options["period"])
        self.neighbours = ring_neighbours(self.rank, self.world_size)
        self.params: list[torch.Tensor] = []
        self.hook: Any = None
        self.steps = self.rounds = 0
        self.start_distance: float | None = None

    def begin(self, epoch: int, *, new_trial: bool) -> None:
        super().begin(epoch, new_trial=new_trial)
        if new_trial and self.hook is not None:
            self.hook.remove()
            self.hook, self.params = None, []

    def prepare(self, model: Any, optimizer: Any) -> tuple[Any, Any]:
        if not dist.is_initialized():
            raise RuntimeError("the gossip backend needs the gang's process group; call Gang.ready() first")
        if optimizer is None or not hasattr(optimizer, "register_step_post_hook"):
            raise ValueError(f"the gossip backend averages after optimizer steps, so `prepare` needs a "
                             f"torch.optim.Optimizer; got optimizer={optimizer!r}")
        if self.hook is not None:  # a trainer that prepares again (a rebuild) gossips for its newest optimizer only
            self.hook.remove()
        self.params = [p for p in model.parameters()]
        self.hook = optimizer.register_step_post_hook(self._after_step)
        self.steps = self.rounds = 0
        self.start_distance = self.consensus_distance()
        return model, optimizer

    def _after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.steps += 1
        if self.steps % self.period == 0:
            self.average()

    @torch.no_grad()
    def average(self) -> None:
        """Replace this rank's parameters by the mean of its own and its ring neighbours' (one gossip round)."""
        flat = parameters_to_vector(self.params).detach()
        received = [torch.empty_like(flat) for _ in self.neighbours]
        ops = [dist.P2POp(dist.isend, flat, peer) for peer in self.neighbours]
        ops += [dist.P2POp(dist.irecv, buffer, peer) for buffer, peer in zip(received, self.neighbours)]
        for request in dist.batch_isend_irecv(ops):
            request.wait()
        total = flat.clone()
        for buffer in received:
            total += buffer
        vector_to_parameters(total / (1 + len(received)), self.params)
        self.rounds += 1

    @torch.no_grad()
    def consensus_distance(self) -> float:
        """Mean over ranks of ||w_i - w_mean|| (a reporting collective: every rank must call it)."""
        flat = parameters_to_vector(self.params).detach().double()
        mean = flat.clone()
        dist.all_reduce(mean)
        mean /= self.world_size
        distance = torch.linalg.vector_norm(flat - mean).reshape(1)
        dist.all_reduce(distance)
        return distance.item() / self.world_size

    def end_step(self) -> dict[str, float]:
        metrics = {"consensus_distance": self.consensus_distance(), "gossip_rounds": float(self.rounds)}
        if self.start_distance is not None:  # once per trial: the spread before the first gossip round
            metrics["consensus_distance_start"] = self.start_distance
            self.start_distance = None
        return metrics
