"""The distributed-training core on a real local Ray: gangs, allreduce, async parameter servers, gossip, exploit."""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import time
from typing import Any

import numpy as np
import pytest
import ray
import torch
import torch.nn.functional as F
from torch import nn

from nasplat.distributed import check_options
from nasplat.distributed.async_sgd import AsyncBackend
from nasplat.distributed.context import rank_seed
from nasplat.distributed.gossip import ring_neighbours
from nasplat.distributed.parameter_server import shard_parameters
from nasplat.executors.ray.gang import Gang
from nasplat.executors.ray.rank import RankActor
from nasplat.executors.packing import PackedTensor, pack, unpack
from nasplat.trainer import Trainer, WorkerContext, start

# The trainers below travel to the actors by value: the workers cannot import this test module.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

_DIGITS: dict[str, torch.Tensor] = {}


def digits() -> dict[str, torch.Tensor]:
    """scikit-learn's digits (read from its bundled csv: importing sklearn costs each actor seconds), standardised,
    a fixed 1437/360 split."""
    if not _DIGITS:
        package = os.path.dirname(importlib.util.find_spec("sklearn").origin)
        table = np.loadtxt(os.path.join(package, "datasets", "data", "digits.csv.gz"), delimiter=",")
        x, y = table[:, :-1], table[:, -1].astype(np.int64)
        order = np.random.default_rng(0).permutation(len(y))
        train, test = order[:-360], order[-360:]
        mean, std = x[train].mean(0), np.where(x[train].std(0) > 1e-8, x[train].std(0), 1.0)
        _DIGITS.update(x_train=torch.tensor((x[train] - mean) / std, dtype=torch.float32),
                       x_test=torch.tensor((x[test] - mean) / std, dtype=torch.float32),
                       y_train=torch.tensor(y[train]), y_test=torch.tensor(y[test]))
    return _DIGITS


class DigitsTrainer(Trainer):
    """A small MLP on digits, written for one worker: one step = `epochs_per_step` epochs over this rank's shard,
    then a test. With `fixed_batches: n` a step is instead n SGD steps on the first n batches of `batch_size`
    digits, each rank taking its share of every batch (for the equivalence with one process)."""

    def setup(self, config: dict[str, Any], ctx: WorkerContext) -> None:
        torch.set_num_threads(1)
        data = digits()
        n = len(data["y_train"]) // ctx.world_size
        self.x, self.y = ctx.shard(data["x_train"])[:n], ctx.shard(data["y_train"])[:n]
        torch.manual_seed(ctx.seed)
        self.net = nn.Sequential(nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 10))
        optimizer = torch.optim.SGD(self.net.parameters(), lr=config["lr"], momentum=config.get("momentum", 0.0))
        self.model, self.optimizer = ctx.prepare(self.net, optimizer)
        self.epoch = 0

    def step(self) -> dict[str, Any]:
        if "fixed_batches" in self.config:
            return self.fixed_batches()
        for _ in range(self.config.get("epochs_per_step", 1)):
            seed = self.ctx.seed * 1000 + self.epoch
            order = torch.randperm(len(self.y), generator=torch.Generator().manual_seed(seed))
            for begin in range(0, len(order), self.config["batch_size"]):
                index = order[begin:begin + self.config["batch_size"]]
                loss = F.cross_entropy(self.model(self.x[index]), self.y[index])
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self.optimizer.step()
            self.epoch += 1
        with torch.no_grad():
            accuracy = (self.model(digits()["x_test"]).argmax(1) == digits()["y_test"]).float().mean().item()
        return {"test_acc": accuracy, "epoch": self.epoch}

    def fixed_batches(self) -> dict[str, Any]:
        x, y, size = digits()["x_train"], digits()["y_train"], self.config["batch_size"]
        for i in range(self.config["fixed_batches"]):
            rows = slice(i * size, (i + 1) * size)
            loss = F.cross_entropy(self.model(self.ctx.shard(x[rows])), self.ctx.shard(y[rows]))
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
        return {"loss": loss.item()}

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.net.state_dict(), "optimizer": self.optimizer.state_dict(), "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.net.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        for group in self.optimizer.param_groups:  # the config in effect keeps its lr (torch restores the saved one)
            group["lr"] = self.config["lr"]
        self.epoch = state["epoch"]

    def update_config(self, config: dict[str, Any]) -> None:
        if config.get("rebuild"):  # the Trainer default: set up again (a new model, prepared again), keep the state
            super().update_config(config)
            return
        for group in self.optimizer.param_groups:
            group["lr"] = config["lr"]
        self.config = config


