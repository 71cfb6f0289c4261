"""Multi-fidelity search on the MNIST-1D learning-curve table (issue 31): nasplat's model-based method against its
model-free ones and against BOHB (Syne Tune), DEHB, SMAC3's multi-fidelity facade and Optuna TPE + Hyperband pruner.

Every method searches the table of `trainers.lc_table` (each configuration's 27 recorded epochs: validation and
test accuracy, seconds) on 4 simulated workers: a trial's epoch takes the seconds the real training took. The
budget is `--budget` (100) full trainings of worker time: `budget * mean full training seconds / workers` of
simulated wall-clock time. A method's incumbent at time t is the epoch result with the best validation accuracy
finished by t (every epoch trained is an observation); its validation regret is the table's best validation
accuracy minus the incumbent's, reported with the incumbent's test accuracy, at 1/8, 1/4, 1/2 and the whole budget.

nasplat's methods run through `nasplat.run(executor="simulated", concurrency=4)`. The anchors run in one harness
here on the same simulated workers (`Workers`): each asks its optimizer for a configuration and how far to train
it, trains it epoch by epoch and tells the optimizer what the optimizer's interface takes (DEHB and SMAC3 train
each job from scratch to its fidelity, as their algorithms do; BOHB and Optuna's pruner judge every epoch).

    python benchmarks/multifidelity_table.py --seeds 50
"""

from __future__ import annotations

import argparse
import heapq
import json
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import nasplat
from search_spaces.lc_table import EPOCHS, GRID, space
from trainers.lc_table import LCTable, load_curves

WORKERS = 4
FRACTIONS = (1 / 8, 1 / 4, 1 / 2, 1.0)
PROMOTE = {"type": "promote", "grace_period": 1, "reduction_factor": 3}
ASHA = {"name": "asha", **PROMOTE}
ASHA_CURVE = {**ASHA, "rank_by": "curve"}
ASHA_DELAYED = {**ASHA_CURVE, "delayed": True}
NASPLAT = {  # name -> (controller, its options, scheduler)
    "mobster": ("mobster", {}, ASHA_CURVE),
    "mobster_value": ("mobster", {}, ASHA),
    "asha_random": ("random", {}, ASHA),
    "asha_random_curve": ("random", {}, ASHA_CURVE),
    "mobster_delayed": ("mobster", {}, ASHA_DELAYED),
    "asha_random_delayed": ("random", {}, ASHA_DELAYED),
    "mobster_target": ("mobster", {"fit_on": "target"}, ASHA_DELAYED),
    "hyperband": ("random", {}, {"name": "hyperband", **PROMOTE}),
    "rea": ("evolution", {"population_size": 10, "sample_size": 3}, None),
    "predictor": ("predictor", {"initial_samples": 10}, None),
}
MODEL_BASED = "mobster"
Trace = list[tuple[float, float, float]]  # (simulated end, valid_acc, test_acc) of every epoch trained


def nasplat_trace(method: str, seed: int, budget_s: float, extra: dict[str, Any] | None = None) -> Trace:
    """One seeded nasplat search's epochs (`extra`: more controller options)."""
    controller, options, scheduler = NASPLAT[method]
    options = {**options, **(extra or {})}
    result = nasplat.run(trainer=LCTable, space=space, metric="valid_acc", controller=controller,
                         controller_options=options, scheduler=scheduler, executor="simulated",
                         concurrency=WORKERS, max_steps=EPOCHS, time_budget_s=budget_s, seed=seed)
    return [(float(r["end"]), float(r["valid_acc"]), float(r["test_acc"])) for r in result.rows if "valid_acc" in r]


