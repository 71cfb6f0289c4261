"""NAS-Bench-201: the cell space, the arch strings, the table objective, the network, the search protocol."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import nasplat
from search_spaces.nb201 import EDGES, OPS, build_network, from_arch_str, space, space_for, to_arch_str
from trainers.nb201_table import NB201Protocol, NB201Table, best_possible, cell_code, load_table

ARCH = "|nor_conv_3x3~0|+|nor_conv_3x3~0|avg_pool_3x3~1|+|skip_connect~0|nor_conv_3x3~1|skip_connect~2|"

REPO = Path(__file__).resolve().parents[1]


def test_arch_strings_round_trip_for_every_cell_of_the_table(shared_data):
    frame = pd.read_csv(shared_data / "nb201.csv")
    assert len(frame) == 15_625
    for arch in frame["arch"]:
        config = from_arch_str(arch)
        space.validate(config)
        assert to_arch_str(config) == arch
    assert len({cell_code(from_arch_str(a)) for a in frame["arch"]}) == 15_625


@pytest.mark.parametrize("bad", ["", "|conv~0|+|a~0|b~1|+|x~0|y~1|z~2|",
                                 "|none~1|+|none~0|none~1|+|none~0|none~1|none~2|",
                                 "|none~0|+|none~0|+|none~0|none~1|none~2|"])
def test_malformed_arch_strings_are_rejected_by_name(bad):
    with pytest.raises(ValueError, match="arch|edge|node"):
        from_arch_str(bad)


def test_table_lookup_matches_the_csv_and_the_protocol(shared_data):
    frame = pd.read_csv(shared_data / "nb201.csv").set_index("arch")
    trainer = NB201Table()
    trainer.setup(from_arch_str(ARCH), nasplat.WorkerContext())
    metrics = trainer.step()
    row = frame.loc[ARCH]
    assert metrics["valid_acc"] == pytest.approx(row.cifar10_valid_acc_12ep)
    assert metrics["test_acc"] == pytest.approx(row.cifar10_test_acc_200ep)
    assert metrics["time_cost"] == pytest.approx(12 * row.cifar10_train_s_per_epoch + row.cifar10_valid_s_per_epoch)
    assert best_possible("cifar10") == pytest.approx(94.37, abs=0.01)
    assert best_possible("cifar100") == pytest.approx(73.51, abs=0.01)
    c100 = load_table("cifar100")
    code = cell_code(from_arch_str(ARCH))
    assert c100["time_cost"][code] == pytest.approx(2 * metrics["time_cost"])
    with pytest.raises(ValueError, match="unknown NAS-Bench-201 dataset 'imagenet'"):
        load_table("imagenet")


def test_network_builder_runs_every_operation_and_zero_cells_cut_the_path():
    config = {edge: OPS[i % len(OPS)] for i, edge in enumerate(EDGES)}
    net = build_network(config, num_classes=10, cells_per_stage=1)
    out = net(torch.randn(2, 3, 16, 16))
    assert out.shape == (2, 10) and torch.isfinite(out).all()
    dead = build_network({edge: "none" for edge in EDGES}, cells_per_stage=1)
    assert sum(p.numel() for p in dead.parameters()) < sum(p.numel() for p in net.parameters())


def test_simulated_evolution_beats_random_on_the_table(shared_data):
    def search(controller: str, options: dict, seed: int) -> float:
        result = nasplat.run(trainer=NB201Protocol, space=space_for("cifar10"), controller=controller,
                             controller_options=options, metric="valid_acc", executor="simulated",
                             time_budget_s=12_000, seed=seed)
        return result.best["test_acc"]

    rea = np.mean([search("evolution", {"population_size": 10, "sample_size": 3}, s) for s in range(100)])
    rnd = np.mean([search("random", {}, s) for s in range(100)])
    assert rea > rnd
    assert 93.6 < rea < 94.2 and 93.4 < rnd < 94.0


def test_benchmark_prints_the_table_and_a_json_last_line(shared_data):
    out = subprocess.run([sys.executable, "benchmarks/nb201.py", "--runs", "20", "--predictor-runs", "3",
                          "--datasets", "cifar10"], capture_output=True, text=True, check=True, cwd=REPO).stdout
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["dataset"] == "cifar10" and summary["runs"] == 20
    published = {"rea": 93.92, "reinforce": 93.85, "random": 93.70}  # the paper's Table 5 (std 0.30-0.37)
    for algorithm, paper in published.items():
        mean, std = summary[algorithm]["mean"], summary[algorithm]["std"]
        assert abs(mean - paper) < 0.4 and 0.1 < std < 0.8, (algorithm, mean, std)  # 20 runs: ~4 standard errors
        # The printed line puts our mean beside the paper's and their difference, computed from these numbers.
        line = re.search(rf"^{algorithm}\s+20\s+([0-9.]+) ± ([0-9.]+)\s+[0-9.]+\s+[0-9.]+\s+([0-9.]+) ± [0-9.]+\s+"
                         r"([+-][0-9.]+)$", out, re.M)
        assert line is not None, out
        shown, shown_std, shown_paper, diff = map(float, line.groups())
        assert shown == pytest.approx(mean, abs=0.006) and shown_std == pytest.approx(std, abs=0.006)
        assert shown_paper == paper
        assert diff == pytest.approx(mean - paper, abs=0.006)
    best = 94.373  # the table's best 200-epoch test accuracy on CIFAR-10
    local = summary["local_search"]  # ~94.17 +- 0.27 at 500 runs: 20 runs land within ~4 standard errors of it
    assert local["runs"] == 20 and 60 < local["evals"] < 140 and 93.9 < local["mean"] <= best, local
    predictor = summary["predictor"]
    assert predictor["runs"] == 3 and 93.0 < predictor["mean"] <= best, predictor