def local_run(trainer_cls: type, config: dict[str, Any], seed: int, steps: int) -> Trainer:
    """The same trainer in this process, one worker: the reference."""
    trainer = start(trainer_cls(), config, WorkerContext(seed=seed))
    for _ in range(steps):
        metrics = trainer.step()
    trainer.last = metrics
    return trainer


def run_gang(gang: Gang, config: dict[str, Any], seed: int, steps: int, trial_id: int = 0) -> list[dict[str, Any]]:
    """Launch a trial on `gang` and step it `steps` times in all; every rank's last metrics."""
    metrics = ray.get(gang.launch(trial_id, config, seed))
    for _ in range(steps - 1):
        metrics = ray.get(gang.step())
    return metrics


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def gangs(ray_session):
    """`gangs(backend, name="a", workers=2, **options)`: a gang of `DigitsTrainer`s, made on first use and reused by
    every later test that asks for the same one (as the engine reuses gangs). Asking for another backend kills the
    gangs of the previous one, so the tests below are grouped by backend to keep few actors alive at once."""
    made: dict[tuple, Gang] = {}

    def get(backend: str, name: str = "a", workers: int = 2, **options: Any) -> Gang:
        for key in [key for key in made if key[0] != backend]:
            made.pop(key).kill()
        key = (backend, name, workers, tuple(sorted(options.items())))
        if key not in made:
            made[key] = Gang(DigitsTrainer, workers=workers, backend=backend, backend_options=options,
                             cpus_per_worker=0.25, label=f"test-{backend}-{name}-{workers}-{len(made)}")
        return made[key]

    yield get
    for gang in made.values():
        gang.kill()


# -- without Ray ------------------------------------------------------------------------------------------------
def test_options_are_checked_with_clear_errors():
    with pytest.raises(ValueError, match=r"unknown backend 'ring'; allowed: \['allreduce', 'async', 'gossip'\]"):
        check_options("ring", {})
    with pytest.raises(ValueError, match=r"unknown backend_options \['period'\] for backend 'async'"):
        check_options("async", {"period": 2})
    with pytest.raises(ValueError, match=r"`topk` must be None or .* got topk=1.5"):
        check_options("async", {"topk": 1.5})
    with pytest.raises(ValueError, match=r"`max_staleness` must be an integer >= 0, got max_staleness=-1"):
        check_options("async", {"max_staleness": -1})
    assert check_options("gossip", {"period": 3}) == {"period": 3, "timeout_s": 300.0}


def test_sharding_ring_and_seeds():
    assert shard_parameters([100, 10, 60, 50], 2) == [[0, 1], [2, 3]]  # 100 + 10 | 60 + 50
    assert shard_parameters([5], 3) == [[0], [], []]
    assert ring_neighbours(0, 2) == [1] and ring_neighbours(0, 4) == [1, 3] and ring_neighbours(2, 3) == [0, 1]
    seeds = [rank_seed(7, rank) for rank in range(4)]
    assert seeds[0] == 7 and len(set(seeds)) == 4 and rank_seed(7, 1) == seeds[1]


def test_topk_error_feedback_sends_everything_eventually():
    """What top-k leaves out is carried over: sent + residual == the sum of all gradients pushed."""
    backend = AsyncBackend(0, 2, torch.device("cpu"), check_options("async", {"topk": 0.1}))
    backend.residuals = [torch.zeros(50)]
    generator = torch.Generator().manual_seed(0)
    sent, pushed = torch.zeros(50), torch.zeros(50)
    for _ in range(20):
        grad = torch.randn(50, generator=generator)
        index, values = backend._compress(0, grad.clone())
        assert len(index) == 5
        sent[torch.tensor(index)] += torch.tensor(values)
        pushed += grad
    assert torch.allclose(sent + backend.residuals[0], pushed, atol=1e-5)


def test_rendezvous_port_is_held_by_rank_0s_store_from_the_moment_it_is_chosen():
    """No bind-close-reuse: while the store lives, nobody else can bind its port, and a rank connects through it."""
    import socket
    from datetime import timedelta

    import torch.distributed as dist

    from nasplat.distributed.allreduce import host_store

    store, address = host_store("127.0.0.1", timeout_s=10)
    host, port = address.rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) == store.port > 0
    with socket.socket() as other, pytest.raises(OSError, match="Address already in use"):
        other.bind((host, int(port)))
    client = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=10))
    client.set("rank-1", "here")
    assert store.get("rank-1") == b"here"


