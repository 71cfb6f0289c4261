"""What watches a run: the engine calls a listener's hooks as the run starts, as each row is recorded, and as it
ends. Dashboards, TensorBoard and MLflow are listeners (`nasplat.integrations`); so is any object given in
`nasplat.run(callbacks=[...])`, which needs only the hooks it uses."""

from __future__ import annotations

from typing import Any


class Listener:
    """The hooks, each a no-op here: subclass and override those you need. `engine` is the running
    `nasplat.engine.Engine`."""

    def on_start(self, engine: Any) -> None:
        """Called once, after the executor opened and before the first trial launches.

        Arguments: `engine`, the run (its `name`, `path`, `controller`, `executor`). Returns nothing."""

    def on_row(self, engine: Any, row: dict[str, Any]) -> None:
        """Called for every row as it is recorded (after its checkpoint is durable), in the order of the record.

        Arguments: `engine`, and `row` (trial id, step, status, config, metrics; see `nasplat.core.rows`), which the
        listener must not change. Returns nothing."""

    def on_end(self, engine: Any) -> None:
        """Called once when the run ends, however it ends (budget spent, failed out, interrupted), after the last
        row. Arguments: `engine`. Returns nothing."""


def notify(listeners: list[Any], hook: str, *args: Any) -> None:
    """Call `hook(*args)` on every listener that has it (a plain object may define only some of the hooks)."""
    for listener in listeners:
        method = getattr(listener, hook, None)
        if method is not None:
            method(*args)
