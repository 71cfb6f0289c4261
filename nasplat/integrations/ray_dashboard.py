"""The experiment's own metrics in Ray's metrics system (Prometheus endpoint, Ray dashboard, Grafana).

Exported by the driver, tagged with the experiment name (Ray prefixes each name with `ray_`):
`nasplat_trials{state=running|completed|stopped|failed}`, `nasplat_best_metric`, `nasplat_exploits`,
`nasplat_gangs` (gangs started) and `nasplat_steps_total`.
"""

from __future__ import annotations

import time
from typing import Any

from ray.util import metrics

from nasplat.engine.listener import Listener


class RayMetrics(Listener):
    """An engine listener that mirrors progress into `ray.util.metrics` gauges, at most every `interval_s`."""

    def __init__(self, experiment: str, interval_s: float = 0.5) -> None:
        self.tags = {"experiment": experiment}
        self.interval_s, self._last = interval_s, 0.0
        self._steps_pending = 0
        self._made = False

    def _make(self) -> None:
        """Create the metrics once Ray is up (the executor starts it)."""
        tags = ("experiment",)
        self.trials = metrics.Gauge("nasplat_trials", "Trials of the experiment per state.", tag_keys=tags + ("state",))
        self.best = metrics.Gauge("nasplat_best_metric", "Best value of the experiment's metric so far.", tag_keys=tags)
        self.exploits = metrics.Gauge("nasplat_exploits", "PBT exploits carried out so far.", tag_keys=tags)
        self.gangs = metrics.Gauge("nasplat_gangs", "Actor gangs started so far.", tag_keys=tags)
        self.steps = metrics.Counter("nasplat_steps_total", "Trial steps recorded.", tag_keys=tags)
        self._made = True

    def on_row(self, engine: Any, row: dict[str, Any]) -> None:
        self._steps_pending += 1
        now = time.monotonic()
        if now - self._last >= self.interval_s:  # counting the trials' states walks every trial: not every row
            self.publish(engine)
            self._last = now

    def on_end(self, engine: Any) -> None:
        """The final figures, however soon after the last publication."""
        self.publish(engine)

    def publish(self, engine: Any) -> None:
        if not self._made:
            self._make()
        for state, count in engine.status_counts().items():
            self.trials.set(count, tags={**self.tags, "state": state})
        if engine.best_row is not None:
            self.best.set(float(engine.best_row[engine.controller.metric]), tags=self.tags)
        self.exploits.set(engine.exploits, tags=self.tags)
        self.gangs.set(engine.executor.gangs_started, tags=self.tags)
        if self._steps_pending:
            self.steps.inc(self._steps_pending, tags=self.tags)
            self._steps_pending = 0
