"""The built-in hooks: TF1's ``basic_session_run_hooks`` for ``monitored``.

They read the global step straight from ``session.state`` (a host integer), so
none of them adds a device transfer to a step unless it fetches tensors.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, final

import anyio
import numpy as np

from ._errors import OutOfRangeError
from ._run import SessionRunArgs
from ._session_run_hook import SessionRunHook
from ._timer import SecondOrStepTimer

if TYPE_CHECKING:
    from ._coordinator import Coordinator
    from ._run import SessionRunContext, SessionRunValues
    from ._session import MonitoredSession

__all__ = [
    "FeedFnHook",
    "FinalOpsHook",
    "GlobalStepWaiterHook",
    "LoggingTensorHook",
    "StepCounterHook",
    "StopAtStepHook",
]

log = logging.getLogger("monitored")


@final
class StopAtStepHook(SessionRunHook):
    """Requests a stop at a given global step.

    ``num_steps`` counts from the global step found when the session is created
    (after a resume at step 5, ``num_steps=2`` stops at 7); ``last_step`` is
    absolute. Exactly one of the two is given.
    """

    __slots__ = ("_last_step", "_num_steps")

    def __init__(self, num_steps: int | None = None, last_step: int | None = None) -> None:
        if num_steps is None and last_step is None:
            raise ValueError("One of num_steps or last_step must be specified.")
        if num_steps is not None and last_step is not None:
            raise ValueError("Only one of num_steps or last_step can be specified.")
        if num_steps is not None and num_steps < 0:
            raise ValueError(f"num_steps must be >= 0, got {num_steps}")
        self._num_steps = num_steps
        self._last_step = last_step

    @property
    def last_step(self) -> int | None:
        """The step to stop at (known once the session is created)."""
        return self._last_step

    def after_create_session(self, session: MonitoredSession, coord: Coordinator) -> None:
        step = session.state.global_step
        if self._last_step is None:
            assert self._num_steps is not None
            self._last_step = step + self._num_steps
        if step >= self._last_step:
            coord.request_stop()

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        assert self._last_step is not None
        if run_context.session.state.global_step >= self._last_step:
            run_context.request_stop()


@final
class StepCounterHook(SessionRunHook):
    """Measures ``global_step/sec``: logs it and hands it to the summary sinks.

    ``every_n_steps`` or ``every_n_secs`` (TF1's arguments); ``output_dir`` and
    ``summary_writer`` are accepted for TF1 compatibility and unused: summaries
    go to whatever plugins implement ``write_summaries``.
    """

    __slots__ = ("_timer", "output_dir")

    def __init__(
        self,
        every_n_steps: int | None = 100,
        every_n_secs: float | None = None,
        output_dir: str | None = None,
        summary_writer: object = None,
    ) -> None:
        if (every_n_steps is None) == (every_n_secs is None):
            raise ValueError("exactly one of every_n_steps and every_n_secs should be provided.")
        self._timer = SecondOrStepTimer(every_steps=every_n_steps, every_secs=every_n_secs)
        self.output_dir = output_dir

    def begin(self, session: MonitoredSession) -> None:
        self._timer.reset()

    def after_run(
        self, run_context: SessionRunContext, run_values: SessionRunValues
    ) -> Awaitable[None] | None:
        # Sync on purpose: most steps return at once; the session awaits the
        # summary write on the steps that produce one.
        session = run_context.session
        step = session.state.global_step
        if not self._timer.should_trigger_for_step(step):
            return None
        elapsed_secs, elapsed_steps = self._timer.update_last_triggered_step(step)
        if elapsed_secs is None or elapsed_steps is None:
            return None
        rate = elapsed_steps / elapsed_secs if elapsed_secs > 0 else float("inf")
        log.info("global_step/sec: %g", rate)
        if session.has_summary_sinks:
            return session.write_summaries(step, {"global_step/sec": rate})
        return None


@final
class LoggingTensorHook(SessionRunHook):
    """Logs the values of named tensors every N steps, every N seconds, or at the end.

    ``tensors`` is a list of names (step outputs or state entries) or a dict of
    tags to names; ``formatter`` turns ``{tag: value}`` into the logged line.
    """

    __slots__ = ("_at_end", "_formatter", "_iter", "_should_trigger", "_tags", "_timer")

    def __init__(
        self,
        tensors: Sequence[str] | Mapping[str, str],
        every_n_iter: int | None = None,
        every_n_secs: float | None = None,
        at_end: bool = False,
        formatter: Callable[[dict[str, Any]], str] | None = None,
    ) -> None:
        only_log_at_end = at_end and every_n_iter is None and every_n_secs is None
        if not only_log_at_end and (every_n_iter is None) == (every_n_secs is None):
            raise ValueError(
                "either at_end and/or exactly one of every_n_iter and every_n_secs must be "
                "provided."
            )
        if every_n_iter is not None and every_n_iter <= 0:
            raise ValueError(f"invalid every_n_iter={every_n_iter}.")
        if isinstance(tensors, str):
            raise TypeError("tensors must be a list of names or a dict of tags to names")
        self._tags: dict[str, str] = (
            dict(tensors) if isinstance(tensors, Mapping) else {name: name for name in tensors}
        )
        self._timer = (
            None
            if only_log_at_end
            else SecondOrStepTimer(every_secs=every_n_secs, every_steps=every_n_iter)
        )
        self._at_end = at_end
        self._formatter = formatter
        self._iter = 0
        self._should_trigger = False

    def begin(self, session: MonitoredSession) -> None:
        if self._timer is not None:
            self._timer.reset()
        self._iter = 0

    def before_run(self, run_context: SessionRunContext) -> SessionRunArgs | None:
        self._should_trigger = self._timer is not None and self._timer.should_trigger_for_step(
            self._iter
        )
        return SessionRunArgs(self._tags) if self._should_trigger else None

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        if self._should_trigger:
            self._log(run_values.results)
        self._iter += 1

    def end(self, session: MonitoredSession) -> None:
        # The requested values are logged even when steps return no outputs (state
        # entries); before any step, only if every name is a state entry.
        if self._at_end and (
            self._iter > 0
            or all(name in session.state or name == "global_step" for name in self._tags.values())
        ):
            self._log(session.fetch(self._tags))

    def _log(self, values: dict[str, Any]) -> None:
        elapsed = ""
        if self._timer is not None:
            secs, _ = self._timer.update_last_triggered_step(self._iter)
            elapsed = f" ({secs:.3f} sec)" if secs is not None else ""
        if self._formatter is not None:
            log.info("%s", self._formatter(values))
        else:
            line = ", ".join(f"{tag} = {_format(value)}" for tag, value in values.items())
            log.info("%s%s", line, elapsed)


def _format(value: Any) -> str:
    array = np.asarray(value)
    if array.size != 1:
        return np.array2string(array, threshold=10)
    item = array.item()
    return f"{item:.6g}" if isinstance(item, float) else str(item)


@final
class GlobalStepWaiterHook(SessionRunHook):
    """Delays the first step until the global step reaches ``wait_until_step``.

    For workers that should start only once the chief has trained a while. It
    waits asynchronously, polling the shared state every half second.
    """

    __slots__ = ("_wait_until_step", "poll_secs")

    def __init__(self, wait_until_step: int, poll_secs: float = 0.5) -> None:
        self._wait_until_step: int | None = wait_until_step
        self.poll_secs = poll_secs

    async def before_run(self, run_context: SessionRunContext) -> None:
        if self._wait_until_step is None or self._wait_until_step <= 0:
            return
        state = run_context.session.state
        last_log = time.monotonic()
        while state.global_step < self._wait_until_step:
            if run_context.session.coord.should_stop():
                return
            if time.monotonic() - last_log > 30:
                log.info(
                    "Waiting for global step %d before starting; now at %d",
                    self._wait_until_step,
                    state.global_step,
                )
                last_log = time.monotonic()
            await anyio.sleep(self.poll_secs)
        self._wait_until_step = None


@final
class FinalOpsHook(SessionRunHook):
    """Evaluates ``final_ops`` when the session ends; read :attr:`final_ops_values`.

    ``final_ops`` is a fetch structure (names of step outputs or state entries) or
    a callable ``final_ops(state, **final_ops_feed_dict)``.
    """

    __slots__ = ("_feeds", "_final_ops", "_values")

    def __init__(
        self,
        final_ops: Any,
        final_ops_feed_dict: Mapping[str, Any] | None = None,
    ) -> None:
        if final_ops_feed_dict and not callable(final_ops):
            raise ValueError("final_ops_feed_dict needs final_ops to be a callable")
        self._final_ops = final_ops
        self._feeds = dict(final_ops_feed_dict or {})
        self._values: Any = None

    @property
    def final_ops_values(self) -> Any:
        """What ``final_ops`` evaluated to at the end (``None`` before)."""
        return self._values

    async def end(self, session: MonitoredSession) -> None:
        try:
            if callable(self._final_ops):
                result = self._final_ops(session.state, **self._feeds)
                self._values = await result if hasattr(result, "__await__") else result
            else:
                self._values = session.fetch(self._final_ops)
        except (OutOfRangeError, StopIteration):
            log.warning(
                "An OutOfRangeError or StopIteration was raised by the final ops of "
                "FinalOpsHook. This typically means that the final ops have a dependency "
                "back to some input source, which should be avoided: they run once the "
                "input is exhausted."
            )
            raise


@final
class FeedFnHook(SessionRunHook):
    """Adds ``feed_fn()`` (a mapping) to each step's keyword arguments."""

    __slots__ = ("feed_fn",)

    def __init__(self, feed_fn: Callable[[], Mapping[str, Any]]) -> None:
        self.feed_fn = feed_fn

    def before_run(self, run_context: SessionRunContext) -> SessionRunArgs:
        return SessionRunArgs(fetches=None, feeds=self.feed_fn())
