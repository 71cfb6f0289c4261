"""A trainer state as bytes and back: written with `torch.save`, read as data with `torch.load(weights_only=True)`
(tensors, numpy arrays, numbers, strings and containers of them), so a state from a folder of elsewhere runs no
code when loaded; any other Python object in it is refused in one line unless the user allows pickles."""

from __future__ import annotations

import io
import pickle
import re
from typing import Any

from nasplat.storage.files import PickleRefused


def load_state_bytes(payload: bytes, source: str, *, allow_pickle: bool = False) -> Any:
    """A `torch.save`d state from `payload` (read from `source`), as data unless `allow_pickle` (see
    `load_checkpoint`)."""
    import torch

    if allow_pickle:
        return torch.load(io.BytesIO(payload), map_location="cpu", weights_only=False)
    try:
        with torch.serialization.safe_globals(_numpy_globals()):
            return torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        named = re.search(r"GLOBAL ([\w.]+)", str(exc))
        found = f"it names {named.group(1)}" if named else last_words(str(exc))
        raise PickleRefused(f"{source} holds Python objects other than tensors, arrays, numbers, strings and "
                            f"containers, which only a pickle that runs code can load; refusing it ({found}). If "
                            f"you trust whoever made it, pass --trust-pickle (Python: allow_pickle=True)") from None


def last_words(text: str) -> str:
    """The last non-empty line of `text`, at most 200 characters."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return (lines[-1] if lines else "")[:200]


def _numpy_globals() -> list[Any]:
    """The numpy types a state may hold (arrays, their dtypes, scalars): rebuilding them runs no user code."""
    import numpy as np

    try:
        from numpy._core.multiarray import _reconstruct, scalar
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct, scalar  # type: ignore[no-redef]
    dtypes = [type(np.dtype(code)) for code in "?bhilqBHILQefdgFDGSUV"]
    return [_reconstruct, scalar, np.ndarray, np.dtype, *dtypes]
