"""The exception classes of ``monitored``: one class per kind of failure.

TensorFlow's names are kept where TF1 users rely on them (``OutOfRangeError``,
``AbortedError``, ``UnavailableError``, ``DeadlineExceededError``,
``NanLossDuringTrainingError``); the plugin errors say which plugin, which
distribution and which hook is at fault.
"""

from __future__ import annotations

__all__ = [
    "AbortedError",
    "DamagedCheckpointError",
    "DeadlineExceededError",
    "EventLoopEndedError",
    "FetchError",
    "MissingPluginError",
    "MonitoredError",
    "NanLossDuringTrainingError",
    "OutOfRangeError",
    "PluginError",
    "PluginLoadError",
    "PluginOptionError",
    "PluginValidationError",
    "UnavailableError",
    "UnsupportedArgumentError",
    "install_hint",
]


class MonitoredError(Exception):
    """Base class of every error raised by ``monitored`` itself."""


class OutOfRangeError(MonitoredError):
    """The input is exhausted.

    Raised inside ``async with session:`` it ends training normally: ``end`` is
    called on every hook and the exception is swallowed, as in TF1.
    """


class AbortedError(MonitoredError):
    """A step was aborted; the session re-creates itself and retries the step."""


class UnavailableError(MonitoredError):
    """A resource a step needs is unavailable; handled like :class:`AbortedError`."""


class EventLoopEndedError(MonitoredError, RuntimeError):
    """The event loop a session was opened in ended while the session was open.

    A session's background work lives in a task of that loop: once the loop is gone
    (``asyncio.run`` returned, or IPython's ``%autoawait trio`` ran a cell in a
    ``trio.run`` of its own), the session cannot run on; close it, and open a new one.
    """


class DeadlineExceededError(MonitoredError):
    """A wait (a worker waiting for the chief) ran past its deadline."""


class NanLossDuringTrainingError(MonitoredError):
    """The loss became NaN (raised by NaN guards)."""

    def __str__(self) -> str:
        return super().__str__() or "NaN loss during training."


class FetchError(MonitoredError, LookupError):
    """A hook asked for a value that is neither a step output nor a state entry."""


class PluginError(MonitoredError):
    """A plugin or hook could not be loaded, validated or configured.

    ``plugin`` is the name it was registered under, ``distribution`` the installed
    package that provides it (``None`` for hooks passed in code) and ``hook`` the
    hook concerned, when one is.
    """

    def __init__(
        self,
        message: str,
        *,
        plugin: str | None = None,
        distribution: str | None = None,
        hook: str | None = None,
    ) -> None:
        super().__init__(message)
        self.plugin = plugin
        self.distribution = distribution
        self.hook = hook


class PluginLoadError(PluginError):
    """An installed plugin failed to import."""


class PluginValidationError(PluginError):
    """A plugin implements a hook that does not exist, or with a wrong signature."""


class PluginOptionError(PluginError, ValueError):
    """A plugin option is unknown, set for a plugin that is not installed, or of the wrong type."""


class MissingPluginError(PluginError):
    """A feature was asked for whose plugin package is not installed (or is disabled)."""


def install_hint(distribution: str) -> str:
    """How to install a plugin distribution of this repository, for error messages.

    The plugin packages live in the repository's ``plugins/`` folder (and are not
    on a package index yet), so the hint names both ways.
    """
    folder = distribution.removeprefix("monitored-")
    return (
        f"pip install {distribution}, or from a clone of monitored: pip install ./plugins/{folder}"
    )


class DamagedCheckpointError(MonitoredError):
    """A checkpoint that cannot be restored because it is incomplete or damaged.

    A provider of the ``"checkpoint"`` capability raises a subclass of it
    (``monitored-checkpoint``'s ``CorruptCheckpointError`` is one), so that an
    evaluator following a directory can tell "not (yet) usable: skip it" from an
    error in its own configuration without importing the provider's package.
    """


class UnsupportedArgumentError(MonitoredError, TypeError, ValueError):
    """A TF1 argument with no meaning here (``config=``, ``master=``, ...).

    The message says what to do instead. A ``TypeError`` (an argument the call
    cannot take) and a ``ValueError`` (how ``master=`` was refused before).
    """
