"""Walks over nested values: trainer states (dicts, lists and tuples of tensors) and configs (nested dicts)."""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from typing import Any


def map_leaves(value: Any, other: Any, leaf: Callable[[Any, Any], Any]) -> Any:
    """`value` rebuilt with `leaf(item, counterpart)` at every leaf (anything but a dict, list or plain tuple);
    `other` is walked alongside where it has the same structure, and the counterpart is None elsewhere."""
    if isinstance(value, dict):
        others = other if isinstance(other, dict) else {}
        return type(value)((key, map_leaves(item, others.get(key), leaf)) for key, item in value.items())
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        counterparts = other if isinstance(other, (list, tuple)) and len(other) == len(value) else [None] * len(value)
        items = [map_leaves(item, counterpart, leaf) for item, counterpart in zip(value, counterparts, strict=True)]
        return items if isinstance(value, list) else tuple(items)
    return leaf(value, other)


def copy_state(state: Any, into: Any = None) -> Any:
    """`state` with every torch tensor replaced by a detached CPU copy (other leaves deep-copied): safe from the
    trainer's next step. Where `into` (an earlier copy nobody uses any more, walked alongside) has a tensor of the
    same shape and dtype, the copy goes into it: memory already paged in copies several times faster."""
    torch = sys.modules.get("torch")
    if torch is None:  # a trainer that never imported torch has no tensors
        return copy.deepcopy(state)

    def leaf(value: Any, target: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return copy.deepcopy(value)
        if (isinstance(target, torch.Tensor) and target.shape == value.shape and target.dtype == value.dtype
                and target.device.type == "cpu" and not value.is_sparse):
            with torch.no_grad():
                return target.copy_(value.detach())
        return value.detach().to("cpu", copy=True)

    return map_leaves(state, into, leaf)


def flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    """`{"depth": {"n": 2}}` -> `{prefix + "depth.n": 2}`: one key per decision, nested dicts joined by dots. A
    value that is not a dict maps to itself under `prefix` without its trailing dot (or `"value"`)."""
    if not isinstance(config, dict):
        return {prefix.rstrip(".") or "value": config}
    out: dict[str, Any] = {}
    for key, value in config.items():
        out.update(flatten(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out
