"""Issue 30: a one-shot search as plain data, retrain with the searched settings, wrong setups refused in one line.

Every test here fails on 64a0d06: the path search had no reference to its supernet (a pickled `search_trainer`
class), retrain dropped the searched settings, and each wrong setup ran (or failed later, or blocked a retry).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import nasplat
from nasplat.cli import main
from nasplat.oneshot import SharedWeights, search_trainer
from nasplat.space import Choice, Space
from nasplat.storage import SPEC_JSON, SPEC_PICKLE
from nasplat.trainer import Trainer, WorkerContext
from search_spaces import nb201
from search_spaces.nb201_supernet import NB201Supernet
from trainers.pbt_toy import PBTToy
from trainers.supernet import NB201PathTrainer

SUPERNET = {"dataset": "digits", "channels": 4, "train_size": 256, "eval_paths": 1}
CELL = {"1<-0": "nor_conv_3x3", "2<-0": "skip_connect", "2<-1": "nor_conv_1x1", "3<-0": "avg_pool_3x3",
        "3<-1": "none", "3<-2": "nor_conv_3x3"}


def cell_params(cell: dict[str, Any], channels: int) -> int:
    """The parameter count of a cell as the digits supernet of `channels` extracts it (8 signals, 10 classes)."""
    return sum(p.numel() for p in NB201Supernet(8, 10, channels=channels).extract(cell).parameters())


@pytest.fixture(scope="module")
def supernet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One epoch of the NAS-Bench-201 supernet on digits at 4 channels, checkpointed."""
    storage = tmp_path_factory.mktemp("setups")
    nasplat.run(trainer="trainers.supernet:NB201SupernetTrainer", space={**SUPERNET, "epochs": 1},
                metric="valid_acc", max_trials=1, max_steps=1, storage=storage, name="supernet", checkpoint=True)
    return storage / "supernet"


@pytest.fixture(scope="module")
def search(supernet: Path) -> Path:
    """A path search naming the supernet by reference: a space of parts, the search space and the reference."""
    nasplat.run(trainer="trainers.supernet:NB201PathTrainer", space=["search_spaces.nb201:space",
                                                                     {"supernet": str(supernet)}],
                metric="valid_acc", controller="random", max_trials=4, storage=supernet.parent, name="search")
    return supernet.parent / "search"


def test_a_path_search_names_its_supernet_by_reference_and_its_folder_is_plain_json(search: Path,
                                                                                    supernet: Path) -> None:
    assert (search / SPEC_JSON).exists() and not list(search.rglob("*.pkl"))
    rows = nasplat.ExperimentResult.load(search).rows
    assert len(rows) == 4 and all(r["status"] == "completed" for r in rows)
    for row in rows:  # each row records the supernet it was judged by, with the supernet's settings
        assert row["supernet_trial"] == 0 and row["supernet_step"] == 1 and row["config"]["supernet"] == str(supernet)
        assert json.loads(row["supernet_config"]) == {**SUPERNET, "epochs": 1}
        cell = {e: row["config"][e] for e in nb201.EDGES}
        assert row["params"] == cell_params(cell, channels=4)  # the digits supernet at 4 channels, not the default


def test_retrain_builds_the_searched_network_on_the_searched_data(search: Path) -> None:
    result = nasplat.retrain(search, epochs=1, name="search-again")
    best = nasplat.ExperimentResult.load(search).best
    row = result.rows[-1]
    assert row["status"] == "completed" and [r["step"] for r in result.rows] == [1]  # bounded by its epochs
    assert {k: row["config"][k] for k in ("dataset", "channels")} == {"dataset": "digits", "channels": 4}
    assert {e: row["config"][e] for e in nb201.EDGES} == {e: best["config"][e] for e in nb201.EDGES}
    assert row["params"] == best["params"] == cell_params({e: best["config"][e] for e in nb201.EDGES}, 4)
    assert "supernet" not in row["config"]  # the reference stays with the search


def test_retrain_refuses_a_network_other_than_the_searched_path(search: Path) -> None:
    with pytest.raises(ValueError, match=r"built a network of [\d,]+ parameters .* but the searched path has "
                                         r"[\d,]+: the retrain would not train the searched network"):
        nasplat.retrain(search, epochs=1, config={"channels": 16}, name="too-wide")
    assert not (search.parent / "too-wide").exists()


