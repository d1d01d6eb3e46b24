"""The exception classes of ``monitored-progress``: one class per kind of failure."""

from __future__ import annotations

from monitored import MonitoredError

__all__ = ["ProgressConfigError", "ProgressError"]


class ProgressError(MonitoredError):
    """Base class of every error raised by ``monitored-progress``."""


class ProgressConfigError(ProgressError, ValueError):
    """An argument of ``ProgressHook`` is invalid (``every_n_steps < 0``, unknown ``mode``)."""
