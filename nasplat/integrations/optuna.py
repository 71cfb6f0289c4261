"""nasplat results as an Optuna study, for `optuna-dashboard`, `optuna.visualization` and decision importance.

`to_optuna(result, storage="sqlite:///x.db")` writes one Optuna trial per nasplat trial: its config's
decisions as params with their distributions from the nasplat `Space`, every step's metric as an
intermediate value and its best step's metric as the value. Conditional choices are flattened the way
`OptunaSampler` suggests them: the choice itself is a categorical param over its option indices, and a
decision inside option `i` of choice `depth` is the param `depth[i].width0`, so branches never share a
param. A choice between plain values (strings, numbers, booleans, None) keeps the values themselves.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from nasplat.core.pareto import better
from nasplat.core.rows import Status
from nasplat.engine.result import ExperimentResult
from nasplat.space import Choice, Float, Int, Space
from nasplat.space.data import space_from_data
from nasplat.storage import SPACE_FILE

if TYPE_CHECKING:
    import optuna

STATES = {Status.COMPLETED: "COMPLETE", Status.STOPPED: "PRUNED", Status.FAILED: "FAIL", Status.RUNNING: "RUNNING"}
EVALUATORS = ("fanova", "ped-anova")


def to_optuna(result: ExperimentResult, storage: str | None = None, study_name: str | None = None, *,
              space: Space | dict[str, Any] | None = None) -> optuna.Study:
    """Write `result` as a new Optuna study in `storage` (an RDB URL; None: in memory) and return it.

    Trial states: completed -> COMPLETE, stopped early -> PRUNED, failed -> FAIL, still running -> RUNNING.
    Each trial's value is the best of its steps (as `result.ranked()` ranks trials), so the study's
    `best_trial` is `result.best`'s trial when that trial completed. The params are the trial's first
    config; a config that PBT changed later is in the user attribute `nasplat_final_config`. `space`:
    the search space (default: the experiment folder's `space.json`).
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = experiment_space(result) if space is None else space if isinstance(space, Space) else Space(space)
    name = study_name or (result.path.name if result.path is not None else "nasplat")
    study = optuna.create_study(storage=storage, study_name=name,
                                direction="maximize" if result.mode == "max" else "minimize")
    study.set_user_attr("nasplat_metric", result.metric)
    study.add_trials(_frozen_trial(space, result, rows) for rows in _rows_by_trial(result).values())
    return study


def param_importances(result: ExperimentResult, *, evaluator: str = "fanova", seed: int = 0,
                      space: Space | dict[str, Any] | None = None) -> dict[str, float]:
    """Each decision's importance for the metric, by Optuna's `get_param_importances` (most important first).

    `evaluator`: "fanova" (a random forest's functional ANOVA, seeded) or "ped-anova" (PED-ANOVA);
    fANOVA assesses the decisions present in every completed trial (not those inside a branch).
    """
    import optuna
    from optuna.importance import FanovaImportanceEvaluator, PedAnovaImportanceEvaluator

    if evaluator not in EVALUATORS:
        raise ValueError(f"`evaluator` must be one of {list(EVALUATORS)}, got {evaluator!r}")
    study = to_optuna(result, space=space)
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if len(complete) < 2:
        raise ValueError(f"decision importance needs at least 2 completed trials, got {len(complete)}")
    chosen = FanovaImportanceEvaluator(seed=seed) if evaluator == "fanova" else PedAnovaImportanceEvaluator()
    return {name: float(value) for name, value in
            optuna.importance.get_param_importances(study, evaluator=chosen).items()}


def experiment_space(result: ExperimentResult) -> Space:
    """The search space of `result`'s experiment, from its folder's `space.json` (plain data: nothing in the folder
    is imported or unpickled)."""
    if result.path is None:
        raise ValueError("the search space is needed: pass `space=` (this result has no experiment folder)")
    path = result.path / SPACE_FILE
    if not path.exists():
        raise ValueError(f"{path} is missing (the folder was made by an older nasplat, or its space holds something "
                         f"that is not plain data); pass `space=`")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ValueError(f"{path}: cannot read it as JSON ({exc})") from None
    return space_from_data(data, source=str(path))


def distributions(space: Space, config: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any, Any]]:
    """(param name, Optuna distribution, value) for every active decision of `config`."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    for key, domain in space.domains.items():
        name, value = prefix + key, config[key]
        if isinstance(domain, Space):
            yield from distributions(domain, value, name + ".")
        elif isinstance(domain, Choice):
            index = domain.index(name, value)
            if len(domain.options) > 1:
                labels = _labels(domain)
                yield name, CategoricalDistribution(labels), labels[index]
            option = domain.options[index]
            if isinstance(option, Space):
                yield from distributions(option, value, f"{name}[{index}].")
        elif isinstance(domain, Int):
            yield name, IntDistribution(domain.low, domain.high, log=domain.log), int(value)
        elif isinstance(domain, Float):
            yield name, FloatDistribution(domain.low, domain.high, log=domain.log), float(value)


def _labels(choice: Choice) -> list[Any]:
    """The option values when they are distinct plain values Optuna can store, else the option indices."""
    plain = all(o is None or isinstance(o, (bool, int, float, str)) for o in choice.options)
    if plain and len({(type(o), o) for o in choice.options}) == len(choice.options):
        return list(choice.options)
    return list(range(len(choice.options)))


def _rows_by_trial(result: ExperimentResult) -> dict[int, list[dict[str, Any]]]:
    trials: dict[int, list[dict[str, Any]]] = {}
    for row in result.rows:
        trials.setdefault(row["trial_id"], []).append(row)
    return dict(sorted(trials.items()))


def _frozen_trial(space: Space, result: ExperimentResult, rows: list[dict[str, Any]]) -> optuna.trial.FrozenTrial:
    import optuna

    first, last = rows[0], rows[-1]
    try:
        decisions = list(distributions(space, first["config"]))
    except (KeyError, ValueError, TypeError) as exc:
        raise ValueError(f"trial {first['trial_id']}'s config {first['config']!r} does not fit the space: {exc}") \
            from exc
    steps = {int(r["step"]): float(r[result.metric]) for r in rows
             if r.get("status") not in (Status.FAILED, Status.RETRIED)
             and isinstance(r.get(result.metric), (int, float)) and math.isfinite(r[result.metric])}
    best = None
    for value in steps.values():
        best = value if best is None or better(value, best, result.mode) else best
    state = STATES.get(last.get("status", Status.RUNNING), "RUNNING")
    if state == "COMPLETE" and best is None:
        state = "FAIL"
    attrs: dict[str, Any] = {"nasplat_trial_id": first["trial_id"], "nasplat_status": last.get("status")}
    if first.get("parent_id") is not None:
        attrs["nasplat_parent_id"] = first["parent_id"]
    if last["config"] != first["config"]:
        attrs["nasplat_final_config"] = json.loads(json.dumps(last["config"], default=repr))
    return optuna.trial.create_trial(
        state=optuna.trial.TrialState[state], value=None if state in ("FAIL", "RUNNING") else best,
        params={n: v for n, _, v in decisions}, distributions={n: d for n, d, _ in decisions},
        user_attrs=attrs, intermediate_values=steps)
