"""The roles of the processes that train together, and their stop decision.

Today there is one process, which is the chief. The distributed engine (MPI,
rank 0 the chief) replaces :class:`LocalCluster` with one whose
:meth:`~LocalCluster.agree_to_stop` reduces every rank's wish, so that all ranks
stop on the same step; the session asks this one object and nothing else.
"""

from __future__ import annotations

from typing import Protocol, final

__all__ = ["Cluster", "LocalCluster"]


class Cluster(Protocol):
    """Who is the chief, and the one place where the stop decision is taken."""

    @property
    def is_chief(self) -> bool: ...

    def agree_to_stop(self, local: bool) -> bool:
        """Combine this process's wish to stop with the others'; same answer on all."""
        ...


@final
class LocalCluster:
    """A single process: the stop decision is this process's own."""

    __slots__ = ("_is_chief",)

    def __init__(self, is_chief: bool = True) -> None:
        self._is_chief = is_chief

    @property
    def is_chief(self) -> bool:
        return self._is_chief

    def agree_to_stop(self, local: bool) -> bool:
        return local
