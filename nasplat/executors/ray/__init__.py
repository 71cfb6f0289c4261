"""The `ray` executor: trials on gangs of Ray actors, on this machine or a cluster.

- `executor`: `RayExecutor`, the driver's side (the `Executor` contract: slots, calls in flight, step timeouts);
- `gang`: `Gang`, the actors of one trial (a placement group for several ranks, the process group, servers);
- `rank`: `RankActor`, one rank of a gang, hosting the trainer of whichever trial its gang runs now;
- `slots`: the executor's records of its gangs (`Slot`) and of the calls in flight (`Call`);
- `park`: idle one-rank gangs kept after an experiment, adopted by the driver's next one.

Importing this package imports nothing of Ray; its modules do.
"""
