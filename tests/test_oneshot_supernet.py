"""Supernets (`nasplat.oneshot`): decisions as layers, the space they make, paths extracted, paths sampled (< 20 s)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from nasplat.oneshot import (
    ChoiceInput,
    ChoiceLayer,
    FairSampler,
    Supernet,
    UniformSampler,
    drop_unused_grads,
    extract,
    set_touch,
    unused_parameters,
)
from nasplat.space import Choice, Space
from search_spaces import nb201
from search_spaces.nb201_supernet import NB201Supernet
from trainers.classification import load_dataset

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def signals() -> torch.Tensor:
    return load_dataset("mnist1d").x_valid[:128]


@pytest.fixture(scope="module")
def supernet(signals: torch.Tensor) -> NB201Supernet:
    """A supernet whose batch-norm statistics are not the initial ones (a few paths run in train mode)."""
    torch.manual_seed(0)
    net = NB201Supernet()
    rng = np.random.default_rng(0)
    with torch.no_grad():
        for _ in range(5):
            net.select(nb201.space.sample(rng)).train()(signals)
    return net


def test_the_supernet_space_has_exactly_the_decisions_of_nb201(supernet: NB201Supernet) -> None:
    space = supernet.space()
    assert list(space.domains) == list(nb201.space.domains) == list(nb201.EDGES)
    for key, domain in space.domains.items():
        assert isinstance(domain, Choice) and domain.options == nb201.space.domains[key].options == list(nb201.OPS)
    assert space.cardinalities() == nb201.space.cardinalities()
    config = nb201.space.sample(np.random.default_rng(3))
    assert space.encode(config) == nb201.space.encode(config)  # encodings (RL, predictor) apply unchanged
    forbidden = supernet.space(forbidden=nb201.connected_space.forbidden)
    assert not forbidden.allows({edge: "none" for edge in nb201.EDGES})


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_an_extracted_subnet_gives_the_supernet_outputs_and_holds_only_its_path(supernet: NB201Supernet,
                                                                                signals: torch.Tensor,
                                                                                seed: int) -> None:
    config = nb201.space.sample(np.random.default_rng(seed))
    subnet = supernet.extract(config)
    assert not any(isinstance(m, ChoiceLayer) for m in subnet.modules())
    supernet.eval()
    subnet.eval()
    with torch.no_grad():
        assert torch.equal(supernet.select(config)(signals), subnet(signals))
    # Exactly the path's weights: those outside the cells' candidates plus each chosen candidate's, as copies.
    path = {id(p) for p in supernet.parameters()} - {id(p) for p in unused_parameters(supernet)}
    assert sum(p.numel() for p in subnet.parameters()) == sum(p.numel() for p in supernet.parameters()
                                                              if id(p) in path)
    assert not {id(p) for p in subnet.parameters()} & {id(p) for p in supernet.parameters()}
    conv_edges = [e for e, o in config.items() if o.startswith("nor_conv")]
    if conv_edges:
        edge = conv_edges[0]
        mine = subnet.body[2].edges[edge.replace("<-", "_")][1].weight  # body[2]: the first cell
        theirs = supernet.body[2].edges[edge.replace("<-", "_")].candidates[config[edge]][1].weight
        assert torch.equal(mine, theirs)
        with torch.no_grad():
            mine.add_(1.0)
        assert not torch.equal(mine, theirs)  # a copy: the supernet is not written through the subnet


def test_the_unpruned_and_pruned_cells_differ_in_parameters(supernet: NB201Supernet) -> None:
    big = sum(p.numel() for p in supernet.extract({e: "nor_conv_3x3" for e in nb201.EDGES}).parameters())
    small = sum(p.numel() for p in supernet.extract({e: "skip_connect" for e in nb201.EDGES}).parameters())
    assert big > small > 0


def test_selection_is_checked(supernet: NB201Supernet, signals: torch.Tensor) -> None:
    with pytest.raises(KeyError, match="1<-0"):
        supernet.select({e: "none" for e in nb201.EDGES if e != "1<-0"})
    with pytest.raises(ValueError, match="nor_conv_5x5"):
        supernet.select({**{e: "none" for e in nb201.EDGES}, "3<-2": "nor_conv_5x5"})
    with pytest.raises(RuntimeError, match="select"):
        NB201Supernet()(signals)
    with pytest.raises(ValueError, match="different options"):
        class Clash(Supernet):
            def __init__(self) -> None:
                super().__init__()
                self.a = ChoiceLayer("op", {"id": nn.Identity(), "relu": nn.ReLU()})
                self.b = ChoiceLayer("op", {"id": nn.Identity()})
        Clash().space()


class InputNet(Supernet):
    """A user's own supernet: a shared operation decision and an edge whose input is a decision."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(4, 8)
        self.op1 = ChoiceLayer("op", {"linear": nn.Linear(8, 8), "tanh": nn.Tanh()})
        self.op2 = ChoiceLayer("op", {"linear": nn.Linear(8, 8), "tanh": nn.Tanh()})
        self.pick = ChoiceInput("input", [0, 1])
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h0 = self.stem(x)
        h1 = self.op2(self.op1(h0))
        return self.head(self.pick([h0, h1]))


