"""Trainer states on their way through Ray's object store: torch tensors travel as numpy arrays.

Ray writes numpy arrays into the object store out of band and reads them back without a copy, where a pickled
torch tensor is copied several times: for a 10 M-parameter model with momentum, an exploit's transfer drops from
about 250 ms to about 50 ms here. The arrays a receiver reads are read-only views of shared memory, so `unpack`
copies each one once: into the receiver's own tensor at the same place in its current state where one of the same
shape and dtype exists (memory already paged in, and `load_state_dict` then copies nothing), else into a fresh one.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass
from typing import Any

from nasplat.core.trees import map_leaves


@dataclass
class PackedTensor:
    """A torch tensor as a numpy array plus the device it came from."""

    array: Any
    device: str


def pack(state: Any) -> Any:
    """`state` with every CPU/GPU tensor whose dtype numpy knows replaced by a `PackedTensor`."""
    torch = sys.modules.get("torch")
    if torch is None:  # a trainer that never imported torch has no tensors
        return state
    return map_leaves(state, None, lambda value, _: _pack_tensor(torch, value))


def unpack(state: Any, into: Any = None) -> Any:
    """The inverse of `pack`: writable tensors the caller owns. A tensor of `into` (the receiver's current state,
    walked alongside `state`) with the same shape and dtype is overwritten and reused, once at most."""
    torch = sys.modules.get("torch")
    if torch is None:
        return state
    reused: set[int] = set()

    def leaf(value: Any, target: Any) -> Any:
        if not isinstance(value, PackedTensor):
            return value
        with warnings.catch_warnings():  # torch warns that the view is read-only; it is only read from
            warnings.simplefilter("ignore", UserWarning)
            source = torch.from_numpy(value.array)
        if (isinstance(target, torch.Tensor) and target.shape == source.shape and target.dtype == source.dtype
                and not target.is_sparse and target.data_ptr() not in reused):
            reused.add(target.data_ptr())
            with torch.no_grad():
                return target.copy_(source)
        return source.to(value.device, copy=True)

    return map_leaves(state, into, leaf)


def _pack_tensor(torch: Any, value: Any) -> Any:
    if not isinstance(value, torch.Tensor) or value.is_sparse:
        return value
    try:
        return PackedTensor(value.detach().cpu().numpy(), str(value.device))
    except TypeError:  # bfloat16 and other dtypes numpy lacks: pickled as they are
        return value
