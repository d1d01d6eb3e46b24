"""The roles of the processes that train together, and their stop decision.

One process is its own chief. A distributed engine (the ``monitored-mpi``
plugin: rank 0 the chief) supplies another :class:`Cluster` through the
``cluster`` hookspec; the session asks this one object who is the chief, hands
it the freshly created state to share, takes every stop decision through
:meth:`~Cluster.agree_to_stop`, and tells it when the session fails, so that all
processes start from the same state and stop after the same step.

:class:`ClusterSpec` is TF1's description of the processes (jobs of tasks). It
lives here, in the core, because it is plain data that every engine describes
its world with (and TF1 code builds one without any engine installed).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, final

if TYPE_CHECKING:
    from ..metrics import Metric
    from ._session import MonitoredSession

__all__ = ["Cluster", "ClusterSpec", "LocalCluster"]


class Cluster(Protocol):
    """Who is the chief, how the state is shared, and where the stop decision is taken."""

    @property
    def is_chief(self) -> bool: ...

    def agree_to_stop(self, local: bool) -> bool:
        """Combine this process's wish to stop with the others'; same answer on all."""
        ...

    async def share_state(self, session: MonitoredSession, max_wait_secs: float) -> None:
        """Make every process's state the chief's, once the chief has created it.

        Called on every process each time the session is created: on the chief
        after it restored or initialized the state, on the others before they
        check that the state is ready. A process that waits longer than
        ``max_wait_secs`` for the chief raises ``DeadlineExceededError``.
        """
        ...

    def fail(self, failure: BaseException) -> None:
        """The session is closing on this process because of ``failure``.

        Called after the session has closed. An engine whose other processes
        would wait for this one forever ends them (fail-stop); a single process
        has nothing to do.
        """
        ...

    def merge_metrics(self, metrics: Sequence[Metric]) -> None:
        """Combine each metric's accumulators with the same metric of every process.

        In place, exactly: afterwards every process holds the totals over all
        processes' batches (a sharded evaluation, ``evaluate_once(sharded=True)``).
        Every process passes the same metrics in the same order.
        """
        ...


@final
class LocalCluster:
    """A single process: the stop decision and the state are this process's own."""

    __slots__ = ("_is_chief",)

    def __init__(self, is_chief: bool = True) -> None:
        self._is_chief = is_chief

    @property
    def is_chief(self) -> bool:
        return self._is_chief

    def agree_to_stop(self, local: bool) -> bool:
        return local

    async def share_state(self, session: MonitoredSession, max_wait_secs: float) -> None:
        return None

    def fail(self, failure: BaseException) -> None:
        return None

    def merge_metrics(self, metrics: Sequence[Metric]) -> None:
        return None


@final
class ClusterSpec:
    """TF1's ``tf.train.ClusterSpec``: the processes of a job, as jobs of tasks.

    Built from a mapping of job names to a list of task addresses (task ``i`` is
    the ``i``-th address) or to a mapping of task indices to addresses (sparse),
    or from another ``ClusterSpec``. The MPI plugin describes its world as
    ``{"chief": [rank 0's host], "worker": [the other ranks' hosts]}``.
    """

    __slots__ = ("_jobs",)

    def __init__(
        self, cluster: ClusterSpec | Mapping[str, Sequence[str] | Mapping[int, str]]
    ) -> None:
        if isinstance(cluster, ClusterSpec):
            self._jobs: dict[str, dict[int, str]] = {
                job: dict(tasks) for job, tasks in cluster._jobs.items()
            }
            return
        if not isinstance(cluster, Mapping):
            raise TypeError(
                "ClusterSpec takes a mapping of job names to task addresses (a list, or a "
                f"dict of task index to address), got {type(cluster).__name__}"
            )
        self._jobs = {}
        for job, tasks in cluster.items():
            if not isinstance(job, str) or not job:
                raise ValueError(f"ClusterSpec: job names must be non-empty strings, got {job!r}")
            if isinstance(tasks, Mapping):
                listed = dict(tasks)
            elif isinstance(tasks, Sequence) and not isinstance(tasks, str | bytes):
                listed = dict(enumerate(tasks))
            else:
                raise TypeError(
                    f"ClusterSpec: the tasks of job {job!r} must be a list of addresses or a "
                    f"dict of task index to address, got {type(tasks).__name__}"
                )
            for index, address in listed.items():
                if isinstance(index, bool) or not isinstance(index, int) or index < 0:
                    raise ValueError(
                        f"ClusterSpec: job {job!r} has task index {index!r}; task indices "
                        "are integers >= 0"
                    )
                if not isinstance(address, str):
                    raise TypeError(
                        f"ClusterSpec: task {index} of job {job!r} has address {address!r}; "
                        "addresses are strings"
                    )
            self._jobs[job] = dict(sorted(listed.items()))

    @property
    def jobs(self) -> list[str]:
        """The job names, sorted."""
        return sorted(self._jobs)

    def num_tasks(self, job_name: str) -> int:
        """How many tasks ``job_name`` has."""
        return len(self._tasks(job_name))

    def task_indices(self, job_name: str) -> list[int]:
        """The task indices of ``job_name``, in increasing order."""
        return list(self._tasks(job_name))

    def task_address(self, job_name: str, task_index: int) -> str:
        """The address of task ``task_index`` of ``job_name``."""
        tasks = self._tasks(job_name)
        try:
            return tasks[task_index]
        except KeyError:
            raise ValueError(
                f"ClusterSpec: job {job_name!r} has no task {task_index} (it has {list(tasks)})"
            ) from None

    def job_tasks(self, job_name: str) -> list[str | None]:
        """The addresses of ``job_name``'s tasks, by index (``None`` where none is given)."""
        tasks = self._tasks(job_name)
        if not tasks:
            return []
        return [tasks.get(i) for i in range(max(tasks) + 1)]

    def as_dict(self) -> dict[str, list[str] | dict[int, str]]:
        """Job names to a list of addresses, or to a dict of them where tasks are sparse."""
        result: dict[str, list[str] | dict[int, str]] = {}
        for job, tasks in self._jobs.items():
            dense = list(tasks) == list(range(len(tasks)))
            result[job] = list(tasks.values()) if dense else dict(tasks)
        return result

    def _tasks(self, job_name: str) -> dict[int, str]:
        try:
            return self._jobs[job_name]
        except KeyError:
            raise ValueError(f"ClusterSpec: no such job {job_name!r} (jobs: {self.jobs})") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self.jobs)

    def __bool__(self) -> bool:
        return bool(self._jobs)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ClusterSpec):
            return self._jobs == other._jobs
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple((job, tuple(tasks.items())) for job, tasks in sorted(self._jobs.items())))

    def __repr__(self) -> str:
        return f"ClusterSpec({self.as_dict()!r})"
