"""monitored-mpi: data-parallel training for ``monitored`` over MPI.

``mpiexec -n 4 python train.py``: rank 0 is the chief, the chief's initialized
or restored state is broadcast to every rank, ``DistributedOptimizer`` averages
the gradients in one fused reduction per step, and every stop decision is
agreed on by all ranks, so they all stop after the same step. Alone, the
plugin does nothing.
"""

from ._cluster import MPICluster
from ._collectives import allgather, allreduce, broadcast, merge_metrics
from ._errors import (
    ChiefTimeoutError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
    MPIError,
    MPIUnavailableError,
    StateMismatchError,
    UnshareableStateError,
)
from ._optimizer import DistributedOptimizer
from ._share import jump_rng
from ._world import TIMEOUT_ENV, World, launched_by_mpi, world

__all__ = [
    "TIMEOUT_ENV",
    "ChiefTimeoutError",
    "CollectiveMismatchError",
    "CollectiveTimeoutError",
    "DistributedOptimizer",
    "MPICluster",
    "MPIError",
    "MPIUnavailableError",
    "StateMismatchError",
    "UnshareableStateError",
    "World",
    "allgather",
    "allreduce",
    "broadcast",
    "jump_rng",
    "launched_by_mpi",
    "merge_metrics",
    "rank",
    "size",
    "world",
]


def rank() -> int:
    """This process's rank (0 when running alone)."""
    found = world()
    return 0 if found is None else found.rank


def size() -> int:
    """The number of ranks (1 when running alone)."""
    found = world()
    return 1 if found is None else found.size