# -- the anchors' harness ---------------------------------------------------------------------------------
class Workers:
    """`WORKERS` simulated workers training table configurations epoch by epoch until `budget_s`.

    `start()` gives (handle, configuration index, epochs to train, first epoch) or None; `report(handle, epoch,
    valid)` says whether to train on (called after every epoch); `finish(handle, epoch, valid)` ends the job."""

    def __init__(self, budget_s: float) -> None:
        curves = load_curves().curves
        self.valid, self.test, self.seconds = curves["valid_acc"], curves["test_acc"], curves["seconds"]
        self.budget_s = budget_s

    def run(self, start: Callable[[], tuple[Any, int, int, int] | None], report: Callable[[Any, int, float], bool],
            finish: Callable[[Any, int, float], None]) -> Trace:
        trace: Trace = []
        events: list[tuple[float, int, Any]] = []  # (end of its epoch, worker, job)
        order = 0

        def launch(now: float) -> None:
            nonlocal order
            job = start()
            if job is None:
                return
            handle, index, last, first = job
            epoch = first
            heapq.heappush(events, (now + self.seconds[index, epoch - 1], order, [handle, index, last, epoch]))
            order += 1

        for _ in range(WORKERS):
            launch(0.0)
        while events:
            now, _, job = heapq.heappop(events)
            if now > self.budget_s:
                break
            handle, index, last, epoch = job
            valid = float(self.valid[index, epoch - 1])
            trace.append((now, valid, float(self.test[index, epoch - 1])))
            if epoch < last and report(handle, epoch, valid):
                job[3] = epoch + 1
                heapq.heappush(events, (now + self.seconds[index, epoch], order, job))
                order += 1
                continue
            finish(handle, epoch, valid)
            launch(now)
        return trace


def _table_index(values: dict[str, int]) -> int:
    index = 0
    for key, options in GRID.items():
        index = index * len(options) + int(values[key])
    return index


