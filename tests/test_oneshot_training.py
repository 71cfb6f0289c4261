"""Supernet training as a trial (SPOS, FairNAS) on MNIST-1D, inherited-weight evaluation, resume, DDP (< 60 s)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from nasplat.core.rows import RESERVED
from nasplat.oneshot import SupernetTrainer, evaluate_path, training
from nasplat.trainer import WorkerContext, start
from search_spaces import nb201
from trainers.classification import load_dataset
from trainers.supernet import NB201SupernetTrainer

ROOT = Path(__file__).resolve().parents[1]


def make(config: dict, seed: int = 0) -> SupernetTrainer:
    return start(NB201SupernetTrainer(), config, WorkerContext(seed=seed))


@pytest.fixture(scope="module")
def trained() -> tuple[SupernetTrainer, list[dict]]:
    """Three epochs of SPOS on MNIST-1D's whole training share (about a second each)."""
    trainer = make({"sampler": "spos", "eval_paths": 3})
    return trainer, [trainer.step() for _ in range(3)]


def test_a_short_spos_training_reduces_the_loss_and_its_paths_beat_chance(trained) -> None:
    _, rows = trained
    losses = [r["train_loss"] for r in rows]
    assert losses[2] < losses[0] - 0.2, losses
    assert rows[-1]["valid_acc"] > 0.25 and rows[-1]["valid_acc_min"] > 0.15  # chance: 0.1
    assert [r["paths_trained"] for r in rows] == [50.0, 100.0, 150.0] and rows[-1]["epoch"] == 3.0
    for row in rows:
        assert not set(row) & set(RESERVED)
        assert all(isinstance(v, float) and math.isfinite(v) for v in row.values()), row
    assert rows[-1]["train_s"] < 10 and rows[-1]["eval_ms"] < 2000


def test_evaluating_a_path_is_deterministic_fast_and_leaves_the_supernet_unwritten(trained) -> None:
    trainer, _ = trained
    data, config = load_dataset("mnist1d"), {**{e: "nor_conv_3x3" for e in nb201.EDGES}, "1<-0": "skip_connect"}
    before = {k: v.clone() for k, v in trainer.net.state_dict().items()}
    start_s = time.perf_counter()
    first = evaluate_path(trainer.net, config, data)
    elapsed = time.perf_counter() - start_s
    assert evaluate_path(trainer.net, config, data) == first
    assert all(torch.equal(before[k], v) for k, v in trainer.net.state_dict().items())
    assert first["valid_acc"] > 0.25 and elapsed < 1.5, (first, elapsed)
    # The recalibrated statistics are the path's own: without them (the supernet's mixed running statistics) the
    # same weights score differently.
    assert evaluate_path(trainer.net, config, data, bn_batches=0)["valid_loss"] != first["valid_loss"]


def test_a_trial_resumed_from_its_state_goes_on_as_if_never_stopped() -> None:
    config = {"sampler": "fairnas", "train_size": 960, "eval_paths": 2, "epochs": 3}
    straight = make(config, seed=4)
    expected = [straight.step() for _ in range(2)]
    first = make(config, seed=4)
    first.step()
    state = first.state_dict()
    resumed = make(config, seed=4)
    resumed.load_state_dict(state)
    row = resumed.step()
    for key in ("train_loss", "valid_acc", "test_acc", "paths_trained"):
        assert row[key] == expected[1][key], key
    assert "done" not in row and resumed.step()["done"] is True
    retried = make(config, seed=9)  # a retry gets another seed: the paths go on from the state's path seed
    retried.load_state_dict(state)
    assert retried.path_seed == first.path_seed != make(config, seed=9).path_seed
    assert [retried.sampler.path(s) for s in range(15, 30)] == [straight.sampler.path(s) for s in range(15, 30)]


def test_fair_sampling_trains_every_candidate_within_one_group() -> None:
    """One epoch of 5 batches is one FairNAS group: every convolution candidate of every cell has moved."""
    trainer = make({"sampler": "fairnas", "train_size": 320, "eval_paths": 1})
    initial = {k: v.clone() for k, v in trainer.net.state_dict().items() if k.endswith("weight") and "conv" in k}
    assert len(initial) == 3 * 6 * 2 * 2  # 3 cells x 6 edges x 2 convolutions x (conv, BN) weights
    assert trainer.step()["paths_trained"] == 5.0
    now = trainer.net.state_dict()
    assert all(not torch.equal(initial[k], now[k]) for k in initial)
    strict = make({"sampler": "fairnas", "strict_fairness": True, "train_size": 320, "eval_paths": 1})
    assert strict.step()["paths_trained"] == 25.0  # each batch trains a whole group, one optimizer step


def test_a_constrained_space_trains_and_evaluates_only_allowed_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict] = []
    original = training.select
    monkeypatch.setattr(training, "select", lambda model, config: (seen.append(dict(config)), original(model, config)))
    trainer = make({"connected": True, "train_size": 640, "eval_paths": 8})
    trainer.step()
    assert len(seen) == 10 and trainer.space is nb201.connected_space
    assert not any(nb201.cut_off(c) for c in seen + trainer.eval_configs)


WORKER = textwrap.dedent("""
    import json, sys, torch, torch.distributed as dist
    import nasplat.oneshot.training as training
    from nasplat.distributed.context import DistributedContext, make_backend
    from nasplat.trainer import start
    from trainers.supernet import NB201SupernetTrainer
    rank, store_path, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2)
    seen = []
    original = training.select
    training.select = lambda model, config: (seen.append(dict(config)), original(model, config))[1]
    ctx = DistributedContext(trial_id=3, rank=rank, world_size=2, seed=100 + rank, backend="allreduce",
                             impl=make_backend("allreduce", rank, 2, torch.device("cpu"), {}))
    trainer = start(NB201SupernetTrainer(), {"train_size": 640, "eval_paths": 1}, ctx)
    initial = {k: v.clone() for k, v in trainer.net.state_dict().items()}
    rows = [trainer.step() for _ in range(2)]
    state = {k: p.detach() for k, p in trainer.net.named_parameters()}  # BN buffers: each rank's last batch
    changed = sum(not torch.equal(initial[k], v) for k, v in state.items())
    torch.save({"paths": seen, "state": state, "changed": changed, "rows": rows}, out)
    dist.destroy_process_group()
""")


def test_both_ranks_of_a_ddp_gang_train_the_same_path_at_every_step_and_reduce_gradients(tmp_path: Path) -> None:
    """Two gloo ranks with different seeds and data shards, DDP with find_unused_parameters=False: the same paths,
    and identical weights after training (the gradients were reduced; unused candidates broke nothing)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    outs = [tmp_path / f"rank{r}.pt" for r in range(2)]
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(r), str(tmp_path / "store"), str(outs[r])],
                              cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True) for r in range(2)]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
    a, b = (torch.load(out, weights_only=False) for out in outs)
    assert a["paths"] == b["paths"] and len(a["paths"]) == 10  # 2 epochs x 5 batches of 64 per rank
    assert len({json.dumps(p, sort_keys=True) for p in a["paths"][:10]}) > 1  # the path does change by step
    assert a["changed"] > 10
    assert all(torch.equal(a["state"][k], b["state"][k]) for k in a["state"])
    assert np.isclose(a["rows"][-1]["paths_trained"], 10)
