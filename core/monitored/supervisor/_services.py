"""The Supervisor's timed services: the summary function and ``global_step/sec``.

TF1 ran each in a thread (``SVSummaryThread``, ``SVStepCounterThread``); here each
is a task of the session's task group, started through its
:class:`~monitored.Coordinator`, so an exception it raises stops the loop and is
raised from the next step or from ``managed_session``. The values go to every
summary sink of the session (the ``write_summaries`` hookspec; the summaries
plugin's hook writes the event file), or straight into the Supervisor's event
file when no sink of the summaries plugin is in the session (``summary_op=None``).
"""

from __future__ import annotations

import inspect
import logging
import numbers
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import numpy as np

from .._core._backend import to_host
from .._core._session import MonitoredSession
from ._errors import SummaryFunctionError

__all__ = ["STEP_RATE_TAG", "Emit", "count_steps", "run_summary_function", "summary_records"]

log = logging.getLogger("monitored")

#: TF1's tag for the step counter's summary.
STEP_RATE_TAG: Final = "global_step/sec"

#: How a service hands ``(step, {tag: value})`` on to be written.
Emit = Callable[[int, Mapping[str, Any]], Awaitable[None]]


async def run_summary_function(
    session: MonitoredSession, summary_fn: Callable[..., Any], interval: float, emit: Emit
) -> None:
    """Call ``summary_fn(state)`` now and every ``interval`` seconds; write what it returns."""
    coord = session.coord
    while True:
        step = session.state.global_step
        try:
            values = summary_fn(session.state)
            if inspect.isawaitable(values):
                values = await values
            check_summaries(values, f"summary function {_name_of(summary_fn)}")
            await emit(step, values)
        except Exception as exc:
            exc.add_note(
                f"raised in the Supervisor's summary service ({_name_of(summary_fn)}) at step "
                f"{step}"
            )
            raise
        if await coord.wait_for_stop(interval):
            return


async def count_steps(session: MonitoredSession, interval: float, emit: Emit) -> None:
    """Now and every ``interval`` seconds, write how many global steps per second were done.

    The first value, written when the service starts, is 0 (no step yet), as
    TF1's step counter writes at its start.
    """
    coord = session.coord
    last_step, last_time = session.state.global_step, time.monotonic()
    first = True
    while first or not await coord.wait_for_stop(interval):
        step, now = session.state.global_step, time.monotonic()
        elapsed = now - last_time
        rate = (step - last_step) / elapsed if elapsed > 0 else 0.0
        first = False
        last_step, last_time = step, now
        log.info("%s: %g", STEP_RATE_TAG, rate)
        try:
            await emit(step, {STEP_RATE_TAG: rate})
        except Exception as exc:
            exc.add_note(f"raised in the Supervisor's step counter service at step {step}")
            raise


def check_summaries(values: Any, where: str) -> None:
    """Refuse anything but ``{tag: number or numeric array}``, naming ``where`` and the tag."""
    if not isinstance(values, Mapping):
        raise SummaryFunctionError(
            f"{where} returned {type(values).__name__}; it must return a mapping of tags to "
            "numbers or numeric arrays"
        )
    for tag, value in values.items():
        if not isinstance(tag, str) or not tag:
            raise SummaryFunctionError(
                f"{where}: summary tags must be non-empty strings, got {tag!r}"
            )
        if isinstance(value, bool) or not (
            isinstance(value, numbers.Number) or _numeric_dtype(getattr(value, "dtype", None))
        ):
            raise SummaryFunctionError(
                f"{where}: the value of {tag!r} is {type(value).__name__}, not a number or a "
                "numeric array"
            )


def summary_records(
    values: Mapping[str, Any],
) -> tuple[list[tuple[str, str, Any, dict[str, Any]]], list[Any]]:
    """The records (scalars, histograms) of ``values`` and their host values, for a FileWriter."""
    records: list[tuple[str, str, Any, dict[str, Any]]] = [
        ("scalar" if int(getattr(value, "size", 1)) == 1 else "histogram", tag, value, {})
        for tag, value in values.items()
    ]
    host = to_host(list(values.values()))
    return records, list(host)


def _numeric_dtype(dtype: Any) -> bool:
    try:
        return dtype is not None and np.dtype(dtype).kind in "biuf"
    except TypeError:
        return False


def _name_of(fn: object) -> str:
    return str(getattr(fn, "__qualname__", None) or type(fn).__name__)
