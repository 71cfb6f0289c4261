"""A supernet's weights held once for a whole search: `SharedWeights` (read-only numpy arrays).

Where it goes with the trainer class it stays one copy: forked workers (`processes`, and `local`) see the driver's
pages (copy-on-write, nothing copied while nobody writes), and on `ray` the first time it is pickled in a driver with
Ray running it is put in the object store once (`ray.put` of the dict of arrays) and travels as that one
`ObjectRef`; a Ray worker reads zero-copy, read-only views of the store's memory.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from nasplat.storage.checkpoints import load_checkpoint


def _array(value: Any) -> np.ndarray:
    array = np.ascontiguousarray(value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value)
    array.setflags(write=False)
    return array


class SharedWeights:
    """A supernet's weights, held once for a whole search (see the module's docstring).

    `state`: a `state_dict` (tensors or arrays), or a trainer state holding one under `"model"`. `puts` counts the
    `ray.put`s this object made (at most one); `ref` is the `ObjectRef` once it has one."""

    def __init__(self, state: Mapping[str, Any], source: str | None = None) -> None:
        if "model" in state and isinstance(state["model"], Mapping):
            state = state["model"]
        self._arrays: dict[str, np.ndarray] | None = {key: _array(value) for key, value in state.items()}
        self.ref: Any = None
        self.puts = 0
        self.source = source  # the checkpoint it was loaded from, to load again where the object is gone

    @classmethod
    def load(cls, source: Any, trial_id: int | None = None) -> SharedWeights:
        """From a supernet trial's checkpoint (a path or URI: `load_checkpoint`), or from an experiment's result
        (an `nasplat.ExperimentResult`, or anything with its `load_state(trial_id)`: the best trial by default)."""
        if isinstance(source, (str, os.PathLike)):
            return cls(load_checkpoint(os.fspath(source)), os.fspath(source))
        return cls(source.load_state(trial_id))

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        """The read-only arrays: the driver's own, or (in a Ray worker) views of the object store, fetched once."""
        if self._arrays is None:
            import ray

            try:
                self._arrays = ray.get(self.ref)
            except Exception:  # the Ray session that held it ended (a resumed search)
                if self.source is None:
                    raise
                self._arrays = SharedWeights.load(self.source)._arrays
        assert self._arrays is not None
        return self._arrays

    def tensors(self) -> dict[str, torch.Tensor]:
        """Tensors on the arrays' memory (`torch.from_numpy`: no copy). They must not be written."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*not writable.*")
            return {key: torch.from_numpy(array) for key, array in self.arrays.items()}

    def share(self) -> Any:
        """Put the arrays in Ray's object store (once) and return the `ObjectRef`."""
        if self.ref is None:
            import ray

            self.ref, self.puts = ray.put(self.arrays), self.puts + 1
        return self.ref

    def __reduce__(self) -> Any:
        """Pickled by reference to the object store where this process runs Ray (shipping to Ray workers), else by
        value. The object lives as long as its Ray session: weights loaded from a checkpoint (`load`) are loaded
        from it again where the object is gone (a search resumed in another session); others must be given again."""
        if self.ref is None:
            ray = sys.modules.get("ray")  # Ray runs only where it was imported: no import here
            if ray is None or not ray.is_initialized():
                return (SharedWeights, (self.arrays, self.source))
            self.share()
        return (_from_ref, (self.ref, self.source))


def _from_ref(ref: Any, source: str | None = None) -> SharedWeights:
    """A worker's handle on the object `ref`: its arrays are fetched (zero-copy) when first used."""
    weights = SharedWeights.__new__(SharedWeights)
    weights._arrays, weights.ref, weights.puts, weights.source = None, ref, 0, source
    return weights
