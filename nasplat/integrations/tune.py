"""nasplat controllers as Ray Tune search algorithms: `TuneConfig(search_alg=TuneSearch(controller))`."""

from __future__ import annotations

import pickle
from typing import Any

from ray.tune.search import Searcher

from nasplat.controllers import base
from nasplat.controllers.base import Result


class TuneSearch(Searcher):
    """Wraps an ask/tell `Controller` (e.g. `RegularizedEvolution`, `Reinforce`; any nasplat `Searcher`) as a Tune
    `Searcher`.

    The controller's metric and mode are Tune's; Tune's `param_space` may stay empty because the
    controller carries its own space. Failed or errored trials are told to the controller as failed.
    """

    def __init__(self, controller: base.Searcher) -> None:
        if not isinstance(controller, base.Searcher):
            raise TypeError(f"TuneSearch wraps a nasplat Controller, got {controller!r}")
        super().__init__(metric=controller.metric, mode=controller.mode)
        self.controller = controller
        self.trial_ids: dict[str, int] = {}

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec: Any) -> bool:
        for name, ours, theirs in (("metric", self.controller.metric, metric), ("mode", self.controller.mode, mode)):
            if theirs is not None and theirs != ours:
                raise ValueError(f"Tune's {name}={theirs!r} differs from the nasplat controller's {name}={ours!r}")
        return True

    # Ray annotates `suggest` as returning a dict or None, but its docstring and its own searchers return the
    # string `Searcher.FINISHED` too: the override's wider return type is Ray's annotation being wrong.
    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:  # type: ignore[override]
        spec = self.controller.ask()
        if spec is None:
            return Searcher.FINISHED
        self.trial_ids[trial_id] = spec.trial_id
        return dict(spec.config)

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False) -> None:
        ours = self.trial_ids.pop(trial_id, None)
        if ours is None:
            return
        metrics = dict(result or {})
        step = int(metrics.get("training_iteration", 1))
        self.controller.tell(ours, Result(metrics, step, failed=error or result is None))

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as f:
            pickle.dump({"controller": self.controller.state_dict(), "trial_ids": self.trial_ids}, f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            state = pickle.load(f)
        self.controller.load_state_dict(state["controller"])
        self.trial_ids = state["trial_ids"]
