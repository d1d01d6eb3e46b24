"""The MPI world of this process: found from the launcher, initialized once.

``mpi4py`` is imported (which initializes MPI) only when the process was
started by an MPI launcher: a plain ``python train.py`` never touches MPI, so
that a single process behaves exactly as without the plugin. Collectives are
started non-blocking and waited for here, with a deadline (a collective that
some ranks never call fails with :class:`CollectiveTimeoutError` instead of
hanging) and without busy polling once the first moments have passed (ranks
that share cores leave them to each other).
"""

from __future__ import annotations

import os
import time
import warnings
from typing import Any, Final, final

import numpy as np

from ._errors import CollectiveTimeoutError, MPIError, MPIUnavailableError
from ._heartbeat import HEARTBEAT_TIMEOUT_ENV, Heartbeat, heartbeat_timeout_from_env

__all__ = ["TIMEOUT_ENV", "World", "launched_by_mpi", "world"]

#: Environment variables that MPI launchers set in the processes they start
#: (MPICH's Hydra and Intel MPI: PMI_*, Open MPI: OMPI_*, Slurm with PMIx: PMIX_*).
LAUNCHER_ENV: Final = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_RANK")

#: Seconds a rank waits in one collective before it gives up (default 300).
TIMEOUT_ENV: Final = "MONITORED_MPI_TIMEOUT"
DEFAULT_TIMEOUT_SECS: Final = 300.0

#: A wait first polls without pause for this long (a step's small collectives
#: complete in microseconds), then yields the core between polls (``sched_yield``:
#: another rank on the same core runs, and a large collective, which only
#: progresses while polled, keeps its pace) until ``_YIELD_SECS``, then sleeps
#: between polls, from ``_FIRST_SLEEP`` doubling up to ``_LONGEST_SLEEP`` (a rank
#: waiting for a slow one, the chief writing a checkpoint, uses no CPU).
_SPIN_SECS: Final = 0.002
_YIELD_SECS: Final = 1.0
_FIRST_SLEEP: Final = 20e-6
_LONGEST_SLEEP: Final = 0.001
#: How long a failing rank leaves the launcher to forward its report before the abort.
_ABORT_DRAIN_SECS: Final = 0.5


def launched_by_mpi() -> bool:
    """Whether an MPI launcher (``mpiexec``, ``srun --mpi=pmix``) started this process."""
    return any(name in os.environ for name in LAUNCHER_ENV)


def _import_mpi() -> Any:
    launcher = next(name for name in LAUNCHER_ENV if name in os.environ)
    try:
        from mpi4py import MPI
    except (ImportError, RuntimeError) as exc:
        raise MPIUnavailableError(
            f"this process was started by an MPI launcher ({launcher} is set) but mpi4py "
            f"cannot be imported ({exc}); install it with an MPI library: "
            "pip install mpi4py mpich (or monitored-mpi[mpich]), or build mpi4py against "
            "your cluster's MPI"
        ) from exc
    return MPI


def _timeout_from_env() -> float:
    raw = os.environ.get(TIMEOUT_ENV)
    if raw is None or not raw.strip():
        return DEFAULT_TIMEOUT_SECS
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise MPIError(f"{TIMEOUT_ENV}={raw!r}: give a number of seconds > 0")
    return value


