"""The distributed-training core: gangs of Ray actors and the allreduce, async and gossip backends."""

from nasplat.distributed.context import BACKENDS, OPTION_DEFAULTS, DistributedContext, check_options
from nasplat.distributed.gang import Gang, Worker

__all__ = ["BACKENDS", "OPTION_DEFAULTS", "DistributedContext", "Gang", "Worker", "check_options"]