def optuna_trace(seed: int, budget_s: float) -> Trace:
    """Optuna's TPE sampler with its Hyperband pruner (min 1, max 27 epochs, reduction factor 3)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed),
                                pruner=optuna.pruners.HyperbandPruner(1, EPOCHS, 3))

    def start() -> tuple[Any, int, int, int]:
        trial = study.ask()
        index = _table_index({k: trial.suggest_categorical(k, list(range(len(o)))) for k, o in GRID.items()})
        return trial, index, EPOCHS, 1

    def report(trial: Any, epoch: int, valid: float) -> bool:
        trial.report(valid, epoch)
        return not trial.should_prune()

    def finish(trial: Any, epoch: int, valid: float) -> None:
        if epoch < EPOCHS:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            study.tell(trial, valid)

    return Workers(budget_s).run(start, report, finish)


def synetune_bohb_trace(seed: int, budget_s: float) -> Trace:
    """Syne Tune's BOHB: asynchronous successive halving (stopping, grace 1, reduction factor 3) with its
    TPE-like KDE searcher, driven through its scheduler interface."""
    from datetime import datetime

    from syne_tune.backend.trial_status import Trial
    from syne_tune.config_space import choice
    from syne_tune.optimizer.baselines import BOHB

    np.random.seed(seed)  # its brackets are drawn from NumPy's global stream
    scheduler = BOHB({k: choice(list(range(len(o)))) for k, o in GRID.items()}, metric="valid_acc",
                     time_attr="epoch", max_t=EPOCHS, do_minimize=False, random_seed=seed)
    trials: list[Trial] = []

    def start() -> tuple[Any, int, int, int] | None:
        suggestion = scheduler.suggest()
        if suggestion is None:
            return None
        trial = Trial(len(trials), suggestion.config, datetime.now())
        trials.append(trial)
        scheduler.on_trial_add(trial)
        return trial, _table_index(trial.config), EPOCHS, 1

    def report(trial: Any, epoch: int, valid: float) -> bool:
        return scheduler.on_trial_result(trial, {"valid_acc": valid, "epoch": epoch}) == "CONTINUE"

    def finish(trial: Any, epoch: int, valid: float) -> None:
        if epoch >= EPOCHS:
            scheduler.on_trial_complete(trial, {"valid_acc": valid, "epoch": epoch})

    return Workers(budget_s).run(start, report, finish)


def _configspace(seed: int) -> Any:
    from ConfigSpace import ConfigurationSpace, OrdinalHyperparameter

    cs = ConfigurationSpace(seed=seed)
    cs.add([OrdinalHyperparameter(k, list(range(len(o)))) for k, o in GRID.items()])
    return cs


def dehb_trace(seed: int, budget_s: float) -> Trace:
    """DEHB (Awad et al. 2021) through its ask/tell interface: fidelities 1..27 epochs, eta 3, 4 workers; each job
    trains its configuration from scratch to its fidelity."""
    from dehb import DEHB

    # n_workers=1: its ask/tell interface serves any number of jobs at once; more would start a Dask cluster
    optimizer = DEHB(cs=_configspace(seed), min_fidelity=1, max_fidelity=EPOCHS, eta=3, n_workers=1,
                     seed=seed, output_path=f"/tmp/nasplat-dehb-{seed}", log_level="ERROR")

    def start() -> tuple[Any, int, int, int]:
        job = optimizer.ask()
        return job, _table_index(dict(job["config"])), max(1, round(job["fidelity"])), 1

    def finish(job: Any, epoch: int, valid: float) -> None:
        optimizer.tell(job, {"fitness": -valid, "cost": float(epoch)})

    return Workers(budget_s).run(start, lambda *_: True, finish)


def smac_trace(seed: int, budget_s: float) -> Trace:
    """SMAC3's multi-fidelity facade (random forest + Hyperband) through its ask/tell interface, budgets 1..27
    epochs; each job trains its configuration from scratch to its budget."""
    from smac import MultiFidelityFacade, Scenario
    from smac.main.exceptions import ConfigurationSpaceExhaustedException
    from smac.runhistory.dataclasses import TrialValue

    scenario = Scenario(_configspace(seed), deterministic=True, n_trials=100_000, min_budget=1, max_budget=EPOCHS,
                        seed=seed, output_directory=f"/tmp/nasplat-smac-{seed}")
    optimizer = MultiFidelityFacade(scenario, lambda config, seed, budget: 0.0, overwrite=True, logging_level=40)

    def start() -> tuple[Any, int, int, int] | None:
        try:
            info = optimizer.ask()
        except (ConfigurationSpaceExhaustedException, StopIteration):  # every configuration asked: idle
            return None
        return info, _table_index(dict(info.config)), max(1, round(info.budget or EPOCHS)), 1

    def finish(info: Any, epoch: int, valid: float) -> None:
        optimizer.tell(info, TrialValue(cost=1.0 - valid))

    return Workers(budget_s).run(start, lambda *_: True, finish)


ANCHORS: dict[str, Callable[[int, float], Trace]] = {
    "synetune_bohb": synetune_bohb_trace, "dehb": dehb_trace, "smac_mf": smac_trace,
    "optuna_tpe_hyperband": optuna_trace,
}
NEEDS = {"dehb": "dehb", "smac_mf": "smac", "synetune_bohb": "syne_tune", "optuna_tpe_hyperband": "optuna"}


# -- warm start -------------------------------------------------------------------------------------------
def warm_start_reach(seed: int, budget_s: float, extra: dict[str, Any] | None = None) -> tuple[float, int]:
    """A first `mobster` search over the budget; a second (seed + 1000) warm-started from its folder: the share of
    the second's trials up to the first that matched the first's best validation accuracy, and its trial count."""
    controller, options, scheduler = NASPLAT[MODEL_BASED]
    common: dict[str, Any] = {"trainer": LCTable, "space": space, "metric": "valid_acc", "controller": controller,
                              "controller_options": {**options, **(extra or {})}, "scheduler": scheduler,
                              "executor": "simulated", "concurrency": WORKERS, "max_steps": EPOCHS,
                              "time_budget_s": budget_s}
    with tempfile.TemporaryDirectory(prefix="nasplat-warm-") as folder:
        first = nasplat.run(**common, seed=seed, storage=folder, name="first")
        best = max(float(r["valid_acc"]) for r in first.rows if "valid_acc" in r)
        second = nasplat.run(**common, seed=seed + 1000, storage=folder, name="second",
                             warm_start=f"{folder}/first")
    trials = len({r["trial_id"] for r in second.rows})
    reached = min((r["trial_id"] for r in second.rows if float(r.get("valid_acc", 0.0)) >= best), default=None)
    return (float("inf") if reached is None else (reached + 1) / trials), trials


# -- scoring ----------------------------------------------------------------------------------------------
def at_checkpoints(trace: Trace, budget_s: float, best: float) -> tuple[list[float], list[float]]:
    """Validation regret and the incumbent's test accuracy at each fraction of the budget."""
    trace = sorted(trace)
    regrets, tests = [], []
    for fraction in FRACTIONS:
        done = [(valid, -end, test) for end, valid, test in trace if end <= fraction * budget_s + 1e-9]
        valid, _, test = max(done) if done else (0.0, 0.0, 0.0)
        regrets.append(best - valid)
        tests.append(test)
    return regrets, tests


