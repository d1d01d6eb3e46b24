"""The exception classes of ``monitored-mpi``: one class per kind of failure.

Each message names the rank (and the chief, rank 0, where it is involved) and
what was being done: the collective, the array, the package to install.
"""

from __future__ import annotations

from monitored import DeadlineExceededError, MonitoredError

__all__ = [
    "ChiefTimeoutError",
    "CollectiveMismatchError",
    "CollectiveTimeoutError",
    "MPIError",
    "MPIUnavailableError",
    "PeerLostError",
    "StateMismatchError",
    "UnshareableStateError",
]


class MPIError(MonitoredError):
    """Base class of the errors of the MPI plugin."""


class MPIUnavailableError(MPIError):
    """The process was launched by ``mpiexec`` but ``mpi4py`` cannot be imported."""


class StateMismatchError(MPIError):
    """The ranks' states differ in names, shapes or dtypes when the chief's is shared."""


class CollectiveMismatchError(MPIError):
    """The ranks passed arrays of different dtypes or shapes (or layouts) to one collective."""


class UnshareableStateError(MPIError):
    """The chief's state cannot be sent to the other ranks (a plugin state not JSON)."""


class CollectiveTimeoutError(MPIError):
    """A collective was not joined by every rank in time (called on only some ranks)."""


class ChiefTimeoutError(MPIError, DeadlineExceededError):
    """A worker waited longer than ``max_wait_secs`` for the chief's state."""


class PeerLostError(MPIError):
    """A rank sent no heartbeat for ``MONITORED_MPI_HEARTBEAT_TIMEOUT`` seconds.

    Its host or network is gone, or the process is frozen: told apart from a
    collective that is merely slow (:class:`CollectiveTimeoutError`).
    """
