"""`nasplat retrain`: a search's chosen cell trained standalone from scratch, exported and loaded back (issue 20)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import nasplat
from nasplat.cli import main
from nasplat.oneshot import measure
from search_spaces import nb201
from search_spaces.nb201_supernet import build_subnet
from trainers.supernet import signal_data


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GDAS search of two epochs on a small supernet, recorded in a folder."""
    storage = tmp_path_factory.mktemp("retrain")
    nasplat.run(trainer="trainers.supernet:NB201DartsTrainer", space={"channels": 4, "epochs": 2, "train_size": 640},
                metric="valid_acc", max_trials=1, max_steps=2, storage=storage, name="gdas")
    return storage / "gdas"


def test_the_derived_cell_is_retrained_exported_and_loads_into_a_standalone_network(searched, tmp_path, capsys):
    derived = json.loads(nasplat.ExperimentResult.load(searched).rows[-1]["arch"])
    assert main(["retrain", str(searched), "--epochs", "2", "--quiet", "--name", "again"]) == 0
    folder = searched.parent / "again"
    assert f"results: {folder}" in capsys.readouterr().out
    rows = nasplat.ExperimentResult.load(folder).rows
    assert [r["step"] for r in rows] == [1, 2] and rows[-1]["status"] == "completed"
    assert {e: rows[-1]["config"][e] for e in nb201.EDGES} == derived  # the cell GDAS derived, from scratch
    out = tmp_path / "cell.pt"
    assert main(["export", str(folder), "-o", str(out)]) == 0
    saved = torch.load(out, weights_only=False)
    data = signal_data("mnist1d")
    assert saved["config"]["channels"] == 4  # the search's width, carried to the retrain (issue 30)
    net = build_subnet(saved["config"], data.in_channels, data.num_classes, channels=saved["config"]["channels"])
    net.load_state_dict(saved["state_dict"]["model"])
    _, accuracy = measure(net, data.x_valid, data.y_valid)
    assert accuracy == pytest.approx(rows[-1]["valid_acc"], abs=1e-6)  # the trained network, back


def test_retrain_picks_a_named_trial_and_refuses_bad_input_in_one_line(searched, tmp_path, capsys):
    assert main(["retrain", str(searched), "--trial", "7", "--quiet"]) == 2
    assert capsys.readouterr().err.strip().endswith("`trial` must be a trial of "
                                                    f"{searched.resolve()}, got trial=7 (trials: [0])")
    assert main(["retrain", str(tmp_path / "nowhere"), "--quiet"]) == 2
    assert "is not an experiment folder" in capsys.readouterr().err
    plain = nasplat.run(trainer="trainers.pbt_toy:PBTToy", space={"h0": 0.5, "h1": 0.5, "lr": 0.01}, metric="Q",
                        max_trials=1, storage=tmp_path, name="toy")
    assert plain.rows and main(["retrain", str(tmp_path / "toy"), "--quiet"]) == 2
    assert "names no standalone trainer (RETRAIN_TRAINER): give one with --trainer module:Class" in \
        capsys.readouterr().err
