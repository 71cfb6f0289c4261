"""Schedulers on scripted result streams: ASHA's promotions step by step as Algorithm 2 of Li et al. (2020), its
stop decisions as Ray Tune's ASHAScheduler (the oracle, fed the same stream), the median stopping rule as Golovin
et al. (2017) state it, Hyperband's brackets; then through `nasplat.run` on the simulated clock."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import yaml

import nasplat
from nasplat import Float, Trainer
from nasplat.controllers import STOP, Continue, Pause, RandomSearch, Result, Stop
from nasplat.schedulers import ASHA, Hyperband, MedianStopping, make_scheduler
from nasplat.storage import read_spec

SPACE = {"x": Float(0.0, 1.0)}


class Told(RandomSearch):
    """Random search that notes every `tell` it gets: (trial, step of the result)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.told: list[tuple[int, int]] = []

    def tell(self, trial_id, result):
        self.told.append((trial_id, result.step))


# -- promote: Algorithm 2 of Li et al. (2020), step by step -------------------------------------------------
AT_1 = {0: .5, 1: .9, 2: .1, 3: .7, 4: .3, 5: .8, 6: .2, 7: .6, 8: .4, 9: .99, 10: .0}  # scores at rung 0 (step 1)
AT_3 = {1: .92, 3: .95, 5: .85, 9: .5}  # scores from step 3 on (rung 1 is step 3; max_steps 9)

# One worker, 16 jobs. Rungs at steps 1 and 3 (reduction factor 3, max 9). Before each job, get_job scans rung 1,
# then rung 0, for a trial in the top floor(n/3) of the rung that was not promoted yet; none: a new trial.
EXPECTED = [
    ("new", 0), ("pause", 0, 1),
    ("new", 1), ("pause", 1, 1),
    ("new", 2), ("pause", 2, 1),     # rung 0 = {.5, .9, .1}: top 1 = trial 1
    ("promote", 1), ("pause", 1, 3),  # rung 1 = {1}: floor(1/3) = 0
    ("new", 3), ("pause", 3, 1),     # rung 0 top 1 (of 4): 1, promoted already
    ("new", 4), ("pause", 4, 1),
    ("new", 5), ("pause", 5, 1),     # 6 in rung 0: top 2 = 1, 5
    ("promote", 5), ("pause", 5, 3),  # rung 1 = {1: .92, 5: .85}
    ("new", 6), ("pause", 6, 1),
    ("new", 7), ("pause", 7, 1),
    ("new", 8), ("pause", 8, 1),     # 9 in rung 0: top 3 = 1, 5, 3
    ("promote", 3), ("pause", 3, 3),  # rung 1 = {1, 5, 3: .95}: top 1 = 3
    ("promote", 3), ("end", 3, 9),    # the top rung first: 3 goes on to max_steps
    ("new", 9), ("pause", 9, 1),     # nothing promotable: a new trial; rung 0 top 3 = 9, 1, 5
    ("promote", 9), ("pause", 9, 3),  # rung 1 = {1, 5, 3, 9: .5}: top 1 = 3, promoted
    ("new", 10), ("pause", 10, 1),
]


def score(trial_id: int, step: int) -> float:
    return AT_1[trial_id] if step < 3 else AT_3[trial_id]


def drive(asha: ASHA, jobs: int, steps: dict[int, int] | None = None, scores=score) -> list[tuple]:
    """One worker running `jobs` jobs as the engine does: promote first, else ask; report every step (its score
    from `scores(trial_id, step)`)."""
    log, steps = [], {} if steps is None else steps
    for _ in range(jobs):
        trial_id = asha.promote()
        if trial_id is None:
            trial_id = asha.ask().trial_id
            log.append(("new", trial_id))
        else:
            log.append(("promote", trial_id))
        step = steps.get(trial_id, 0)
        while True:
            step += 1
            result = Result({"score": scores(trial_id, step)}, step)
            decision = asha.on_result(trial_id, result)
            if step >= asha.max_steps or isinstance(decision, Stop):
                asha.tell(trial_id, result)
                log.append(("end", trial_id, step))
                break
            if isinstance(decision, Pause):
                steps[trial_id] = step
                log.append(("pause", trial_id, step))
                break
            assert isinstance(decision, Continue)
    return log


