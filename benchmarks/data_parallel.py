"""Data-parallel throughput of a small CNN: nasplat gangs (allreduce, async, gossip) beside plain torch DDP.

    python benchmarks/data_parallel.py                    # CPU: gloo, one thread per worker
    python benchmarks/data_parallel.py --device cuda      # NCCL on GPUs; exits 1, saying why, without CUDA
    python benchmarks/data_parallel.py --repeats 1 --steps 30   # a quick look

Measured as the anchor (`shared/anchors/bench_ddp.py`) measured plain DDP, with this file's own code: batch 128 of
random 1x28x28 per worker, 5 warm-up steps, then `--steps` timed steps with a barrier before the clock stops (the
async backend has no barrier: its ranks do not wait for each other). samples/s is the sum over ranks of
128 * steps / (that rank's timed seconds), which for lock-step ranks is workers * 128 * steps / seconds. DDP runs
in processes started by torch.multiprocessing, the gangs in Ray actors; runs alternate and each figure is the
median of `--repeats` runs. Also reported: the gang start-up the first trial pays, from Gang() until rank 0 enters
the trainer's `setup` (where the anchor `bench_ray_train.py` stops its clock: the trial's own code begins) and
until the trial is set up (model, optimizer and DDP wrapper built); what a trial on a reused gang pays
(`Gang.last_setup_s`); and the straggler case: after each step rank 1 sleeps as long as that step took (2x
slower), async (max_staleness=None) against allreduce.
The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from nasplat.trainer import Trainer, WorkerContext

BATCH, WARMUP = 128, 5


class SmallCNN(nn.Module):
    """conv(1->16) - pool - conv(16->32) - pool - linear(32*7*7 -> 10), the anchor's shape."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.head = nn.Linear(32 * 7 * 7, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.head(x.flatten(1))


def batches(seed: int, device: str, count: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(BATCH, 1, 28, 28, generator=generator).to(device),
             torch.randint(0, 10, (BATCH,), generator=generator).to(device)) for _ in range(count)]


def train(model: nn.Module, optimizer: Any, data: list, steps: int, slowdown: float = 1.0) -> None:
    """`steps` SGD steps; with `slowdown` s > 1, sleep (s - 1) times each step's own duration after it."""
    for i in range(steps):
        begin = time.perf_counter()
        x, y = data[i % len(data)]
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        if slowdown > 1.0:
            time.sleep((slowdown - 1.0) * (time.perf_counter() - begin))


def barrier(device: str) -> None:
    if dist.is_initialized():
        dist.barrier()
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(model: nn.Module, optimizer: Any, data: list, steps: int, device: str, slowdown: float = 1.0) -> float:
    """Warm up, then the seconds `steps` steps take (barrier included, as in the anchor)."""
    train(model, optimizer, data, WARMUP, slowdown)
    barrier(device)
    begin = time.perf_counter()
    train(model, optimizer, data, steps, slowdown)
    barrier(device)
    return time.perf_counter() - begin


class CNNTrainer(Trainer):
    """The benchmark as a nasplat trainer, written for one worker. Config: steps, slow_rank, slowdown."""

    def setup(self, config: dict[str, Any], ctx: WorkerContext) -> None:
        self.entered = time.time()  # the trial's own code starts: Ray Train's anchor stops its start-up clock here
        torch.set_num_threads(1)
        torch.manual_seed(0)
        self.net = SmallCNN().to(ctx.device)
        optimizer = torch.optim.SGD(self.net.parameters(), lr=0.01, momentum=0.9)
        self.model, self.optimizer = ctx.prepare(self.net, optimizer)
        self.data = batches(ctx.rank, ctx.device)

    def step(self) -> dict[str, Any]:
        steps = self.config["steps"]
        slow = self.config.get("slowdown", 1.0) if self.ctx.rank == self.config.get("slow_rank", -1) else 1.0
        seconds = timed(self.model, self.optimizer, self.data, steps, self.ctx.device, slow) if steps else 0.0
        return {"seconds": seconds, "samples_per_s": BATCH * steps / seconds if steps else 0.0, "entered": self.entered}