def test_a_gdas_search_is_retrained_at_its_width_on_its_data(tmp_path: Path) -> None:
    nasplat.run(trainer="trainers.supernet:NB201DartsTrainer", space={**SUPERNET, "epochs": 1}, metric="valid_acc",
                max_trials=1, max_steps=1, storage=tmp_path, name="gdas")
    arch = json.loads(nasplat.ExperimentResult.load(tmp_path / "gdas").rows[-1]["arch"])
    row = nasplat.retrain(tmp_path / "gdas", epochs=1).rows[-1]
    assert row["config"] == {"dataset": "digits", "channels": 4, **arch, "epochs": 1}
    assert row["params"] == cell_params(arch, channels=4)


def test_a_supernet_trainer_refuses_a_space_of_path_decisions_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"NB201SupernetTrainer: the space's decisions \['1<-0', '2<-0', '2<-1', "
                                         r"'3<-0', '3<-1', '3<-2'\] are not settings of the supernet it trains"):
        nasplat.run(trainer="trainers.supernet:NB201SupernetTrainer", space={**nb201.space.domains, **SUPERNET},
                    metric="valid_acc", max_trials=1, storage=tmp_path, name="wrong")
    assert not (tmp_path / "wrong").exists()


def test_an_epoch_count_beyond_max_steps_is_refused(tmp_path: Path) -> None:
    for trainer, space in (("trainers.supernet:NB201SupernetTrainer", {**SUPERNET, "epochs": 60}),
                           ("trainers.supernet:NB201DartsTrainer", SUPERNET),  # its own default: 20 epochs
                           ("trainers.nb201_cell:NB201CellTrainer", {**CELL, "epochs": Choice([1, 5])})):
        with pytest.raises(ValueError, match=r"epochs=(60|20|5) but max_steps=1: a trial trains one epoch a step "
                                             r"and would be recorded completed after 1 of its"):
            nasplat.run(trainer=trainer, space=space, metric="valid_acc", max_trials=1, storage=tmp_path, name="e")
        assert not (tmp_path / "e").exists()


def test_a_path_space_that_is_not_the_supernets_is_refused_before_anything_runs(supernet: Path) -> None:
    short = {e: Choice(list(nb201.OPS)) for e in nb201.EDGES[:-1]}
    cases = [({**short, "supernet": str(supernet)}, r"the search space has no decisions \['3<-2'\] of the supernet"),
             ({**nb201.space.domains, "1<-0": Choice(["nor_conv_5x5"]), "supernet": str(supernet)},
              r"the search space's '1<-0' offers \['nor_conv_5x5'\], which the supernet does not have"),
             ({**nb201.space.domains, "supernet": str(supernet), "channels": 8},
              r"the supernet weights .* do not fit the supernet built with .*'channels': 8.*: \d+ shapes differ"),
             ({**nb201.space.domains, "supernet": str(supernet), "supernet_trial": 3},
              r"`supernet_trial` must be one of its trials \[0\], got 3"),
             (nb201.space, r"NB201PathTrainer needs the supernet it searches: give `supernet: <its experiment "
                           r"folder>`")]
    for space, message in cases:
        with pytest.raises(ValueError, match=message):
            nasplat.run(trainer="trainers.supernet:NB201PathTrainer", space=space, metric="valid_acc", max_trials=2,
                        storage=supernet.parent, name="bad-paths")
        assert not (supernet.parent / "bad-paths").exists()