def test_parameter_server_bounds_staleness_and_restores_its_snapshot(tmp_path):
    """The server class without Ray: rank 0 may lead rank 1 by `max_staleness` pushes, no more; a rank between
    steps holds nobody back; a new server on the same snapshot folder resumes the shard."""
    import asyncio

    from nasplat.distributed.parameter_server import ParameterServer

    async def scenario() -> None:
        server = ParameterServer(0, str(tmp_path))
        spec = {"generation": (1, 1), "world_size": 2, "indices": [0], "groups": [0], "shapes": [(3,)],
                "optimizer_cls": torch.optim.SGD, "defaults": {"lr": 0.1}, "hparams": [{"lr": 0.1}],
                "max_staleness": 1, "snapshot_every": 1}
        await server.init(spec, np.zeros(3, dtype=np.float32), None)
        one = np.ones(3, dtype=np.float32)
        hparams = [{"lr": 0.1}]
        await server.push((1, 1), 1, 1, one, hparams)  # rank 1 at clock 1
        await server.push((1, 1), 0, 1, one, hparams)
        await server.push((1, 1), 0, 2, one, hparams)  # leads by 1: allowed
        third = asyncio.create_task(server.push((1, 1), 0, 3, one, hparams))  # would lead by 2: waits
        await asyncio.sleep(0.05)
        assert not third.done()
        await server.push((1, 1), 1, 2, one, hparams)  # rank 1 catches up to 2: rank 0 may go on
        weights = await asyncio.wait_for(third, 1.0)
        assert np.allclose(weights, -0.5)  # five pushes of ones at lr 0.1
        fourth = asyncio.create_task(server.push((1, 1), 0, 4, one, hparams))
        await asyncio.sleep(0.05)
        assert not fourth.done()
        await server.rest((1, 1), 1)  # rank 1 finished its trainer step: nobody waits for it
        await asyncio.wait_for(fourth, 1.0)
        restored = ParameterServer(0, str(tmp_path))
        assert restored.restored and restored.clocks == [4, 2] and restored.updates == 6
        assert np.allclose(restored.weights(), -0.6)
        with pytest.raises(RuntimeError, match=r"older generation \(0, 1\)"):
            await restored.pull((0, 1))

    asyncio.run(scenario())


# -- on Ray: allreduce ------------------------------------------------------------------------------------------
def test_allreduce_two_half_batches_equal_one_whole_batch(gangs):
    """20 SGD steps: 2 workers on half of each batch of 64 end where one process on the whole batch ends."""
    config = {"lr": 0.1, "batch_size": 64, "fixed_batches": 20}
    reference = local_run(DigitsTrainer, config, seed=3, steps=1).state_dict()["model"]
    gang = gangs("allreduce")
    run_gang(gang, config, seed=3, steps=1)
    rank0, rank1 = [unpack(s) for s in ray.get([actor.state.remote() for actor in gang.actors])]
    assert max_diff(rank0["model"], reference) <= 1e-5
    assert max_diff(rank1["model"], rank0["model"]) == 0.0
    assert max_diff(reference, start(DigitsTrainer(), config, WorkerContext(seed=3)).state_dict()["model"]) > 1e-2