@final
class World:
    """The ranks of ``MPI.COMM_WORLD`` (or of ``comm``) and how to wait for them.

    ``comm`` carries the users' and the optimizer's collectives; ``control``, a
    duplicate, carries the session's own (state sharing, stop decisions), so that
    the two never match each other's messages.
    """

    __slots__ = (
        "MPI",
        "comm",
        "control",
        "heartbeat",
        "hint",
        "local_rank",
        "local_size",
        "rank",
        "size",
        "timeout",
    )

    def __init__(
        self,
        comm: Any,
        mpi: Any,
        timeout: float | None = None,
        heartbeat_timeout: float | None = None,
    ) -> None:
        self.MPI = mpi
        self.comm = comm
        self.control = comm.Dup()
        self.rank: int = comm.Get_rank()
        self.size: int = comm.Get_size()
        # The ranks sharing this machine (Horovod's local_rank, to pick a GPU): found
        # once here, where every rank takes part, as it must in a split.
        node = comm.Split_type(mpi.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank: int = node.Get_rank()
        self.local_size: int = node.Get_size()
        node.Free()
        self.timeout = _timeout_from_env() if timeout is None else timeout
        #: Said at the end of a timeout's message (a setting that may explain it).
        self.hint = ""
        #: Beats to and from every other rank, on a communicator of its own (None: off).
        self.heartbeat: Heartbeat | None = None
        if heartbeat_timeout is None:
            heartbeat_timeout = heartbeat_timeout_from_env()
        if heartbeat_timeout > 0 and self.size > 1 and not _threads_allowed(mpi):
            heartbeat_timeout = 0.0
        if heartbeat_timeout > 0 and self.size > 1:
            name = np.frombuffer(mpi.Get_processor_name().encode()[:255], dtype=np.uint8)
            hosts = _gather_names(comm, name, self.size)
            self.heartbeat = Heartbeat(comm.Dup(), hosts, heartbeat_timeout)

    def wait(self, request: Any, what: str, timeout: float | None = None) -> None:
        """Wait for ``request`` (a non-blocking collective), at most ``timeout`` seconds."""
        if request.Test():
            return
        heartbeat = self.heartbeat
        limit = self.timeout if timeout is None else timeout
        start = time.monotonic()
        sleep = _FIRST_SLEEP
        while not request.Test():
            if heartbeat is not None and heartbeat.lost is not None:
                raise heartbeat.lost
            waited = time.monotonic() - start
            if waited < _SPIN_SECS:
                continue
            if waited < _YIELD_SECS:
                os.sched_yield()
                continue
            if waited > limit:
                raise CollectiveTimeoutError(
                    f"{what}: rank {self.rank} of {self.size} waited {limit:g}s and not every "
                    "rank joined; a collective called on only some ranks (a step or hook that "
                    "runs it on some ranks only), a rank that left its loop early (its input "
                    "ended outside a monitored.data pipeline: feed it through "
                    "monitored.data.prefetch, which stops every rank together), or a rank "
                    f"stuck elsewhere ({TIMEOUT_ENV} sets the limit){self.hint}"
                )
            time.sleep(sleep)
            sleep = min(sleep * 2, _LONGEST_SLEEP)

    def abort(self, code: int = 1) -> None:
        """End every rank of the job (MPI_Abort): the launcher kills them all.

        Waits a moment first: what this rank just wrote to stderr (why it fails)
        is still in the pipe to the launcher, which stops forwarding once it
        tears the job down (seen losing the whole report about 1 run in 8).
        """
        time.sleep(_ABORT_DRAIN_SECS)
        self.comm.Abort(code)


def _threads_allowed(mpi: Any) -> bool:
    """Whether MPI may be called from the heartbeat's thread (``MPI_THREAD_MULTIPLE``,
    mpi4py's default); warns when not."""
    if mpi.Query_thread() == mpi.THREAD_MULTIPLE:
        return True
    warnings.warn(
        "monitored-mpi: MPI was initialized without MPI_THREAD_MULTIPLE (mpi4py.rc."
        "thread_level), which the heartbeat's thread needs: a lost rank is noticed only "
        f"when a collective times out ({TIMEOUT_ENV}); leave mpi4py.rc.thread_level at "
        f"'multiple', or set {HEARTBEAT_TIMEOUT_ENV}=0 to go without the heartbeat",
        RuntimeWarning,
        stacklevel=4,
    )
    return False


def _gather_names(comm: Any, name: Any, size: int) -> list[str]:
    """Every rank's host name (at most 255 bytes each), in rank order."""
    lengths = np.empty(size, dtype=np.int64)
    comm.Allgather(np.array([name.size], dtype=np.int64), lengths)
    names = np.empty(int(lengths.sum()), dtype=np.uint8)
    comm.Allgatherv(name, [names, lengths])
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    return [
        names[bounds[r] : bounds[r + 1]].tobytes().decode(errors="replace") for r in range(size)
    ]


_world: World | None = None
_probed = False


def world() -> World | None:
    """This process's MPI world, or ``None`` when it runs alone.

    Alone means not started by an MPI launcher (MPI is then not initialized at
    all), or started as a single rank.
    """
    global _world, _probed
    if not _probed:
        if launched_by_mpi():
            mpi = _import_mpi()
            if mpi.COMM_WORLD.Get_size() > 1:
                _world = World(mpi.COMM_WORLD, mpi)
        _probed = True
    return _world
