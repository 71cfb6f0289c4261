"""Synchronous data parallelism: one torch.distributed process group per gang, a fresh DDP wrapper per trial."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from nasplat.distributed.backend import Backend


def host_store(host: str, timeout_s: float) -> tuple[dist.TCPStore, str]:
    """Rank 0's side of the rendezvous: a TCPStore listening on `host` at a port the OS assigns, held by the store
    from the moment it is chosen (no window in which another process could take it). Returns the store, which
    rank 0 keeps for `join_group`, and its `host:port` for the other ranks."""
    store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=float(timeout_s)))
    return store, f"{host}:{store.port}"


def join_group(address: str, rank: int, world_size: int, device: torch.device, timeout_s: float,
               store: dist.Store | None = None) -> str:
    """Join the gang's default process group (gloo on CPU, NCCL on GPU) through rank 0's store at `address`
    (rank 0 passes the `store` it hosts); once per process, reused by every trial."""
    if dist.is_initialized():
        raise RuntimeError(f"this process already belongs to a process group (rank {dist.get_rank()} of "
                           f"{dist.get_world_size()}); a gang forms its group once, in `Gang.ready`")
    kind = "nccl" if device.type == "cuda" else "gloo"
    if kind == "nccl":
        torch.cuda.set_device(device)
    timeout = timedelta(seconds=float(timeout_s))
    if store is None:
        host, _, port = address.rpartition(":")
        store = dist.TCPStore(host, int(port), is_master=False, timeout=timeout)
    dist.init_process_group(kind, store=store, rank=rank, world_size=world_size, timeout=timeout)
    # A first collective, so that a broken rendezvous fails here and not in the first trial.
    probe = torch.ones(1, device=device)
    dist.all_reduce(probe)
    if int(probe.item()) != world_size:
        raise RuntimeError(f"process group check failed: allreduce of ones gave {probe.item()}, expected {world_size}")
    return kind


class _DDP(DistributedDataParallel):
    """DDP whose `state_dict` is the wrapped module's, so states move between gangs of any size unchanged."""

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:  # torch's overloads: a dict, or `destination`
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        return self.module.load_state_dict(state_dict, strict=strict, assign=assign)


class AllreduceBackend(Backend):
    """`prepare` wraps the model in DistributedDataParallel on the gang's process group; the optimizer is untouched.

    DDP's constructor broadcasts rank 0's parameters and buffers, so the ranks start equal whatever their seeds;
    gradients are averaged by DDP's bucketed allreduce during `backward`.
    """

    name = "allreduce"

    def prepare(self, model: Any, optimizer: Any) -> tuple[Any, Any]:
        if not dist.is_initialized():
            raise RuntimeError("the allreduce backend needs the gang's process group; call Gang.ready() first")
        device = torch.device(self.device)
        device_ids = [device.index] if device.type == "cuda" else None
        wrapped = _DDP(model, device_ids=device_ids,
                       find_unused_parameters=bool(self.options.get("find_unused_parameters", False)))
        return wrapped, optimizer