def check_exploit(gangs: Any, backend: str) -> None:
    """PBT's exploit on a 2-worker gang: the donor's state lands on every rank; actors and process group stay."""
    config = {"lr": 0.05, "momentum": 0.9, "batch_size": 32}
    donor, gang = gangs(backend, name="donor"), gangs(backend)
    run_gang(donor, config, seed=1, steps=2, trial_id=1)
    run_gang(gang, config, seed=2, steps=1, trial_id=2)
    before = gang.identity()
    servers = [info["pid"] for info in ray.get([server.info.remote() for server in gang.servers])]
    state = donor.state()
    metrics = ray.get(gang.exploit(state, {**config, "lr": 0.0}))  # lr 0: the step after the exploit moves nothing
    assert gang.identity() == before  # same pids, same process group (uid, object, joined once)
    assert [info["pid"] for info in ray.get([server.info.remote() for server in gang.servers])] == servers
    if backend != "async":
        assert all(rank["group_inits"] == 1 and rank["group_uid"] == gang.group_uid for rank in before)
    donor_model = unpack(ray.get(state))["model"]
    for rank_state in [unpack(s) for s in ray.get([actor.state.remote() for actor in gang.actors])]:
        assert max_diff(rank_state["model"], donor_model) == 0.0
    assert [m["epoch"] for m in metrics] == [3, 3]
    # Again through the Trainer's default update_config, which rebuilds the model and prepares it anew.
    metrics = ray.get(gang.exploit(state, {**config, "lr": 0.0, "rebuild": True}))
    assert gang.identity() == before and [m["epoch"] for m in metrics] == [3, 3]
    assert max_diff(unpack(ray.get(gang.state()))["model"], donor_model) == 0.0
    # The gang's state is a one-worker trainer's state: it loads into a local trainer as it is.
    local = start(DigitsTrainer(), config, WorkerContext(seed=0))
    local.load_state_dict(unpack(ray.get(gang.state())))
    assert set(local.optimizer.state_dict()["state"]) == set(range(4))


def test_allreduce_exploit_keeps_actors_and_process_group(gangs):
    check_exploit(gangs, "allreduce")


def test_a_reused_gang_sets_up_nothing_new(gangs):
    """A new gang's first trial pays the set-up; the next trial on it creates no actor, placement or process group,
    and (same seed) reproduces the first exactly, so it really was set up anew (new model, new DDP, old group)."""
    config = {"lr": 0.05, "momentum": 0.9, "batch_size": 32}
    gang = gangs("allreduce", name="reuse")
    first = run_gang(gang, config, seed=4, steps=2, trial_id=1)
    created, identity = dict(gang.created), gang.identity()
    assert gang.last_setup_s == gang.startup_s > 0
    assert created == {"placement_groups": 1, "actors": 2, "process_groups": 1, "servers": 0}
    begin = time.perf_counter()
    second = run_gang(gang, config, seed=4, steps=2, trial_id=2)
    relaunch = time.perf_counter() - begin
    assert gang.last_setup_s == 0.0 and gang.created == created
    assert [{**rank, "trial_id": 2} for rank in identity] == gang.identity()
    assert second[0]["test_acc"] == first[0]["test_acc"]
    # The counters above decide that nothing was set up again; the times are printed, not compared (a busy machine).
    print(f"gang set-up {gang.startup_s:.2f} s (first trial only); a whole 2-epoch trial on it {relaunch:.2f} s")


# -- on Ray: gossip ---------------------------------------------------------------------------------------------
def test_gossip_reaches_single_worker_accuracy(gangs):
    check_accuracy(gangs, "gossip")


def check_accuracy(gangs: Any, backend: str, **options: Any) -> None:
    """2 workers on digits end within 2 points of one worker's test accuracy after the same number of epochs."""
    config, epochs = {"lr": 0.05, "momentum": 0.9, "batch_size": 32}, 8
    single = local_run(DigitsTrainer, config, seed=1, steps=epochs).last["test_acc"]
    metrics = run_gang(gangs(backend, **options), config, seed=1, steps=epochs)[0]
    print(f"{backend} {options}: single worker {single:.4f}, 2 workers {metrics['test_acc']:.4f}")
    assert single > 0.9 and metrics["epoch"] == epochs
    assert abs(metrics["test_acc"] - single) <= 0.02


