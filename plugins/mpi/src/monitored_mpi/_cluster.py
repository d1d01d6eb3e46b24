"""``MPICluster``: the core's ``Cluster`` over MPI ranks, rank 0 the chief.

Every stop decision is one small allreduce on the control channel at the end of
each step (a hook's request, the NaN guard, early stopping, end of input and a
preemption signal on any rank), so every rank stops after the same step. It is
not folded into the gradient allreduce: that one runs inside the step, before
the hooks' ``after_run`` that decide, and would move every stop one step later.

With ``MONITORED_MPI_STOP_LAG=1`` the agreement at the end of a step is only
posted there (non-blocking) and read at the end of the next step: it travels
over the network together with that step's gradient reduction, so a step costs
one round trip instead of two, and every stop takes effect one step later, on
every rank alike. Agreements held where no step ran since the last one (before
the first step, before the first batch, at a close) stay exact and blocking.

A failure on one rank ends the job (fail-stop): the rank writes which rank
failed, at which step and with what, then calls ``MPI_Abort``, and the launcher
ends every rank; none is left waiting in a collective.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import traceback
from collections.abc import Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any, Final, final

import numpy as np

from monitored import ClusterSpec
from monitored.metrics import Metric

from ._collectives import exchange_bytes, merge_metrics
from ._errors import MPIError
from ._share import share_state
from ._world import World

if TYPE_CHECKING:
    from monitored import MonitoredSession

__all__ = ["STOP_LAG_ENV", "MPICluster"]

_STOP, _PREEMPTED, _CHIEF_SAVES = 0, 1, 2

#: ``1``: each step's stop agreement is read one step later, overlapped with the
#: next step's gradient reduction (one network round trip per step); ``0`` (the
#: default): exact, a stop takes effect after the step that asked for it.
STOP_LAG_ENV: Final = "MONITORED_MPI_STOP_LAG"


def stop_lag_from_env() -> bool:
    """Whether ``MONITORED_MPI_STOP_LAG`` asks for the overlapped (one step later) agreement."""
    raw = os.environ.get(STOP_LAG_ENV, "").strip()
    if raw in ("", "0"):
        return False
    if raw == "1":
        return True
    raise MPIError(f"{STOP_LAG_ENV}={raw!r}: give 0 (exact stops, the default) or 1")


@final
class MPICluster:
    """The ranks of an MPI job: rank 0 is the chief, every decision is shared."""

    __slots__ = (
        "_agreed_at",
        "_decision",
        "_forwarded",
        "_lag",
        "_pending",
        "_previous_handler",
        "_session",
        "_spec",
        "_vote",
        "_world",
        "preempted",
    )

    def __init__(self, world: World) -> None:
        self._world = world
        self._vote = np.zeros(3, dtype=np.int8)
        self._decision = np.zeros(3, dtype=np.int8)
        self._spec: ClusterSpec | None = None
        self._session: MonitoredSession | None = None
        self._previous_handler: Any = None
        self._forwarded = False
        #: Overlapped agreements (MONITORED_MPI_STOP_LAG=1): the one posted and not yet
        #: read (request, decision buffer, step), and the step of the last agreement.
        self._lag = stop_lag_from_env()
        if self._lag:
            world.hint = (
                f"; with {STOP_LAG_ENV}=1 every rank runs one more step after a stop is "
                "agreed, which a rank whose input ended first cannot: with input that ends "
                f"unevenly keep {STOP_LAG_ENV}=0"
            )
        self._pending: tuple[Any, np.ndarray[Any, Any], Any] | None = None
        self._agreed_at: Any = None
        #: Whether this rank received SIGTERM during the session.
        self.preempted = False

    # -- roles ---------------------------------------------------------------------------
    @property
    def is_chief(self) -> bool:
        return self._world.rank == 0

    @property
    def rank(self) -> int:
        return self._world.rank

    @property
    def size(self) -> int:
        return self._world.size

    @property
    def world(self) -> World:
        return self._world

    def cluster_spec(self) -> ClusterSpec:
        """The world as TF1's ``ClusterSpec``: ``chief`` (rank 0) and ``worker`` jobs.

        Addresses are the hosts' names (``MPI.Get_processor_name``); a collective,
        so every rank calls it, once (the answer is kept).
        """
        if self._spec is None:
            name = self._world.MPI.Get_processor_name().encode()
            hosts = [h.decode() for h in exchange_bytes(name, "cluster_spec", self._world)]
            self._spec = ClusterSpec({"chief": hosts[:1], "worker": hosts[1:]})
        return self._spec

    # -- the Cluster protocol ----------------------------------------------------------------
    async def share_state(self, session: MonitoredSession, max_wait_secs: float) -> None:
        self._session = session
        self._watch_sigterm()
        await share_state(self._world, session, max_wait_secs)
        # Agreements before the first step are exact (see _agree_overlapped).
        self._agreed_at = session.state.global_step

    def agree_to_stop(self, local: bool) -> bool:
        vote = self._vote
        vote[_STOP] = local
        vote[_PREEMPTED] = self.preempted
        vote[_CHIEF_SAVES] = self.is_chief and self._chief_saves_on_sigterm()
        world = self._world
        step = self._session.state.global_step if self._session is not None else "?"
        if self._lag:
            return self._agree_overlapped(step)
        world.wait(
            world.control.Iallreduce(vote, self._decision, op=world.MPI.MAX),
            f"the stop decision after step {step}",
        )
        return self._act_on(self._decision)

    def _act_on(self, decision: np.ndarray[Any, Any]) -> bool:
        """Whether to stop on ``decision`` (every rank's votes combined), and the
        chief's part in a preemption."""
        stop, preempted, chief_saves = (bool(x) for x in decision)
        if preempted and chief_saves and self.is_chief and not self._forwarded:
            # Another rank was preempted: the chief's checkpoint hook saves at the
            # next step and asks to stop, which every rank then agrees on.
            self._forwarded = True
            signal.raise_signal(signal.SIGTERM)
        stop = stop or (preempted and not chief_saves)
        if stop:
            self._unwatch_sigterm()
        return stop

    def _agree_overlapped(self, step: Any) -> bool:
        """MONITORED_MPI_STOP_LAG=1: post this step's votes, act on the last step's.

        Every rank takes the same branch: the global step is the same on all.
        """
        world, previous = self._world, self._pending
        self._pending = None
        decision = np.zeros(3, dtype=np.int8)
        if previous is not None:
            request, answer, at = previous
            world.wait(request, f"the stop decision after step {at}")
            decision |= answer
        if step == self._agreed_at:
            # No step since the last agreement (before the first step or batch, a
            # close): nothing to overlap with, so exact.
            world.wait(
                world.control.Iallreduce(self._vote, self._decision, op=world.MPI.MAX),
                f"the stop decision after step {step}",
            )
            decision |= self._decision
            return self._act_on(decision)
        self._agreed_at = step
        answer = np.zeros(3, dtype=np.int8)
        request = world.control.Iallreduce(self._vote.copy(), answer, op=world.MPI.MAX)
        self._pending = (request, answer, step)
        if self._act_on(decision):
            # Stopping: the votes just posted are read too (every rank posted them),
            # so that nothing is left on the control channel.
            self._pending = None
            world.wait(request, f"the stop decision after step {step}")
            return True
        return False

    def merge_metrics(self, metrics: Sequence[Metric]) -> None:
        """Every rank's metrics summed into every rank's (a sharded evaluation)."""
        merge_metrics(metrics, world_=self._world)

    def fail(self, failure: BaseException) -> None:
        """Report ``failure`` as this rank's, then end every rank of the job."""
        self._unwatch_sigterm()
        step = self._session.state.global_step if self._session is not None else "?"
        lines = traceback.format_exception(failure)
        message = (
            f"monitored-mpi: rank {self.rank} of {self.size} failed at step {step} with "
            f"{type(failure).__name__}: {failure}; ending every rank of the job\n" + "".join(lines)
        )
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(message)
            sys.stderr.flush()
        self._world.abort(1)

    # -- preemption --------------------------------------------------------------------------
    def _chief_saves_on_sigterm(self) -> bool:
        """Whether something other than this cluster handles SIGTERM on the chief."""
        handler = signal.getsignal(signal.SIGTERM)
        return handler not in (signal.SIG_DFL, signal.SIG_IGN, None, self._on_sigterm)

    def _watch_sigterm(self) -> None:
        """Turn SIGTERM into a vote to stop, where nothing else handles it."""
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)

    def _unwatch_sigterm(self) -> None:
        if self._previous_handler is None:
            return
        if threading.current_thread() is threading.main_thread():
            if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
                signal.signal(signal.SIGTERM, self._previous_handler)
            self._previous_handler = None

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if not self.preempted:
            self.preempted = True
            with contextlib.suppress(OSError):
                line = (
                    f"monitored-mpi: rank {self.rank} received SIGTERM; every rank stops after "
                    "an agreed step (the chief checkpoints it when it saves checkpoints)\n"
                )
                os.write(2, line.encode())
