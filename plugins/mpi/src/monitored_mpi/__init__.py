"""monitored-mpi: data-parallel training for ``monitored`` over MPI.

``mpiexec -n 4 python train.py``: rank 0 is the chief, the chief's initialized
or restored state is broadcast to every rank, ``DistributedOptimizer`` averages
the gradients in one fused reduction per step, and every stop decision is
agreed on by all ranks, so they all stop after the same step. Alone, the
plugin does nothing.
"""

from typing import Final, NoReturn, final

from ._cluster import MPICluster
from ._collectives import allgather, allreduce, broadcast, merge_metrics
from ._errors import (
    ChiefTimeoutError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
    MPIError,
    MPIUnavailableError,
    PeerLostError,
    StateMismatchError,
    UnshareableStateError,
)
from ._heartbeat import HEARTBEAT_TIMEOUT_ENV
from ._optimizer import DistributedOptimizer
from ._share import jump_rng
from ._sync_replicas import SyncReplicasOptimizer
from ._world import TIMEOUT_ENV, World, launched_by_mpi, world

__all__ = [
    "HEARTBEAT_TIMEOUT_ENV",
    "TIMEOUT_ENV",
    "Average",
    "ChiefTimeoutError",
    "CollectiveMismatchError",
    "CollectiveTimeoutError",
    "Compression",
    "DistributedOptimizer",
    "MPICluster",
    "MPIError",
    "MPIUnavailableError",
    "PeerLostError",
    "StateMismatchError",
    "Sum",
    "SyncReplicasOptimizer",
    "UnshareableStateError",
    "World",
    "allgather",
    "allreduce",
    "broadcast",
    "jump_rng",
    "launched_by_mpi",
    "local_rank",
    "local_size",
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


def local_rank() -> int:
    """This process's rank among the ranks on its machine (0 alone): Horovod's
    ``local_rank``, e.g. to pick a GPU (``cupy.cuda.Device(local_rank()).use()``)."""
    found = world()
    return 0 if found is None else found.local_rank


def local_size() -> int:
    """How many ranks run on this process's machine (1 alone)."""
    found = world()
    return 1 if found is None else found.local_size


#: Horovod's ``hvd.Average``: ``DistributedOptimizer(op=Average)``, ``allreduce(x, Average)``.
Average: Final = "mean"
#: Horovod's ``hvd.Sum``.
Sum: Final = "sum"


@final
class Compression:
    """Horovod's ``hvd.Compression``: ``DistributedOptimizer(compression=Compression.fp16)``."""

    none: Final = None
    fp16: Final = "fp16"


#: Horovod names with no meaning here, and why: ``monitored_mpi.<name>`` says so
#: (an ``AttributeError`` that tells a ported script what to do, not a bare one).
_BROADCAST: Final = (
    "not needed: the chief's state (arrays, global step, RNG, plugin states) is broadcast "
    "to every rank when the session is created"
)
_NOT_NEEDED: Final = {
    "init": (
        "not needed: MPI is initialized when it is first needed (a session, rank(), size()) "
        "in a process started by mpiexec: delete hvd.init()"
    ),
    "shutdown": "not needed: MPI is finalized when the process exits: delete the call",
    "BroadcastGlobalVariablesHook": f"{_BROADCAST}: drop the hook",
    "broadcast_global_variables": (
        f"{_BROADCAST}: delete the call (one array of your own: monitored_mpi.broadcast(x, root=0))"
    ),
    "broadcast_variables": (
        f"{_BROADCAST}: delete the call (one array of your own: monitored_mpi.broadcast(x, root=0))"
    ),
    "Adasum": "not supported: DistributedOptimizer averages (op=Average) or sums (op=Sum)",
    "DistributedGradientTape": (
        "not needed: there is no gradient tape: compute the gradients in the step and pass "
        "them to DistributedOptimizer(...).apply_gradients, which averages them"
    ),
}


def __getattr__(name: str) -> NoReturn:
    why = _NOT_NEEDED.get(name)
    if why is None:
        raise AttributeError(f"module 'monitored_mpi' has no attribute {name!r}")
    raise AttributeError(f"monitored_mpi.{name}: {why} (see 'From Horovod' in docs/scaling-out.md)")