def test_an_input_choice_and_shared_keys_make_one_decision_each() -> None:
    torch.manual_seed(0)
    net, x = InputNet(), torch.randn(5, 4)
    assert {k: d.options for k, d in net.space().domains.items()} == {"op": ["linear", "tanh"], "input": [0, 1]}
    for config in ({"op": "linear", "input": 1}, {"op": "tanh", "input": 0}, {"op": "tanh", "input": 1}):
        assert torch.equal(net.select(config)(x), extract(net, config)(x))
    assert net.select({"op": "linear", "input": 0}).selected() == {"op": "linear", "input": 0}
    weights = {"op": torch.tensor([0.25, 0.75]), "input": torch.tensor([0.5, 0.5])}
    h0 = net.stem(x)
    m1 = 0.25 * net.op1.candidates["linear"](h0) + 0.75 * torch.tanh(h0)
    m2 = 0.25 * net.op2.candidates["linear"](m1) + 0.75 * torch.tanh(m1)
    assert torch.allclose(net.mix(weights)(x), net.head(0.5 * h0 + 0.5 * m2), atol=1e-6)


def test_touch_gives_every_parameter_a_zero_gradient_and_drop_removes_them(supernet: NB201Supernet,
                                                                          signals: torch.Tensor) -> None:
    """What DDP with find_unused_parameters=False needs (every parameter gets a gradient), and what the optimizer
    needs afterwards (no gradient, so no decay or momentum, on candidates the path did not run)."""
    config = {**{e: "skip_connect" for e in nb201.EDGES}, "3<-2": "nor_conv_3x3"}
    net = NB201Supernet()
    net.select(config).train()
    set_touch(net, True)
    net(signals).sum().backward()
    assert all(p.grad is not None for p in net.parameters())
    unused = unused_parameters(net)
    assert unused and all(torch.count_nonzero(p.grad) == 0 for p in unused)
    assert drop_unused_grads(net) == len(unused)
    assert all(p.grad is None for p in unused)
    used = [p for p in net.parameters() if p.grad is not None]
    assert used and any(torch.count_nonzero(p.grad) > 0 for p in used)
    set_touch(net, False)
    net.zero_grad(set_to_none=True)
    net(signals).sum().backward()
    assert sum(p.grad is None for p in net.parameters()) == len(unused)


@pytest.mark.parametrize("cls", [UniformSampler, FairSampler])
def test_the_same_seed_and_step_give_the_same_path_on_two_instances(cls: type) -> None:
    a, b, other = cls(nb201.space, seed=7), cls(nb201.space, seed=7), cls(nb201.space, seed=8)
    steps = [0, 1, 4, 5, 123, 9, 1]  # any order: a path depends on (seed, step) only
    assert [a.path(s) for s in steps] == [b.path(s) for s in reversed(steps)][::-1]
    assert [a.path(s) for s in range(20)] != [other.path(s) for s in range(20)]
    assert len({str(sorted(a.path(s).items())) for s in range(20)}) > 10


def test_fair_sampling_trains_every_candidate_of_every_layer_once_per_group() -> None:
    sampler = FairSampler(nb201.space, seed=3)
    assert sampler.group_size == 5
    for group in range(6):
        paths = [sampler.path(group * 5 + t) for t in range(5)]
        for edge in nb201.EDGES:
            assert sorted(p[edge] for p in paths) == sorted(nb201.OPS)
    # Uneven decisions: each option of a 2-option decision at most once more than the other in a group of 3.
    uneven = FairSampler(Space({"a": Choice([1, 2, 3]), "b": Choice(["x", "y"]), "c": "fixed"}), seed=0)
    paths = [uneven.path(t) for t in range(3)]
    assert sorted(p["a"] for p in paths) == [1, 2, 3] and {p["b"] for p in paths} == {"x", "y"}
    assert all(p["c"] == "fixed" for p in paths)


@pytest.mark.parametrize("cls", [UniformSampler, FairSampler])
def test_forbidden_paths_are_never_sampled(cls: type) -> None:
    sampler = cls(nb201.connected_space, seed=0)
    paths = [sampler.path(s) for s in range(1000)]
    assert not any(nb201.cut_off(p) for p in paths)
    assert all(nb201.connected_space.accepts(p) for p in paths)
    unconstrained = cls(nb201.space, seed=0)
    assert any(nb201.cut_off(unconstrained.path(s)) for s in range(1000))  # the rule had something to forbid


def test_fair_sampling_under_a_rule_no_group_can_meet_still_trains_only_allowed_paths() -> None:
    space = Space(nb201.space.domains, forbidden={"no pooling on 1<-0": lambda c: c["1<-0"] == "avg_pool_3x3"})
    sampler = FairSampler(space, seed=0)
    paths = [sampler.path(s) for s in range(25)]
    assert all(space.allows(p) for p in paths) and sampler.repaired >= 5
    for edge in nb201.EDGES[1:]:
        assert {p[edge] for p in paths} == set(nb201.OPS)


def test_the_2d_example_trains_its_own_supernet_and_evaluates_a_path() -> None:
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, str(root / "examples" / "supernet_2d.py")], check=False, cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    accuracy = [float(line.split("mean valid acc of 5 paths ")[1].split()[0])
                for line in done.stdout.splitlines() if line.startswith("epoch")]
    assert len(accuracy) == 5 and accuracy[-1] > max(0.4, accuracy[0]), done.stdout
    assert "extracted:" in done.stdout
