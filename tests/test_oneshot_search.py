"""Zero-cost proxies of untrained cells, and gradient-based search (DARTS first order, GDAS) on MNIST-1D (< 60 s)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from nasplat.oneshot import PROXIES, ArchitectureWeights, DartsTrainer, naswot, score, unused_parameters
from nasplat.oneshot.proxies import activation_kernel
from nasplat.trainer import WorkerContext, start
from search_spaces import nb201
from search_spaces.nb201_supernet import NB201Supernet
from trainers.classification import load_dataset
from trainers.supernet import NB201DartsTrainer

CONV = {e: "nor_conv_3x3" for e in nb201.EDGES}
SKIP = {e: "skip_connect" for e in nb201.EDGES}
POOL = {**SKIP, "3<-0": "avg_pool_3x3", "2<-1": "avg_pool_3x3"}


@pytest.fixture(scope="module")
def batch() -> tuple[torch.Tensor, torch.Tensor]:
    data = load_dataset("mnist1d")
    return data.x_train[:64], data.y_train[:64]


@pytest.fixture(scope="module")
def untrained() -> NB201Supernet:
    torch.manual_seed(0)
    return NB201Supernet()


@pytest.mark.parametrize("name", list(PROXIES))
def test_each_proxy_is_a_finite_number_that_tells_two_cells_apart(name: str, untrained: NB201Supernet,
                                                                 batch: tuple[torch.Tensor, torch.Tensor]) -> None:
    x, y = batch
    before = {k: v.clone() for k, v in untrained.state_dict().items()}
    scores = {label: score(name, untrained, x, y, config=config)
              for label, config in (("conv", CONV), ("skip", SKIP), ("pool", POOL))}
    assert all(math.isfinite(s) for s in scores.values()), scores
    assert len(set(scores.values())) == 3, scores
    assert score(name, untrained, x, y, config=CONV) == scores["conv"]  # a function of its arguments
    assert all(torch.equal(before[k], v) for k, v in untrained.state_dict().items())  # the caller's weights kept
    plain = untrained.extract(CONV)  # a plain module scores as its path does
    assert score(name, plain, x, y) == pytest.approx(scores["conv"], rel=1e-6)


def test_synflow_and_naswot_rank_the_parametric_cell_above_the_bare_one(
        untrained: NB201Supernet, batch: tuple[torch.Tensor, torch.Tensor]) -> None:
    """The definitions' sense: convolutions add synaptic paths (synflow) and ReLU units separating the inputs
    (NASWOT's kernel grows by the codes of every unit)."""
    x, y = batch
    assert score("synflow", untrained, x, y, config=CONV) > score("synflow", untrained, x, y, config=SKIP)
    assert score("naswot", untrained, x, y, config=CONV) > score("naswot", untrained, x, y, config=SKIP)
    kernel = activation_kernel(untrained.extract(CONV), x)
    assert torch.equal(kernel, kernel.T) and len(set(kernel.diagonal().tolist())) == 1  # K[i, i] = all units
    assert naswot(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(40, 5)), x) == -math.inf  # no ReLU


def make(config: dict, seed: int = 0) -> DartsTrainer:
    return start(NB201DartsTrainer(), config, WorkerContext(seed=seed))


def test_darts_first_order_moves_alpha_and_derives_a_config_of_the_space() -> None:
    trainer = make({"method": "darts", "epochs": 2, "warmup_epochs": 0, "train_size": 640})
    initial = [a.detach().clone() for a in trainer.alpha.alphas]
    rows = [trainer.step() for _ in range(2)]
    moved = max((a.detach() - b).abs().max().item() for a, b in zip(trainer.alpha.alphas, initial))
    assert moved > 0.01, moved
    derived = json.loads(rows[-1]["arch"])
    assert derived == trainer.derived() and nb201.space.accepts(derived) and "none" not in derived.values()
    assert rows[-1]["parameter_free"] == sum(not o.startswith("nor_conv") for o in derived.values())
    assert rows[-1]["done"] is True and "done" not in rows[0] and rows[0]["tau"] == 10.0
    assert all(math.isfinite(rows[-1][k]) for k in ("train_loss", "arch_loss", "valid_acc", "alpha_entropy"))
    # The argmax leaves `none` out even where its alpha is the largest.
    with torch.no_grad():
        for alpha in trainer.alpha.alphas:
            alpha[0] = 100.0
    assert "none" not in trainer.derived().values() and trainer.alpha.derive(exclude=()) == {
        e: "none" for e in nb201.EDGES}


def test_gdas_runs_one_sampled_candidate_per_edge_with_gradients_for_every_alpha(
        batch: tuple[torch.Tensor, torch.Tensor]) -> None:
    torch.manual_seed(0)
    net, (x, y) = NB201Supernet(), batch
    weights = ArchitectureWeights(net)
    sample = weights.gumbel(1.0, torch.Generator().manual_seed(5))
    again = weights.gumbel(1.0, torch.Generator().manual_seed(5))
    assert all(torch.equal(sample[k], again[k]) for k in sample)  # seeded: the same on every rank
    for w in sample.values():
        assert torch.allclose(w.detach(), torch.nn.functional.one_hot(w.detach().argmax(), 5).float(), atol=1e-6)
    net.mix(sample, hard=True).train()
    torch.nn.functional.cross_entropy(net(x), y).backward()
    assert all(a.grad is not None and torch.count_nonzero(a.grad) == 5 for a in weights.alphas)
    unused = unused_parameters(net)
    assert unused and all(p.grad is None for p in unused)  # the other candidates never ran
    chosen = {k: nb201.OPS[int(w.argmax())] for k, w in sample.items()}
    assert net.selected() == dict.fromkeys(nb201.EDGES) and nb201.space.accepts(chosen)


def test_a_darts_trial_resumed_from_its_state_goes_on_unchanged() -> None:
    config = {"method": "gdas", "epochs": 3, "warmup_epochs": 1, "train_size": 320}
    straight = make(config, seed=2)
    expected = [straight.step() for _ in range(2)][1]
    first = make(config, seed=2)
    first.step()
    resumed = make(config, seed=2)
    resumed.load_state_dict(first.state_dict())
    row = resumed.step()
    assert {k: row[k] for k in ("train_loss", "arch_loss", "arch", "valid_acc")} == {
        k: expected[k] for k in ("train_loss", "arch_loss", "arch", "valid_acc")}


@pytest.mark.parametrize("seed", [0, 1])
def test_gdas_does_not_collapse_onto_parameter_free_operations(seed: int) -> None:
    """Eight epochs (four of warm-up) on MNIST-1D: the derived cell keeps convolutions. (Without a warm-up a
    short GDAS search may end all skip/pool; DARTS's collapse takes longer than a test can wait.)"""
    trainer = make({"method": "gdas", "epochs": 8, "warmup_epochs": 4, "lr": 0.05}, seed=seed)
    rows = [trainer.step() for _ in range(8)]
    derived = json.loads(rows[-1]["arch"])
    assert rows[-1]["parameter_free"] < len(nb201.EDGES), derived
    assert rows[-1]["valid_acc"] > 0.3 and rows[-1]["alpha_entropy"] < rows[3]["alpha_entropy"]
