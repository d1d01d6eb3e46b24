"""The exception classes of ``monitored-early-stopping``: one class per kind of failure."""

from __future__ import annotations

from monitored import MonitoredError

__all__ = [
    "EarlyStoppingConfigError",
    "EarlyStoppingError",
    "EarlyStoppingStateError",
    "MonitoredValueError",
]


class EarlyStoppingError(MonitoredError):
    """Base class of every error raised by ``monitored-early-stopping``."""


class EarlyStoppingConfigError(EarlyStoppingError, ValueError):
    """An argument of an early-stopping hook is invalid (``patience < 0``, unknown ``mode``)."""


class MonitoredValueError(EarlyStoppingError, LookupError):
    """The monitored value is missing at a check (an unknown name) or is not a scalar."""


class EarlyStoppingStateError(EarlyStoppingError, ValueError):
    """The state restored from a checkpoint is not one this plugin saved (a field missing
    or of the wrong kind): refused when restored, not met as a crash at a later check."""
