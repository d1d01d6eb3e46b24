"""When a session stops: the stop agreement of its processes, and a verdict raised after.

``StopAgreement`` is the part of :class:`~monitored.MonitoredSession` that decides a
stop (see ``_session.py``): every process of a cluster votes at the same points (the
end of each step, an input pipeline's first batch, a step a process sits out), and
the session stops only where they agree, logging who asked. The per-step vote is
inlined in the hot path (``MonitoredSession._run_hooked``); these are the rest.
"""

from __future__ import annotations

import logging

from ._cluster import Cluster, LocalCluster
from ._coordinator import Coordinator
from ._state import TrainState

__all__ = ["StopAgreement"]

log = logging.getLogger("monitored")


class StopAgreement:
    """Takes part in the processes' stop decisions (a part of ``MonitoredSession``)."""

    _state: TrainState
    _cluster: Cluster
    _coord: Coordinator
    _should_stop: bool
    _stop_agreed: bool
    _after_close: BaseException | None

    def raise_after_close(self, exc: BaseException) -> None:
        """Stop, and raise ``exc`` from the ``async with`` once the session has closed.

        For a hook whose verdict ends the run without it being a failure (Optuna's
        ``TrialPruned``): the stop is requested through the coordinator, so it
        takes effect after the current step, through the stop agreement of every
        process; the close is a normal one (``end`` runs on every hook, a final
        checkpoint and summaries are written); then ``exc`` is raised instead of
        leaving the block normally. A failure of the session (an exception in the
        block, a hook or a background task) is raised instead, ``exc`` dropped.
        The first verdict asked for is the one raised.
        """
        if not isinstance(exc, BaseException):
            raise TypeError(
                f"raise_after_close takes an exception, got {type(exc).__name__}: {exc!r}"
            )
        if self._after_close is None:
            self._after_close = exc
        self._coord.request_stop()

    def _log_stop(self, requested_by: str | None) -> None:
        """Log who asked for the stop the processes agreed on."""
        who = requested_by or self._coord.stop_requested_by
        if who is None:
            alone = isinstance(self._cluster, LocalCluster)
            who = "an earlier stop request" if alone else "another process of the job"
        log.info("Stopping after step %d: stop requested by %s", self._state.global_step, who)

    def _agree_to_stop_now(self, local: bool, requested_by: str | None = None) -> bool:
        """Take part in a stop agreement that every process holds at this same point.

        Besides the one at the end of each step: before the first batch of an
        input pipeline (``monitored.data``), or for a step this process sits out.
        ``True`` when the processes agreed to stop (the loop then ends).
        """
        if self._cluster.agree_to_stop(local):
            self._should_stop = self._stop_agreed = True
            self._log_stop(requested_by)
            return True
        return False
