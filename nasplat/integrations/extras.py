"""What every integration needs: its optional package imported with a one-line hint naming the extra that installs
it, and a row's metrics as plain numbers."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping
from typing import Any

from nasplat.core.checks import is_real
from nasplat.core.rows import RESERVED


class MissingExtra(ImportError):
    """An integration's package is not installed; the message names the nasplat extra that installs it."""



def require(module: str, extra: str) -> Any:
    """Import `module`, or raise a one-line `MissingExtra` naming the nasplat extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtra(f"{module} is not installed (needed by nasplat's {extra} integration); "
                          f"install it with: pip install 'nasplat[{extra}]'") from exc



def installed(module: str) -> bool:
    """Whether `module` can be imported (without importing it)."""
    return importlib.util.find_spec(module) is not None



def row_metrics(row: Mapping[str, Any]) -> dict[str, float]:
    """The finite numeric metrics of a recorded row (bookkeeping columns and booleans left out)."""
    return {k: float(v) for k, v in row.items() if k not in RESERVED and is_real(v, finite=True)}