def test_promotions_follow_algorithm_2_of_li_et_al_step_by_step():
    asha = ASHA(Told(SPACE, metric="score"), max_steps=9, grace_period=1, reduction_factor=3, type="promote")
    assert asha.rungs == [[1, 3]]
    assert drive(asha, 16) == EXPECTED
    # the wrapped controller learns each trial once, at the rung where it first paused (3 is not told again at 9)
    assert asha.controller.told == [(t, 1) for t in range(11)]
    assert [asha.rung_of(t) for t in (0, 1, 3, 9)] == [0, 1, 2, 1]


def test_promote_state_dict_continues_identically():
    first = ASHA(Told(SPACE, metric="score", seed=3), max_steps=9, type="promote")
    steps: dict[int, int] = {}
    head = drive(first, 7, steps)
    copy = ASHA(Told(SPACE, metric="score", seed=3), max_steps=9, type="promote")
    copy.load_state_dict(first.state_dict())
    assert head + drive(copy, 9, dict(steps)) == EXPECTED
    assert drive(first, 9, steps) == EXPECTED[len(head):]


def improving(trial_id: int, step: int) -> float:
    """Each trial better than every earlier one at every step (the proposals of a controller that learns)."""
    return trial_id + 0.01 * step


@pytest.mark.parametrize("delayed, reached, promoted, most_over_share", [
    (False, [18, 16, 14], [16, 14, 12], 10),
    (True, [42, 13, 4], [13, 4, 1], 0),
])
def test_delayed_promotion_holds_each_rung_to_its_share_when_later_trials_are_better(delayed, reached, promoted,
                                                                                      most_over_share):
    asha = ASHA(Told(SPACE, metric="score"), max_steps=27, type="promote", delayed=delayed)  # rungs at 1, 3, 9
    steps: dict[int, int] = {}
    over = 0  # the most promotions a rung had beyond floor(n / 3) of its n results, after any of the 60 jobs
    for _ in range(60):
        drive(asha, 1, steps, scores=improving)
        over = max(over, *(len(asha.promoted[0][k]) - len(rung) // 3 for k, rung in enumerate(asha.recorded[0])))
    # trials that reached each rung; plain ASHA promoted almost every trial (the newest is always the best), and
    # so ran 18 trials in 60 jobs; delayed, the rungs keep successive halving's shape and 42 trials ran
    assert [len(rung) for rung in asha.recorded[0]] == reached
    assert [len(trials) for trials in asha.promoted[0]] == promoted
    assert over == most_over_share


def test_delayed_promotion_state_dict_continues_identically():
    first = ASHA(Told(SPACE, metric="score", seed=3), max_steps=27, type="promote", delayed=True)
    steps: dict[int, int] = {}
    drive(first, 25, steps, scores=improving)
    copy = ASHA(Told(SPACE, metric="score", seed=3), max_steps=27, type="promote", delayed=True)
    copy.load_state_dict(first.state_dict())
    tail = drive(copy, 35, dict(steps), scores=improving)
    assert tail == drive(first, 35, steps, scores=improving)
    # after the copy a promotion comes each time a rung's quota grows: every third new trial at the first rung
    assert [job[1] for job in tail if job[0] == "promote"] == [17, 20, 23, 26, 26, 26, 29, 32, 35, 35, 38]


# -- stop: Ray Tune's ASHAScheduler as the oracle ----------------------------------------------------------
def test_stop_decisions_equal_ray_tunes_asha_scheduler_on_the_same_stream():
    from ray.tune.experiment import Trial
    from ray.tune.schedulers import ASHAScheduler, TrialScheduler

    rng = np.random.default_rng(7)
    ours = ASHA(RandomSearch(SPACE, metric="score"), max_steps=27, grace_period=1, reduction_factor=3, type="stop")
    tune = ASHAScheduler(metric="score", mode="max", max_t=27, grace_period=1, reduction_factor=3)
    quality = rng.normal(size=60)
    running: dict[int, list] = {}
    started, decisions = 0, []
    while started < 60 or running:
        while len(running) < 5 and started < 60:  # 5 trials at a time, reporting in a random interleaving
            trial_id = ours.ask().trial_id
            trial = Trial("__fake", stub=True)
            tune.on_trial_add(None, trial)
            running[trial_id] = [trial, 0]
            started += 1
        trial_id = int(rng.choice(sorted(running)))
        trial, step = running[trial_id]
        step += 1
        running[trial_id][1] = step
        value = float(quality[trial_id] + 0.05 * np.log(step) + 0.3 * rng.normal())
        mine = ours.on_result(trial_id, Result({"score": value}, step))
        theirs = tune.on_trial_result(None, trial, {"training_iteration": step, "score": value})
        decisions.append((trial_id, step, type(mine).__name__, theirs))
        assert (theirs == TrialScheduler.STOP) == isinstance(mine, Stop), decisions[-1]
        if isinstance(mine, Stop):
            tune.on_trial_complete(None, trial, {"training_iteration": step, "score": value})
            ours.tell(trial_id, Result({"score": value}, step))
            del running[trial_id]
    stops = [d for d in decisions if d[2] == "Stop" and d[1] < 27]
    assert len(stops) >= 30 and len(decisions) - len(stops) >= 100  # both decisions were exercised, at every rung
    assert {d[1] for d in stops} == {1, 3, 9}


# -- the median stopping rule as published --------------------------------------------------------------
def test_median_rule_stops_a_trial_whose_best_is_strictly_worse_than_the_median_of_running_averages():
    rule = MedianStopping(RandomSearch(SPACE, metric="score"), grace_period=1, min_samples=3)
    curves = {0: [.25, .5, .75], 1: [.5, 1.0, 1.5], 2: [1.0, 1.0, 1.0], 3: [.125]}
    for trial_id, curve in curves.items():  # four trials end (trial 3 was stopped after one step)
        assert rule.ask().trial_id == trial_id
        for step, value in enumerate(curve, start=1):
            rule.on_result(trial_id, Result({"score": value}, step))
        rule.tell(trial_id, Result({"score": curve[-1]}, len(curve)))
    # running averages up to step 1: .25, .5, 1, .125 -> median .375; up to step 2: .375, .75, 1, .125 -> median
    # .5625; up to step 3: .5, 1, 1, .125 -> median .75 (trial 3 ended at step 1: all its reports)
    assert [rule.median(s) for s in (1, 2, 3)] == [.375, .5625, .75]
    new = rule.ask().trial_id
    assert rule.on_result(new, Result({"score": .375}, 1)) != STOP  # equal to the median: not strictly worse
    assert rule.on_result(new, Result({"score": .25}, 2)) == STOP  # its best by step 2 is .375 < .5625
    other = rule.ask().trial_id
    assert rule.on_result(other, Result({"score": .25}, 1)) == STOP
    late = MedianStopping(RandomSearch(SPACE, metric="score"), grace_period=2, min_samples=3)
    late.load_state_dict({**rule.state_dict(), "grace_period": 2})
    assert late.on_result(late.ask().trial_id, Result({"score": .0}, 1)) != STOP  # before grace_period: go on


def test_median_rule_waits_for_min_samples_ended_trials():
    rule = MedianStopping(RandomSearch(SPACE, metric="score"), min_samples=2)
    first = rule.ask().trial_id
    rule.on_result(first, Result({"score": .9}, 1))
    rule.tell(first, Result({"score": .9}, 1))
    assert rule.on_result(rule.ask().trial_id, Result({"score": .1}, 1)) != STOP  # one ended trial: too few


# -- Hyperband's brackets -------------------------------------------------------------------------------
def test_hyperband_brackets_and_their_weights():
    band = Hyperband(RandomSearch(SPACE, metric="score", seed=1), max_steps=27, reduction_factor=3)
    assert band.rungs == [[1, 3, 9], [3, 9], [9], []]
    assert band.weights == pytest.approx([27 / 49, 12 / 49, 6 / 49, 4 / 49])  # ceil(4/(s+1) * 3**s), s = 3..0
    for _ in range(2000):
        band.ask()
    shares = np.bincount(list(band.bracket_of.values()), minlength=4) / 2000
    assert shares == pytest.approx(band.weights, abs=0.03)
    in_last = next(t for t, b in band.bracket_of.items() if b == 3)
    assert all(band.on_result(in_last, Result({"score": 0.0}, s)) == nasplat.controllers.CONTINUE for s in range(1, 27))


@pytest.mark.parametrize("options, message", [
    ({"name": "sha"}, r"`scheduler` must be one of \['asha', 'hyperband', 'median'\]"),
    ({"name": "asha", "type": "pause"}, r"`type` must be one of \['stop', 'promote'\], got type='pause'"),
    ({"name": "asha", "brackets": 5}, r"`brackets` must be <= 4 .* got brackets=5"),
    ({"name": "asha", "max_steps": 30}, r"scheduler's max_steps must be <= the run's, got scheduler max_steps=30"),
    ({"name": "asha", "reduction_factor": 1}, r"`reduction_factor` must be an integer >= 2, got reduction_factor=1"),
    ({"name": "asha", "delayed": True},
     r"`delayed` bounds promotions, so it needs type='promote'; got delayed=True with type='stop'"),
    ({"name": "hyperband", "type": "promote", "delayed": "yes"},
     r"`delayed` must be true or false, got delayed='yes'"),
    ({"name": "median", "patience": 3}, r"unknown option\(s\) \['patience'\] for scheduler 'median'; allowed: \['grace_period'"),
])
def test_bad_scheduler_options_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        make_scheduler(options, RandomSearch(SPACE, metric="score"), max_steps=27)


# -- through nasplat.run on the simulated clock ---------------------------------------------------------
class Counter(Trainer):
    """Counts its steps (`t`, kept in its state); the score is x plus a little per step; a step costs 1 + x."""

    def setup(self, config, ctx):
        self.x, self.t = config["x"], 0

    def step(self):
        self.t += 1
        return {"score": self.x + 0.01 * self.t, "t": self.t, "time_cost": 1.0 + self.x}

    def state_dict(self):
        return {"t": self.t}

    def load_state_dict(self, state):
        self.t = state["t"]


@pytest.mark.parametrize("scheduler, max_steps, message", [
    ("asha", 1, "ASHA has no rung below max_steps=1: its first is at step 1 (grace_period)"),
    ({"name": "asha", "grace_period": 9}, 9, "ASHA has no rung below max_steps=9: its first is at step 9"),
    ({"name": "hyperband", "type": "promote"}, 1, "Hyperband has no rung below max_steps=1"),
    ({"name": "median", "grace_period": 3}, 3, "MedianStopping has no rung below max_steps=3: its first is at step 3"),
    (MedianStopping(RandomSearch(SPACE, metric="score"), grace_period=2), 2, "MedianStopping has no rung below"),
])
def test_a_scheduler_without_a_rung_below_max_steps_is_refused_before_anything_runs(tmp_path, scheduler, max_steps,
                                                                                     message):
    # it would stop or pause no trial: a plain search under the scheduler's name (issue 31)
    ready = {"controller": scheduler.controller} if isinstance(scheduler, MedianStopping) else {}
    with pytest.raises(ValueError) as info:
        nasplat.run(trainer=Counter, space=SPACE, metric="score", executor="simulated", max_trials=40,
                    max_steps=max_steps, scheduler=scheduler, storage=tmp_path, name="exp", **ready)
    line = str(info.value)
    assert line.startswith(f"scheduler: {message}") and "set max_steps > " in line and "\n" not in line
    assert not (tmp_path / "exp").exists()
    if not isinstance(scheduler, MedianStopping):  # the same line from a YAML file, naming the file
        from nasplat.experiment.file import experiment_kwargs

        with pytest.raises(ValueError, match=re.escape(f"exp.yaml: scheduler: {message}")):
            experiment_kwargs({"trainer": "x:y", "space": "x:z", "metric": "score", "controller": "random",
                               "budget": {"max_trials": 40, "max_steps": max_steps}, "executor": "simulated",
                               "scheduler": scheduler}, source="exp.yaml")
    bigger = nasplat.run(trainer=Counter, space=SPACE, metric="score", executor="simulated", max_trials=6,
                         max_steps=max_steps + 1, scheduler=scheduler, **ready)  # one step more: a rung exists
    assert len(bigger.rows) >= 6


@pytest.mark.parametrize("controller", ["random", "evolution"])
def test_promote_through_the_engine_pauses_frees_slots_and_resumes_trials_from_their_step(tmp_path, controller):
    options = {"population_size": 6, "sample_size": 2} if controller == "evolution" else {}
    result = nasplat.run(trainer=Counter, space=SPACE, metric="score", executor="simulated", concurrency=3,
                         controller=controller, controller_options=options, max_trials=30, max_steps=9, seed=2,
                         scheduler={"name": "asha", "type": "promote"}, storage=tmp_path, name="asha")
    rows = result.rows
    for trial_id in {r["trial_id"] for r in rows}:
        mine = [r for r in rows if r["trial_id"] == trial_id]
        assert [r["step"] for r in mine] == list(range(1, len(mine) + 1))  # no step lost or repeated
        assert [r["t"] for r in mine] == [r["step"] for r in mine]  # a promoted trial continues from its state
        paused_at = [r["step"] for r in mine if r["status"] == "paused"]
        assert paused_at == [s for s in (1, 3) if s <= len(mine) and not (s == len(mine) and mine[-1]["status"]
                                                                          == "completed")]
        # rungs at steps 1 and 3 (index 0, 1), and max_steps 9 (index 2)
        assert [r["rung"] for r in mine] == [0 if s < 3 else 1 if s < 9 else 2 for s in (r["step"] for r in mine)]
    rung0 = [r for r in rows if r["step"] == 1]
    assert len(rung0) == 30 and len([r for r in rows if r["step"] == 2]) <= 30 // 3 + 2
    assert result.counts().get("completed", 0) >= 1
    journal = [json.loads(line) for line in (tmp_path / "asha" / "journal.jsonl").read_text().splitlines()]
    promoted = [e["resume"] for e in journal if "resume" in e]
    assert promoted == [r["trial_id"] for r in rows if r["step"] in (2, 4)]  # each promotion's first row, in order
    meta = json.loads((tmp_path / "asha" / "meta.json").read_text())
    assert meta["schedule"]["rungs"] == [[1, 3]] and meta["controller"] != "ASHA"
    assert read_spec(tmp_path / "asha")["scheduler"] == {"name": "asha", "type": "promote"}


def test_stop_asha_around_evolution_uses_fewer_steps_and_keeps_the_best():
    common = dict(trainer=Counter, space=SPACE, metric="score", executor="simulated", concurrency=2, max_trials=27,
                  max_steps=9, seed=4, controller="evolution", controller_options={"population_size": 6})
    full = nasplat.run(**common)
    asha = nasplat.run(**common, scheduler="asha")
    assert len(asha.rows) < 0.6 * len(full.rows)
    assert asha.counts()["stopped"] >= 10
    assert asha.best["score"] >= sorted(r["score"] for r in full.rows)[-len(full.rows) // 10]  # top decile of full


def test_scheduler_from_yaml(tmp_path):
    from nasplat.experiment.file import experiment_kwargs

    kwargs = experiment_kwargs({"trainer": "x:y", "space": "x:z", "metric": "score", "controller": "random",
                                "budget": {"max_trials": 3, "max_steps": 9}, "executor": "simulated",
                                "scheduler": {"name": "hyperband", "type": "promote"}})
    assert kwargs["scheduler"] == {"name": "hyperband", "type": "promote"} and kwargs["max_steps"] == 9


@pytest.mark.parametrize("scheduler, message", [
    ({"name": "asha", "reduction_factor": 1}, "reduction_factor"),
    ({"name": "hyperband", "type": "pause"}, "type"),
    ({"name": "nope"}, "nope"),
    ({"name": "asha", "grace": 2}, "unknown option(s) ['grace'] for scheduler 'asha'; allowed: ['max_steps', "
                                   "'grace_period', 'reduction_factor', 'brackets', 'type', 'rank_by', 'delayed']"),
])
def test_a_bad_scheduler_option_in_a_file_names_the_file_and_the_scheduler_key(tmp_path, scheduler, message):
    from nasplat.experiment.file import read_experiment

    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump({"trainer": "x:y", "space": "x:z", "metric": "score", "controller": "random",
                                    "budget": {"max_trials": 3}, "executor": "simulated", "scheduler": scheduler}))
    with pytest.raises(ValueError) as info:
        read_experiment(path)
    line = str(info.value)
    assert line.startswith(f"{path}: scheduler: ") and message in line and "\n" not in line


def test_report_draws_the_rungs_and_status_counts_paused_trials(tmp_path, capsys):
    import re

    from nasplat.cli import main
    from nasplat.report import render_report

    result = nasplat.run(trainer=Counter, space=SPACE, metric="score", executor="simulated", concurrency=3,
                         max_trials=30, max_steps=9, seed=2, scheduler={"name": "asha", "type": "promote"},
                         storage=tmp_path, name="asha")
    page = render_report(tmp_path / "asha")
    rungs = re.search(r"<section id='rungs'>(.*?)</section>", page, re.DOTALL).group(1)
    cells = [int(c) for c in re.findall(r"<td>(\d+)</td>", rungs.split("</table>")[0])]
    last_step = {r["trial_id"]: r["step"] for r in result.rows}
    promotions = sum(1 for r in result.rows if r["step"] in (2, 4))
    reached = [sum(s >= step for s in last_step.values()) for step in (1, 3, 9)]
    assert cells[2::6] == reached and sum(cells[4::6]) == promotions  # trials reached, promoted from each rung
    assert f"{promotions} promotions" in rungs and 'aria-label="rung-thresholds"' in rungs
    assert main(["status", str(tmp_path / "asha")]) == 0
    paused = sum(1 for r in result.rows if r["status"] == "paused" and r["step"] == last_step[r["trial_id"]])
    out = capsys.readouterr().out
    assert paused >= 10 and f"{paused} paused" in out and f"{promotions} promotions of paused trials" in out


def test_promote_on_the_ray_executor_resumes_paused_trials_from_their_state(ray_session):
    result = nasplat.run(trainer=Counter, space=SPACE, metric="score", executor="ray", concurrency=2, max_trials=6,
                         max_steps=3, seed=5, scheduler={"name": "asha", "type": "promote"})
    rows = result.rows
    promoted = [r for r in rows if r["step"] == 2]
    assert len([r for r in rows if r["status"] == "paused"]) == 6 and len(promoted) >= 2
    assert all(r["t"] == r["step"] for r in rows)  # a promoted trial went on from its kept state, on another actor
    assert result.counts() == {"paused": 6 - len(promoted), "completed": len(promoted)}


# -- several objectives: rungs ranked by non-dominated sorting (MO-ASHA) -------------------------------------
MO_AT_1 = {0: (.9, 10), 1: (.5, 1), 2: (.8, 12), 3: (.85, 11), 4: (.3, 20), 5: (.2, 30)}  # (accuracy, latency)


def test_a_rung_of_several_objectives_is_ranked_by_fronts_not_by_the_first_metric():
    controller = RandomSearch(SPACE, metric=["acc", "latency"], mode=["max", "min"])
    promote = ASHA(controller, max_steps=9, grace_period=1, reduction_factor=3, type="promote")
    for trial_id, (acc, latency) in MO_AT_1.items():
        promote.ask()
        assert isinstance(promote.on_result(trial_id, Result({"acc": acc, "latency": latency}, 1)), Pause)
    # the front is {0, 1}; by accuracy alone the top two would be 0 and 3
    assert [promote.promote(), promote.promote(), promote.promote()] == [0, 1, None]

    stop = ASHA(RandomSearch(SPACE, metric=["acc", "latency"], mode=["max", "min"]), max_steps=9, type="stop")
    arrivals = [MO_AT_1[t] for t in (0, 2, 3, 4, 1, 5)]
    decisions = []
    for trial_id, (acc, latency) in enumerate(arrivals):
        stop.ask()
        decisions.append(type(stop.on_result(trial_id, Result({"acc": acc, "latency": latency}, 1))).__name__)
    # a trial goes on while it ranks in the top ceil(n/3) of the rung with it. The fifth (.5, 1) is on the front
    # with (.9, 10) and goes on; by accuracy alone Tune's rule would stop it (.5 is below the 2/3 quantile, .85)
    assert decisions == ["Continue", "Stop", "Stop", "Stop", "Continue", "Stop"]


def test_a_constraint_ranks_the_trials_that_break_it_last_at_a_rung():
    controller = RandomSearch(SPACE, metric=["acc", "latency"], mode=["max", "min"], constraints=["latency <= 15"])
    asha = ASHA(controller, max_steps=9, grace_period=1, reduction_factor=3, type="promote")
    stream = {0: (.99, 40), 1: (.6, 5), 2: (.7, 14), 3: (.95, 30), 4: (.1, 2), 5: (.2, 3)}
    for trial_id, (acc, latency) in stream.items():
        asha.ask()
        asha.on_result(trial_id, Result({"acc": acc, "latency": latency}, 1))
    # the four feasible trials form one front; its extremes (most accurate 2, fastest 4) have infinite crowding
    assert [asha.promote(), asha.promote(), asha.promote()] == [2, 4, None]


class TwoScores(Trainer):
    """Accuracy grows with x, latency with x too: every trial is on a trade-off."""

    def setup(self, config, ctx):
        self.x, self.t = config["x"], 0

    def step(self):
        self.t += 1
        return {"acc": self.x + 0.01 * self.t, "latency": 10 * self.x ** 2, "time_cost": 1.0}

    def state_dict(self):
        return {"t": self.t}

    def load_state_dict(self, state):
        self.t = state["t"]


def test_asha_around_multi_objective_evolution_through_the_engine():
    result = nasplat.run(trainer=TwoScores, space=SPACE, metric=["acc", "latency"], mode=["max", "min"],
                         executor="simulated", concurrency=2, controller="mo_evolution",
                         controller_options={"population_size": 6, "sample_size": 3}, max_trials=27, max_steps=9,
                         seed=1, scheduler={"name": "asha", "type": "promote"})
    rows = result.rows
    assert len({r["trial_id"] for r in rows}) == 27
    # every trial is on one front (accuracy and latency both grow with x): crowding decides, extremes first
    assert len([r for r in rows if r["step"] == 9]) < len([r for r in rows if r["step"] == 2]) < 27
    promoted = {r["trial_id"] for r in rows if r["step"] == 2}
    by_acc = sorted({r["trial_id"]: r["acc"] for r in rows if r["step"] == 1}.items(), key=lambda kv: -kv[1])
    # the least accurate trial on rung 0 is on the front too (fastest): a first-metric ranking would never take it
    assert by_acc[-1][0] in promoted


def test_the_readme_states_every_schedulers_options_with_their_defaults():
    import inspect
    from pathlib import Path

    from nasplat.schedulers import SCHEDULERS

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for name in SCHEDULERS:
        bullet = re.search(rf"^- \*\*`{name}`\*\* \(([^)]*)\):", readme, re.MULTILINE)
        assert bullet, f"README has no bullet for scheduler {name!r}"
        stated = dict(re.findall(r"`(\w+)`=(`\w+`|[^,]+)", bullet.group(1).replace("\n", " ")))
        parameters = inspect.signature(SCHEDULERS[name]).parameters
        options = [p for p in parameters.values() if p.name != "controller"]
        assert sorted(stated) == sorted(p.name for p in options), name
        for option in options:
            expected = "the run's" if option.default is inspect.Parameter.empty else str(option.default)
            assert stated[option.name].strip().strip("`") == expected, (name, option.name)