def reach(trace: Trace, budget_s: float, best: float, regret: float) -> float:
    """The fraction of the budget after which the trace's regret is <= `regret` (inf: never)."""
    incumbent = 0.0
    for end, valid, _ in sorted(trace):
        incumbent = max(incumbent, valid)
        if best - incumbent <= regret + 1e-12:
            return end / budget_s
    return float("inf")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--first-seed", type=int, default=0, help="the seeds are first-seed, first-seed + 1, ...")
    parser.add_argument("--budget", type=float, default=100.0, help="full trainings of worker time")
    parser.add_argument("--only", nargs="+", default=list(NASPLAT) + list(ANCHORS))
    parser.add_argument("--mobster-options", default="{}", help="JSON of more options of the mobster controller")
    parser.add_argument("--warm-seeds", type=int, default=10, help="seeds of the warm-start check (0: skip it)")
    args = parser.parse_args()
    curves = load_curves().curves
    best = float(curves["valid_acc"].max())
    budget_s = args.budget * float(curves["seconds"].sum(axis=1).mean()) / WORKERS
    print(f"table: {curves['valid_acc'].shape[0]} configurations x {EPOCHS} epochs, best validation {best:.4f}; "
          f"budget {args.budget:g} full trainings = {budget_s:.1f} simulated s on {WORKERS} workers; "
          f"{args.seeds} seeds")
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    regret: dict[str, list[float]] = {}
    sem: dict[str, list[float]] = {}
    test: dict[str, list[float]] = {}
    traces: dict[str, list[Trace]] = {}
    not_installed: list[str] = []
    for method in args.only:
        if method in ANCHORS:
            try:
                __import__(NEEDS[method])
            except ImportError as exc:
                not_installed.append(f"{method}: {exc}")
                continue
        started = time.perf_counter()
        uses_mobster = method in NASPLAT and NASPLAT[method][0] == "mobster"
        extra = json.loads(args.mobster_options) if uses_mobster else None
        traces[method] = [nasplat_trace(method, seed, budget_s, extra) if method in NASPLAT else
                          ANCHORS[method](seed, budget_s) for seed in seeds]
        scored = [at_checkpoints(t, budget_s, best) for t in traces[method]]
        regrets, tests = np.array([r for r, _ in scored]), np.array([t for _, t in scored])
        regret[method] = regrets.mean(axis=0).round(5).tolist()
        sem[method] = (regrets.std(axis=0, ddof=1) / np.sqrt(len(regrets))).round(5).tolist() if len(
            regrets) > 1 else [0.0] * len(FRACTIONS)
        test[method] = tests.mean(axis=0).round(4).tolist()
        cells = "  ".join(f"{m:.4f}±{s:.4f}" for m, s in zip(regret[method], sem[method]))
        print(f"{method:<22} regret at 1/8 1/4 1/2 1: {cells}  test acc {test[method]}  "
              f"({time.perf_counter() - started:.0f} s)", flush=True)
    reach_asha = None
    if MODEL_BASED in traces and "asha_random" in regret:
        final = regret["asha_random"][-1]
        reach_asha = float(np.mean([min(reach(t, budget_s, best, final), 2.0) for t in traces[MODEL_BASED]]))
        print(f"{MODEL_BASED} reaches ASHA-random's final mean regret ({final:.4f}) after {reach_asha:.3f} of the "
              "budget on average (a seed that never does counts 2)")
    warm = [warm_start_reach(seed, budget_s, json.loads(args.mobster_options)) for seed in seeds[:args.warm_seeds]]
    if warm:
        shares = [share for share, _ in warm]
        print(f"warm start: a second {MODEL_BASED} search warm-started from a first one's folder matched the first's "
              f"best after {np.mean(shares):.3f} of its trials on average (worst {max(shares):.3f}; "
              f"{np.mean([n for _, n in warm]):.0f} trials a search; {len(warm)} seeds; goal <= 0.25)")
    print(json.dumps({"model_based": MODEL_BASED, "regret": regret, "sem": sem, "test_acc": test,
                      "reach_asha_final": reach_asha, "warm_start_share": float(np.mean(shares)) if warm else None,
                      "not_installed": not_installed}))


if __name__ == "__main__":
    main()
