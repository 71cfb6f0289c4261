"""Microseconds per ask + tell of each controller over the NAS-Bench-201 space.

Regularized evolution runs at population 1,000 (sample 25), its population full before timing starts;
scores come from a cheap deterministic function of the config so that the controller is all that is timed.
The predictor is timed apart: the median milliseconds of one `ask` once it holds 1,000 results (the issue's
bar: at most 50 ms on this machine).

    python benchmarks/controllers.py [--rounds 2000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import optuna

from nasplat import Controller, OptunaSampler, PopulationBasedTraining, RandomSearch, RegularizedEvolution, Reinforce
from nasplat.controllers import LocalSearch, Predictor, Result
from search_spaces.nb201 import OPS, space


def score(config: dict) -> float:
    return float(sum(OPS.index(op) * (i + 1) for i, op in enumerate(config.values())))


def time_controller(controller: Controller, rounds: int, warmup: int) -> float:
    """Mean µs of one ask + tell after `warmup` untimed rounds."""
    def one() -> None:
        spec = controller.ask()
        controller.tell(spec.trial_id, Result({"acc": score(spec.config)}, step=1))
    for _ in range(warmup):
        one()
    started = time.perf_counter()
    for _ in range(rounds):
        one()
    return 1e6 * (time.perf_counter() - started) / rounds


def time_pbt(rounds: int) -> float:
    """Mean µs of one PBT `on_result` (the per-step decision) in a population of 32."""
    pbt = PopulationBasedTraining(space, metric="acc", population_size=32, perturbation_interval=4)
    members = [pbt.ask() for _ in range(32)]
    started = time.perf_counter()
    for i in range(rounds):
        member = members[i % 32]
        pbt.on_result(member.trial_id, Result({"acc": float(i % 97)}, step=i // 32 + 1))
    return 1e6 * (time.perf_counter() - started) / rounds


def predictor_ask_ms(results: int, asks: int) -> float:
    """Median ms of one predictor `ask` (its incremental fit included) with `results` results told."""
    predictor = Predictor(space, metric="acc", initial_samples=results)
    for _ in range(results):
        spec = predictor.ask()
        predictor.tell(spec.trial_id, Result({"acc": score(spec.config)}, step=1))
    spec = predictor.ask()  # the first fit over all results at once: a one-off, not timed
    predictor.tell(spec.trial_id, Result({"acc": score(spec.config)}, step=1))
    times = []
    for _ in range(asks):
        started = time.perf_counter()
        spec = predictor.ask()
        times.append(1e3 * (time.perf_counter() - started))
        predictor.tell(spec.trial_id, Result({"acc": score(spec.config)}, step=1))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    figures = {
        "random": time_controller(RandomSearch(space, metric="acc"), args.rounds, 0),
        "evolution": time_controller(RegularizedEvolution(space, metric="acc", population_size=1000, sample_size=25),
                                     args.rounds, 1000),
        "reinforce": time_controller(Reinforce(space, metric="acc"), args.rounds, 0),
        "optuna_tpe": time_controller(OptunaSampler(space, metric="acc"), min(args.rounds, 200), 0),
        "local_search": time_controller(LocalSearch(space, metric="acc"), args.rounds, 0),
        "pbt_on_result": time_pbt(args.rounds),
    }
    for name, us in figures.items():
        print(f"{name:<14} {us:10.1f} µs per ask+tell")
    ask_ms = predictor_ask_ms(1000, 50)
    print(f"predictor      {ask_ms:10.1f} ms median ask with 1,000 results (bar: 50 ms)")
    print(json.dumps({**{f"{name}_ask_tell_us": round(us, 1) for name, us in figures.items()},
                      "predictor_median_ask_ms_at_1000": round(ask_ms, 1)}))


if __name__ == "__main__":
    main()
