"""The ``mpi`` plugin: under ``mpiexec`` with several ranks, the session's cluster.

Loaded through the ``monitored`` entry-point group. A process that was not
started by an MPI launcher (or runs as a single rank) gets no cluster from this
plugin, so it trains exactly as without it; MPI is not even initialized.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from ._cluster import MPICluster
from ._world import world

if TYPE_CHECKING:
    from monitored import MonitoredSession

__all__ = ["cluster", "provides"]

#: The session's cluster, unless the session is given one (``cluster=``), which takes over.
provides: Final = frozenset({"cluster"})


def cluster(session: MonitoredSession) -> MPICluster | None:
    """The MPI job's cluster (rank 0 the chief), or ``None`` when running alone."""
    found = world()
    return None if found is None else MPICluster(found)
