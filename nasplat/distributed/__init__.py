"""Data-parallel backends: how the ranks of a gang keep their replicas in step (synchronous allreduce,
asynchronous parameter servers, decentralized gossip), their options, and the context a rank hands its trainer.
The gangs themselves are `nasplat.executors.ray.gang`."""

from nasplat.distributed.context import BACKENDS, OPTION_DEFAULTS, DistributedContext, check_options

__all__ = ["BACKENDS", "OPTION_DEFAULTS", "DistributedContext", "check_options"]
