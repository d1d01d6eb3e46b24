"""The exception classes of ``monitored.supervisor``: one class per kind of failure."""

from __future__ import annotations

from .._core._errors import MonitoredError

__all__ = ["SummaryFunctionError", "SupervisorError"]


class SupervisorError(MonitoredError):
    """Base class of the errors raised by the :class:`~monitored.Supervisor` itself."""


class SummaryFunctionError(SupervisorError, TypeError):
    """A summary function (``summary_op``) or ``summary_computed`` got something that is
    not ``{tag: number or numeric array}``; the message names the function and the tag."""
