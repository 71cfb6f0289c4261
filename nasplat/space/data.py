"""A search space as plain JSON data, and back: what an experiment folder stores as `space.json`, so that the
commands that read a folder (`report`, `serve`, `status --importance`) rebuild its space without running code.

The form, one node per value of the space:
- a space: `{"space": {name: node, ...}}`, with `"forbidden": [rule names]` when it has rules (the rules are
  code, so only their names are kept: a space read back forbids nothing);
- `Int(low, high, log=, bins=)`: `{"int": [low, high], "log": bool, "bins": n}`; `Float` likewise with `"float"`;
- `Choice(options)`: `{"choice": [node, ...]}`;
- a constant (a string, number, boolean, None, or a list of them): `{"value": constant}`.
A space holding anything else (a domain class of the user's, an object as a choice's option) has no data form.
"""

from __future__ import annotations

import json
import math
from typing import Any

from nasplat.core.checks import is_int, is_real
from nasplat.space.choice import Choice
from nasplat.space.domains import Float, Int
from nasplat.space.space import Space

SPACE_DATA = "$space"
"""The key of a space stored as data where a space is expected (an experiment's `space`): `{"$space": {...}}`."""


class NotData(ValueError):
    """A space (or a stored description of one) that is not plain data, naming the value that is not."""


def space_to_data(space: Space) -> dict[str, Any]:
    """`space` as plain JSON data (see the module's docstring); `NotData` names the first value that has no form."""
    return _node(space, "space")


def stored_space(value: Any) -> Any:
    """`value` itself, or the space it stores as data when it is `{SPACE_DATA: ...}` (see `SPACE_DATA`)."""
    if isinstance(value, dict) and set(value) == {SPACE_DATA}:
        return space_from_data(value[SPACE_DATA], source="the experiment's space")
    return value


def space_from_data(data: Any, *, source: str = "space.json") -> Space:
    """The space `data` describes (read from an untrusted file: every node is checked, nothing is imported or run);
    a malformed node is one `NotData` line naming `source`, the node's path and what was found."""
    space = _read(data, "", source)
    if not isinstance(space, Space):
        raise NotData(f"{source}: the top node must be a space ({{'space': {{...}}}}), got {_short(data)}")
    return space


def _node(value: Any, path: str) -> dict[str, Any]:
    if isinstance(value, Space):
        node: dict[str, Any] = {"space": {key: _node(domain, f"{path}.{key}") for key, domain in value.domains.items()}}
        if value.forbidden:
            node["forbidden"] = sorted(value.forbidden)
        return node
    if type(value) in (Int, Float):
        return {"int" if isinstance(value, Int) else "float": [value.low, value.high], "log": bool(value.log),
                "bins": value.bins}
    if type(value) is Choice:
        return {"choice": [_node(option, f"{path}[{i}]") for i, option in enumerate(value.options)]}
    if _is_constant(value):
        return {"value": value}
    raise NotData(f"{path}: {type(value).__name__} {_short(value)} has no plain-data form")


def _is_constant(value: Any) -> bool:
    if value is None or isinstance(value, (bool, str)) or is_int(value):
        return True
    if is_real(value):
        return math.isfinite(value)
    return isinstance(value, list) and all(_is_constant(item) for item in value)


def _read(node: Any, path: str, source: str) -> Any:
    where = f"{source}: {path or 'the top node'}"
    if not isinstance(node, dict) or len(set(node) - {"log", "bins", "forbidden"}) != 1:
        raise NotData(f"{where} must be one of {{'space': ...}}, {{'int': [low, high]}}, {{'float': [low, high]}}, "
                      f"{{'choice': [...]}}, {{'value': ...}}; got {_short(node)}")
    kind = next(k for k in node if k not in ("log", "bins", "forbidden"))
    body = node[kind]
    try:
        if kind == "space" and isinstance(body, dict) and all(isinstance(k, str) for k in body):
            return Space({key: _read(child, f"{path}.{key}".lstrip("."), source) for key, child in body.items()})
        if kind in ("int", "float") and isinstance(body, list) and len(body) == 2:
            log, bins = node.get("log", False), node.get("bins", 16 if kind == "int" else 8)
            if not isinstance(log, bool):
                raise NotData(f"{where}: 'log' must be true or false, got {_short(log)}")
            return (Int if kind == "int" else Float)(body[0], body[1], log=log, bins=bins)
        if kind == "choice" and isinstance(body, list):
            return Choice([_read(option, f"{path}[{i}]", source) for i, option in enumerate(body)])
        if kind == "value" and _is_constant(body):
            return body
    except NotData:
        raise
    except (TypeError, ValueError) as exc:
        raise NotData(f"{where}: {exc}") from None
    raise NotData(f"{where}: {kind!r} cannot hold {_short(body)}")


def _short(value: Any) -> str:
    text = json.dumps(value, default=repr) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