def test_retrain_of_a_supernet_training_is_refused_in_one_line(supernet: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["retrain", str(supernet), "--epochs", "1", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("trained a supernet (NB201SupernetTrainer), it chose no architecture: search its paths "
                        "first (a path trainer with `supernet: <this folder>`) and retrain that") and "\n" not in err
    assert not (supernet.parent / "supernet-retrain").exists()


def test_a_failed_retrain_never_blocks_a_retry(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nasplat.run(trainer="trainers.pbt_toy:PBTToy", space={"h0": 0.5, "h1": 0.5, "lr": 0.01}, metric="Q",
                max_trials=1, storage=tmp_path, name="toy")
    assert main(["retrain", str(tmp_path / "toy"), "--epochs", "1", "--quiet",
                 "--trainer", "test_oneshot_setups:BrokenToy"]) == 1
    assert main(["retrain", str(tmp_path / "toy"), "--epochs", "1", "--quiet",
                 "--trainer", "trainers.pbt_toy:PBTToy"]) == 0
    assert f"the earlier retrain in {tmp_path / 'toy-retrain'} failed; moved to" in capsys.readouterr().err
    assert nasplat.ExperimentResult.load(tmp_path / "toy-retrain").rows[-1]["status"] == "completed"
    failed = nasplat.ExperimentResult.load(tmp_path / "toy-retrain.failed-1").rows
    assert failed[-1]["status"] == "failed" and "broken on purpose" in failed[-1]["error"]


def test_retrain_is_bounded_by_its_epochs_and_says_so_when_it_cannot_tell(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    nasplat.run(trainer="trainers.pbt_toy:PBTToy", space={"h0": 0.5, "h1": 0.5, "lr": 0.01}, metric="Q",
                max_trials=1, storage=tmp_path, name="toy")
    assert main(["retrain", str(tmp_path / "toy"), "--trainer", "trainers.pbt_toy:PBTToy", "--quiet"]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "cannot tell how many steps the retrain runs: PBTToy declares no DEFAULT_EPOCHS and no epochs were given; "
        "give --epochs or --max-steps")
    assert main(["retrain", str(tmp_path / "toy"), "--trainer", "trainers.pbt_toy:PBTToy", "--epochs", "1",
                 "--quiet"]) == 0  # PBTToy never reports `done`: one step, not 10,000
    assert [r["step"] for r in nasplat.ExperimentResult.load(tmp_path / "toy-retrain").rows] == [1]


class BrokenToy(PBTToy):
    """The toy trainer, except that its first step fails."""

    def step(self) -> dict[str, Any]:
        raise RuntimeError("broken on purpose")


class Arch(Trainer):
    """Reports a derived architecture that is not JSON."""

    def setup(self, config: dict[str, Any], ctx: WorkerContext) -> None:
        pass

    def step(self) -> dict[str, Any]:
        return {"score": 1.0, "arch": "{'1<-0': broken", "done": True}


FLAT = Space({"h0": Choice([0.1, 0.2, 0.3, 0.4]), "h1": 0.5, "lr": 0.01})


class Flat(Trainer):
    """Every config scores the same."""

    RETRAIN_TRAINER = "trainers.pbt_toy:PBTToy"

    def setup(self, config: dict[str, Any], ctx: WorkerContext) -> None:
        pass

    def step(self) -> dict[str, Any]:
        return {"score": 0.5, "done": True}


def test_a_malformed_arch_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nasplat.run(trainer="test_oneshot_setups:Arch", space={"x": 1}, metric="score", max_trials=1,
                storage=tmp_path, name="arch")
    assert main(["retrain", str(tmp_path / "arch"), "--trainer", "trainers.pbt_toy:PBTToy", "--epochs", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.endswith(f"{tmp_path / 'arch'}: trial 0's `arch` must be a JSON object of the "
                                            "architecture's decisions, got \"{'1<-0': broken\" (Expecting property "
                                            "name enclosed in double quotes: line 1 column 2 (char 1))")
    assert not (tmp_path / "arch-retrain").exists()


def test_a_tie_for_the_best_goes_to_the_earliest_trial_and_is_said(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    result = nasplat.run(trainer="test_oneshot_setups:Flat", space="test_oneshot_setups:FLAT", metric="score",
                         controller="random", max_trials=4, storage=tmp_path, name="flat")
    assert result.tied_best() == [0, 1, 2, 3] and result.best["trial_id"] == 0
    retrained = nasplat.retrain(tmp_path / "flat", epochs=1)
    assert retrained.rows[-1]["config"]["h0"] == result.rows[0]["config"]["h0"]  # trial 0's
    assert ("nasplat retrain: trials [0, 1, 2, 3] tie for the best score=0.5; the earliest, trial 0, is retrained "
            "(ties go to the earliest trial)") in capsys.readouterr().err


def test_retrain_of_a_pickled_experiment_needs_trust(supernet: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    trainer = search_trainer(NB201PathTrainer, SharedWeights.load(nasplat.ExperimentResult.load(supernet)),
                             {**SUPERNET, "epochs": 1})
    nasplat.run(trainer=trainer, space=nb201.space, metric="valid_acc", max_trials=2, storage=tmp_path, name="pkl")
    assert (tmp_path / "pkl" / SPEC_PICKLE).exists()
    assert main(["retrain", str(tmp_path / "pkl"), "--epochs", "1", "--quiet"]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "stored as a pickle that runs code when loaded; refusing to load it. If you trust whoever made this folder, "
        "pass --trust-pickle (Python: allow_pickle=True)")
    assert not (tmp_path / "pkl-retrain").exists()
    assert main(["retrain", str(tmp_path / "pkl"), "--epochs", "1", "--quiet", "--trust-pickle"]) == 0
    row = nasplat.ExperimentResult.load(tmp_path / "pkl-retrain").rows[-1]
    assert row["config"]["channels"] == 4 and row["config"]["dataset"] == "digits"  # the class's supernet_config
