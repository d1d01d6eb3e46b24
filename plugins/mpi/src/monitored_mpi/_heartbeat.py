"""The heartbeat: a lost rank is told apart from a slow collective.

A rank whose host lost its network, crashed without a word or was frozen looks,
from the others, like a rank that is merely late: they wait in the next
collective until ``MONITORED_MPI_TIMEOUT`` (300 s, the knob raised for slow
checkpoints) runs out, with a message about collectives called on some ranks
only. So every rank also sends a tiny message to its neighbours once a second,
from a daemon thread of its own, and notes when it last heard from each (its
two neighbours on each side in rank order: every other rank in jobs of up to
5). A rank not heard from for ``MONITORED_MPI_HEARTBEAT_TIMEOUT`` seconds
(default 30) is lost: the next wait of a collective on the ranks that watch it
raises :class:`PeerLostError` naming that rank and its host, and the job ends
as any failure does (the report, then ``MPI_Abort``, which ends every rank).

The thread runs whatever the main thread does: a rank busy for minutes writing
a checkpoint, or computing in NumPy, keeps beating (Python hands the thread the
interpreter at least every 5 ms, and NumPy and file I/O release it). Only code
that holds the interpreter lock for longer than the timeout in one native call
would starve it; ``MONITORED_MPI_HEARTBEAT_TIMEOUT=0`` switches the heartbeat off.

The beats travel over MPI itself, on a communicator of their own (so they never
match a collective's messages), the same network as the training's; mpi4py
initializes MPI with ``MPI_THREAD_MULTIPLE``, which a second thread needs.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from typing import Any, Final, final

import numpy as np

from ._errors import MPIError, PeerLostError

__all__ = ["DEFAULT_HEARTBEAT_TIMEOUT_SECS", "HEARTBEAT_TIMEOUT_ENV", "Heartbeat"]

#: Seconds without a beat after which a rank is lost (default 30; 0 switches it off).
HEARTBEAT_TIMEOUT_ENV: Final = "MONITORED_MPI_HEARTBEAT_TIMEOUT"
DEFAULT_HEARTBEAT_TIMEOUT_SECS: Final = 30.0
#: The longest pause between two beats (shorter when the timeout is under 5 s).
_LONGEST_INTERVAL: Final = 1.0
#: Beats to one peer left unfinished (a frozen peer's) before this rank stops sending more.
_MOST_PENDING_SENDS: Final = 64
#: Ranks watched on each side of a rank, in rank order.
_NEIGHBOURS: Final = 2
#: Seconds the exit waits for the thread and its last sends.
_EXIT_WAIT_SECS: Final = 2.0


def watched(rank: int, size: int) -> list[int]:
    """The ranks that ``rank`` beats to and listens to: ``_NEIGHBOURS`` on each side
    in rank order, round the ring (every other rank in jobs of up to 5).

    Each rank is watched by as many, whatever the size of the job: no rank talks
    to all the others (a connection to each, on TCP a socket each), and the
    first watcher to notice ends the whole job.
    """
    near = {(rank + step) % size for d in range(1, _NEIGHBOURS + 1) for step in (d, -d)}
    return sorted(near - {rank})


def heartbeat_timeout_from_env() -> float:
    """``MONITORED_MPI_HEARTBEAT_TIMEOUT`` in seconds (0: no heartbeat)."""
    raw = os.environ.get(HEARTBEAT_TIMEOUT_ENV)
    if raw is None or not raw.strip():
        return DEFAULT_HEARTBEAT_TIMEOUT_SECS
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise MPIError(
            f"{HEARTBEAT_TIMEOUT_ENV}={raw!r}: give a number of seconds > 0 (0 switches the "
            "heartbeat off)"
        )
    return value


@final
class Heartbeat:
    """Beats to every other rank of ``comm`` and notes who went silent.

    ``comm`` is a communicator of the heartbeat's own (a duplicate); ``hosts``
    names each rank's machine for the error. :attr:`lost` is ``None`` until a
    rank has been silent for ``timeout`` seconds, then the error to raise.
    """

    __slots__ = (
        "_comm",
        "_hosts",
        "_last",
        "_stop",
        "_thread",
        "interval",
        "lost",
        "rank",
        "size",
        "timeout",
    )

    def __init__(self, comm: Any, hosts: list[str], timeout: float) -> None:
        self._comm = comm
        self._hosts = hosts
        self.rank: int = comm.Get_rank()
        self.size: int = comm.Get_size()
        self.timeout = timeout
        self.interval = min(_LONGEST_INTERVAL, timeout / 5)
        self.lost: PeerLostError | None = None
        self._last = [time.monotonic()] * self.size
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="monitored-mpi heartbeat", daemon=True
        )
        self._thread.start()
        # Before MPI_Finalize (mpi4py finalizes after the interpreter's atexit functions).
        atexit.register(self.close)

    def silent_for(self, rank: int) -> float:
        """Seconds since a beat of ``rank`` last arrived."""
        return time.monotonic() - self._last[rank]

    def close(self) -> None:
        """Stop beating (at exit, before MPI is finalized)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(_EXIT_WAIT_SECS)

    def _lose(self, peer: int, why: str) -> None:
        if self.lost is None:
            self.lost = PeerLostError(
                f"rank {peer} of {self.size} (host {self._hosts[peer]!r}) {why}, seen from rank "
                f"{self.rank} (host {self._hosts[self.rank]!r}): its host or its network is "
                "gone, or the process is frozen; every rank of the job ends "
                f"({HEARTBEAT_TIMEOUT_ENV} sets the limit, default "
                f"{DEFAULT_HEARTBEAT_TIMEOUT_SECS:g}s)"
            )

    def _run(self) -> None:
        comm, peers = self._comm, watched(self.rank, self.size)
        beat = np.zeros(1, dtype=np.uint8)
        inbox = {peer: np.zeros(1, dtype=np.uint8) for peer in peers}
        receiving = {peer: comm.Irecv(inbox[peer], source=peer, tag=0) for peer in peers}
        sending: dict[int, list[Any]] = {peer: [] for peer in peers}
        next_beat = 0.0
        # Polled 10 times per interval: a beat is noticed within a tenth of the interval.
        poll = self.interval / 10
        try:
            while not self._stop.wait(poll):
                now = time.monotonic()
                for peer in peers:
                    try:
                        while receiving[peer].Test():
                            self._last[peer] = time.monotonic()
                            receiving[peer] = comm.Irecv(inbox[peer], source=peer, tag=0)
                        pending = [r for r in sending[peer] if not r.Test()]
                        if now >= next_beat and len(pending) < _MOST_PENDING_SENDS:
                            pending.append(comm.Isend(beat, dest=peer, tag=0))
                    except Exception as exc:  # an MPI error talking to this peer: it is lost
                        self._lose(peer, f"cannot be reached ({type(exc).__name__}: {exc})")
                        return
                    sending[peer] = pending
                    if self.silent_for(peer) > self.timeout:
                        self._lose(peer, f"sent no heartbeat for {self.timeout:g}s")
                        return
                if now >= next_beat:
                    next_beat = now + self.interval
        finally:
            self._finish(receiving, sending)

    def _finish(self, receiving: dict[int, Any], sending: dict[int, list[Any]]) -> None:
        """Cancel the posted receives and leave sends a moment to complete."""
        for request in receiving.values():
            try:
                request.Cancel()
                request.Wait()
            except Exception:  # the job is ending and MPI may be torn down: nothing to report
                continue
        deadline = time.monotonic() + _EXIT_WAIT_SECS
        for requests in sending.values():
            for request in requests:
                while time.monotonic() < deadline:
                    try:
                        if request.Test():
                            break
                    except Exception:  # as above
                        break
                    time.sleep(0.001)