# -- plain DDP with torch.multiprocessing --------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ddp_rank(rank: int, world: int, port: int, device_kind: str, steps: int, queue: Any) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    device = f"cuda:{rank}" if device_kind == "cuda" else "cpu"
    if device_kind == "cuda":
        torch.cuda.set_device(rank)
    model = SmallCNN().to(device)
    if world > 1:
        dist.init_process_group("nccl" if device_kind == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                                rank=rank, world_size=world)
        model = nn.parallel.DistributedDataParallel(model, device_ids=[rank] if device_kind == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    seconds = timed(model, optimizer, batches(rank, device), steps, device)
    queue.put(BATCH * steps / seconds)
    if world > 1:
        dist.destroy_process_group()


def plain_ddp(world: int, device_kind: str, steps: int) -> float:
    """Plain DDP (no DDP wrapper for one process): summed samples/s over the ranks."""
    context = mp.get_context("spawn")
    queue = context.SimpleQueue()
    mp.spawn(ddp_rank, args=(world, free_port(), device_kind, steps, queue), nprocs=world, join=True)
    return sum(queue.get() for _ in range(world))


# -- nasplat gangs -------------------------------------------------------------------------------------------------
class Gangs:
    """The benchmark's gangs, made on first use and reused for every later trial of the same (backend, workers).
    On GPUs a gang holds its GPUs, so the oldest gangs are killed when a new one would not fit."""

    def __init__(self, device: str, gpus: int) -> None:
        self.device, self.gpus, self.gangs = device, gpus, {}
        self.trials = 0

    def get(self, backend: str, workers: int) -> Any:
        from nasplat.executors.ray.gang import Gang

        if (backend, workers) not in self.gangs:
            while self.device == "cuda" and sum(w for _, w in self.gangs) + workers > self.gpus:
                self.gangs.pop(next(iter(self.gangs))).kill()
            self.gangs[backend, workers] = Gang(
                CNNTrainer, workers=workers, backend=backend, cpus_per_worker=1.0,
                gpus_per_worker=1.0 if self.device == "cuda" else 0.0, label=f"bench-{backend}-{workers}")
        return self.gangs[backend, workers]

    def trial(self, backend: str, workers: int, config: dict[str, Any]) -> list[dict[str, Any]]:
        """One new trial on a (reused) gang: the metrics of its first step, per rank."""
        import ray
        self.trials += 1
        gang = self.get(backend, workers)
        gang.ready()
        return ray.get(gang.launch(self.trials, config, seed=0))

    def rate(self, backend: str, workers: int, config: dict[str, Any]) -> float:
        """A trial's first step is the measurement: samples/s summed over the ranks."""
        return sum(m["samples_per_s"] for m in self.trial(backend, workers, config))

    def close(self) -> None:
        for gang in self.gangs.values():
            gang.kill()


def check_device(device: str, workers: list[int]) -> None:
    if device != "cuda":
        return
    if not torch.cuda.is_available():
        sys.exit(f"--device cuda: CUDA is not available here (torch {torch.__version__}, built for CUDA "
                 f"{torch.version.cuda}); run on a GPU machine or use --device cpu")
    if torch.cuda.device_count() < max(workers):
        sys.exit(f"--device cuda: NCCL needs one GPU per worker; --workers asks for {max(workers)}, this machine has "
                 f"{torch.cuda.device_count()}; pass --workers 1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--steps", type=int, default=100, help="timed steps per run (after 5 warm-up steps)")
    parser.add_argument("--repeats", type=int, default=5, help="runs per configuration; the median is reported")
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    parser.add_argument("--ray-niceness", type=int, default=0,
                        help="niceness of Ray's worker processes (Ray's own default is 15, which on a busy machine "
                             "hands the actors' CPU to every other process; plain DDP runs at 0)")
    args = parser.parse_args()
    workers = sorted({int(w) for w in args.workers.split(",")})
    check_device(args.device, workers)

    import ray

    from nasplat.distributed import BACKENDS

    most, gpus = max(workers), torch.cuda.device_count() if args.device == "cuda" else 0
    os.environ["RAY_worker_niceness"] = str(args.ray_niceness)  # read by the raylet that ray.init starts
    ray.init(num_cpus=len(BACKENDS) * sum(workers), num_gpus=gpus, include_dashboard=False, logging_level="WARNING",
             log_to_driver=False)
    time.sleep(2.0)  # let Ray finish starting: what is timed below is the gang, not Ray
    gangs = Gangs(args.device, gpus)

    begin, begin_wall = time.perf_counter(), time.time()  # the first trial's start-up: a new gang until
    first = gangs.trial("allreduce", most, {"steps": 0})  # rank 0 enters the trainer's setup, and until it is set up
    startup = time.perf_counter() - begin
    to_setup = first[0]["entered"] - begin_wall
    begin = time.perf_counter()
    gangs.rate("allreduce", most, {"steps": 0})
    reused_launch, reused_setup = time.perf_counter() - begin, gangs.get("allreduce", most).last_setup_s
    print(f"gang start-up, first trial: {to_setup:.2f} s to the trainer's setup (Ray Train's endpoint), "
          f"{startup:.2f} s until it is set up; a reused gang: set-up {reused_setup:.2f} s, "
          f"launch round trip {reused_launch * 1000:.0f} ms", flush=True)

    rates: dict[tuple[str, int], list[float]] = {}
    for repeat in range(args.repeats):  # alternate DDP and the gangs, so that a busy spell hits all of them
        for count in workers:
            rates.setdefault(("ddp", count), []).append(plain_ddp(count, args.device, args.steps))
            for backend in BACKENDS:
                rates.setdefault((backend, count), []).append(gangs.rate(backend, count, {"steps": args.steps}))
        print(f"repeat {repeat + 1}/{args.repeats}: " + ", ".join(
            f"{name}x{count} {values[-1]:.0f}" for (name, count), values in rates.items()), flush=True)
    median = {key: statistics.median(values) for key, values in rates.items()}
    for count in workers:
        print(f"{count} worker(s), samples/s: " + "  ".join(
            f"{name} {median[name, count]:.0f}" for name in ("ddp", *BACKENDS)), flush=True)

    straggler = None
    if most > 1:  # after each of its steps rank 1 sleeps as long as the step took: it runs 2x slower
        slow: dict[str, list[float]] = {"allreduce": [], "async": []}
        for _ in range(args.repeats):
            for backend in slow:
                slow[backend].append(gangs.rate(backend, most, {"steps": args.steps, "slow_rank": 1, "slowdown": 2.0}))
        straggler = {backend: statistics.median(values) for backend, values in slow.items()}
        print(f"straggler (rank 1 2x slower), samples/s: allreduce {straggler['allreduce']:.0f}"
              f"  async {straggler['async']:.0f}", flush=True)
    gangs.close()
    ray.shutdown()

    summary = {
        "ddp_samples_per_s": round(median["ddp", most], 1),
        "allreduce_samples_per_s": round(median["allreduce", most], 1),
        "allreduce_vs_ddp": round(median["allreduce", most] / median["ddp", most], 3),
        "async_samples_per_s": round(median["async", most], 1),
        "gossip_samples_per_s": round(median["gossip", most], 1),
        "gang_startup_s": round(startup, 3),
        "gang_startup_to_setup_s": round(to_setup, 3),
        "straggler_async_vs_allreduce": round(straggler["async"] / straggler["allreduce"], 3) if straggler else None,
        "reused_gang_startup_s": round(reused_setup, 3),
        "reused_gang_launch_s": round(reused_launch, 3),
        "workers": most, "device": args.device, "steps": args.steps, "repeats": args.repeats,
        "ray_worker_niceness": args.ray_niceness, "load_average": [round(x, 2) for x in os.getloadavg()],
        "one_worker_samples_per_s": {name: round(median[name, workers[0]], 1) for name in ("ddp", *BACKENDS)},
    }
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
