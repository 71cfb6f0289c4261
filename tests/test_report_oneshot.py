"""The report's weight-sharing section: supernet training curve, path search, inherited against standalone (issue 20)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from scipy.stats import kendalltau

import nasplat
from nasplat.cli import main
from nasplat.oneshot import SharedWeights, search_trainer
from nasplat.report import render_report
from search_spaces import nb201
from trainers.supernet import NB201PathTrainer

SMALL = {"channels": 4, "train_size": 640}
PATHS = 12


def section(page: str, name: str) -> str:
    match = re.search(rf"<section id='{name}'>(.*?)</section>", page, re.DOTALL)
    assert match, f"no section {name!r} in the report"
    return match.group(1)


def cell(config: dict[str, Any]) -> tuple[str, ...]:
    return tuple(config[edge] for edge in nb201.EDGES)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A supernet trained 2 epochs, a random search of its paths, and standalone trainings of random cells (both
    searches seeded alike, so that they share cells)."""
    storage = tmp_path_factory.mktemp("oneshot-report")
    supernet = nasplat.run(trainer="trainers.supernet:NB201SupernetTrainer",
                           space={**SMALL, "epochs": 2, "eval_paths": 2}, metric="valid_acc", max_trials=1,
                           max_steps=2, storage=storage, name="supernet", checkpoint=True)
    trainer = search_trainer(NB201PathTrainer, SharedWeights.load(supernet), SMALL)
    nasplat.run(trainer=trainer, space=nb201.space, metric="valid_acc", controller="random", seed=0,
                max_trials=PATHS, max_steps=1, storage=storage, name="paths")
    nasplat.run(trainer="trainers.nb201_cell:NB201CellTrainer",
                space={**nb201.space.domains, "channels": 4, "train_size": 320, "epochs": 1}, metric="valid_acc",
                controller="random", seed=0, max_trials=PATHS, max_steps=1, storage=storage, name="standalone")
    return {name: storage / name for name in ("supernet", "paths", "standalone")}


def test_supernet_training_is_drawn_with_the_paths_it_trained(folders: dict[str, Path]) -> None:
    rows = nasplat.ExperimentResult.load(folders["supernet"]).rows
    body = section(render_report(folders["supernet"]), "weight-sharing")
    assert 'aria-label="supernet-curves"' in body
    assert f"1 trial(s); {int(rows[-1]['paths_trained'])} paths trained in all" in body
    assert 'aria-label="path-search"' not in body  # training, not a search over shared weights
    plain = section(render_report(folders["standalone"]), "weight-sharing")
    assert "No supernet training" in plain and "<svg" not in plain


def test_the_search_over_shared_weights_is_drawn_with_its_best_path(folders: dict[str, Path]) -> None:
    result = nasplat.ExperimentResult.load(folders["paths"])
    body = section(render_report(folders["paths"]), "weight-sharing")
    assert 'aria-label="path-search"' in body and f"{PATHS} paths judged" in body
    assert f"Best: trial {result.best['trial_id']}, valid_acc {result.best['valid_acc']:.4g}" in body


def test_inherited_against_a_standalone_folder_with_its_rank_correlation(folders: dict[str, Path]) -> None:
    inherited = {cell(r["config"]): r["valid_acc"] for r in nasplat.ExperimentResult.load(folders["paths"]).rows}
    standalone = {cell(r["config"]): r["valid_acc"]
                  for r in nasplat.ExperimentResult.load(folders["standalone"]).rows}
    shared = sorted(set(inherited) & set(standalone))
    assert len(shared) >= 3  # the two searches were seeded alike
    tau = kendalltau([inherited[c] for c in shared], [standalone[c] for c in shared]).statistic
    body = section(render_report(folders["paths"], ground_truth=folders["standalone"]), "weight-sharing")
    assert 'aria-label="inherited-vs-standalone"' in body
    assert f"over the {len(shared)} architectures both have: Kendall tau {tau:+.3f}" in body


def test_a_table_is_a_ground_truth_too_and_bad_ones_are_refused_in_one_line(folders: dict[str, Path],
                                                                             tmp_path: Path, capsys: Any) -> None:
    rows = nasplat.ExperimentResult.load(folders["paths"]).rows[:5]
    table = tmp_path / "truth.jsonl"  # made-up standalone accuracies, the reverse of the inherited order
    ranked = sorted(rows, key=lambda r: r["valid_acc"])
    table.write_text("".join(json.dumps({**{e: r["config"][e] for e in nb201.EDGES}, "acc": 0.9 - 0.1 * i}) + "\n"
                             for i, r in enumerate(ranked)))
    body = section(render_report(folders["paths"], ground_truth=table, ground_truth_metric="acc"), "weight-sharing")
    distinct = len({r["valid_acc"] for r in rows})
    expected = kendalltau([r["valid_acc"] for r in ranked], [0.9 - 0.1 * i for i in range(5)]).statistic
    assert distinct >= 2 and expected < 0
    assert f"over the 5 architectures both have: Kendall tau {expected:+.3f}" in body
    broken = tmp_path / "broken.csv"
    broken.write_text("1<-0,acc\nnone,0.5\n")
    with pytest.raises(ValueError, match=r"lacks \['2<-0', '2<-1', '3<-0', '3<-1', '3<-2'\]: it needs a column"):
        render_report(folders["paths"], ground_truth=broken, ground_truth_metric="acc")
    assert main(["report", str(folders["paths"]), "--ground-truth", str(tmp_path / "truth.txt")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "the ground truth must be an experiment folder or a table file" in err
    assert main(["report", str(folders["paths"]), "--ground-truth", str(table), "--ground-truth-metric", "acc"]) == 0
    assert "Kendall tau" in (folders["paths"] / "report.html").read_text()