@pytest.mark.parametrize("workers", [2, 4])
def test_gossip_consensus_distance_falls_without_training(gangs, workers):
    """lr = 0: only gossip moves the weights; ranks start apart (own seeds) and meet. With 4 ranks the ring is
    not complete, so the distance shrinks geometrically (x1/3 a round) instead of vanishing in one round."""
    gang = gangs("gossip", workers=workers)
    metrics = run_gang(gang, {"lr": 0.0, "batch_size": 32}, seed=5, steps=1)[0]
    rounds = (len(digits()["y_train"]) // workers + 31) // 32
    print(f"{workers} workers: consensus distance {metrics['consensus_distance_start']:.3g} -> "
          f"{metrics['consensus_distance']:.3g} after {rounds} rounds")
    assert metrics["gossip_rounds"] == rounds
    assert metrics["consensus_distance_start"] > 0.5
    assert metrics["consensus_distance"] < 1e-3
    if workers == 4:
        assert metrics["consensus_distance"] > 0.0
    states = [unpack(s) for s in ray.get([actor.state.remote() for actor in gang.actors])]
    assert max(max_diff(state["model"], states[0]["model"]) for state in states) < 1e-3


def test_gossip_exploit_keeps_actors_and_process_group(gangs):
    check_exploit(gangs, "gossip")


# -- on Ray: async ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("options", [{}, {"num_servers": 2, "topk": 0.3, "max_staleness": 1}])
def test_async_reaches_single_worker_accuracy(gangs, options):
    check_accuracy(gangs, "async", **options)


def test_killed_parameter_server_restarts_from_its_snapshot_and_the_trial_goes_on(gangs):
    config = {"lr": 0.05, "momentum": 0.9, "batch_size": 16, "epochs_per_step": 6}
    gang = gangs("async")
    run_gang(gang, config, seed=2, steps=1)
    before = ray.get(gang.servers[0].info.remote())
    refs = gang.step()
    while ray.get(gang.servers[0].info.remote())["updates"] == before["updates"]:  # until the step's first push
        ray.wait(refs, num_returns=len(refs), timeout=0.01)
    assert ray.wait(refs, num_returns=len(refs), timeout=0)[0] == []  # the step is still running (6 epochs)
    pid = before["pid"]
    os.kill(pid, signal.SIGKILL)
    metrics = ray.get(refs)  # no error: the workers retried against the restarted server
    info = ray.get(gang.servers[0].info.remote())
    assert info["pid"] != pid and info["restored"]
    assert sum(m["ps_retries"] for m in metrics) >= 1
    metrics = ray.get(gang.step())
    assert metrics[0]["epoch"] == 18 and metrics[0]["test_acc"] > 0.9


def test_async_exploit_keeps_actors_and_servers(gangs):
    check_exploit(gangs, "async")


def test_packed_states_round_trip_tensors_and_leave_everything_else_alone():
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 3, "array": np.arange(3),
             "pair": (torch.ones(2, dtype=torch.bfloat16), "x")}
    packed = pack(state)
    assert isinstance(packed["model"]["weight"], PackedTensor) and isinstance(packed["array"], np.ndarray)
    assert isinstance(packed["pair"][0], torch.Tensor)  # numpy has no bfloat16: it travels as a tensor
    back = unpack(ray.cloudpickle.loads(ray.cloudpickle.dumps(packed)))
    assert max_diff(back["model"], state["model"]) == 0.0 and back["step"] == 3
    momentum = state["optimizer"]["state"][0]["momentum_buffer"]
    assert torch.equal(back["optimizer"]["state"][0]["momentum_buffer"], momentum)
    assert back["optimizer"]["param_groups"] == state["optimizer"]["param_groups"]
    assert back["model"]["weight"].data_ptr() != state["model"]["weight"].data_ptr()  # the receiver owns a copy
    back["model"]["weight"] += 1  # and may write to it


def test_unpack_overwrites_the_receivers_matching_tensors_and_never_the_object_store(ray_session):
    donor, receiver = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    stored = ray.put(pack({"model": donor.state_dict(), "extra": torch.ones(4), "twice": torch.zeros(2)}))
    mine = receiver.state_dict()
    into = {"model": mine, "extra": torch.zeros(5), "twice": mine["bias"]}  # wrong shape; an alias of model.bias
    back = unpack(ray.get(stored), into=into)
    assert back["model"]["weight"].data_ptr() == mine["weight"].data_ptr()  # reused: no fresh memory
    assert max_diff(back["model"], donor.state_dict()) == 0.0
    assert back["extra"].data_ptr() != into["extra"].data_ptr() and back["extra"].shape == (4,)
    assert back["twice"].data_ptr() != mine["bias"].data_ptr()  # a tensor is overwritten once at most
    assert torch.equal(back["model"]["bias"], donor.bias.detach()) and torch.equal(back["twice"], torch.zeros(2))
    back["model"]["weight"] += 1
    assert max_diff(unpack(ray.get(stored))["model"], donor.state_dict()) == 0.0  # the stored copy is untouched


def test_a_worker_whose_constructor_failed_still_has_a_name():
    """Ray names an actor by its repr, also in the error of a constructor that raised half-way."""
    assert repr(RankActor.__new__(RankActor)) == "?/trial-?/rank-?"
