"""The exception classes of ``monitored-summaries``: one class per kind of failure.

Every message names what is at fault: the summary, the step, the path, the problem.
All derive from :class:`SummaryError`, itself a :class:`monitored.MonitoredError`.
"""

from __future__ import annotations

from monitored import MonitoredError, printable

__all__ = [
    "SummaryDirectoryError",
    "SummaryError",
    "SummaryNameError",
    "SummaryReaderError",
    "SummaryScheduleError",
    "SummaryValueError",
    "SummaryWriteError",
]


class SummaryError(MonitoredError):
    """Base class of every error raised by ``monitored-summaries``."""


class SummaryNameError(SummaryError, ValueError):
    """A summary name is empty or not a string."""


class SummaryValueError(SummaryError, ValueError):
    """A summary value has the wrong type, rank, dtype or contents for its kind."""


class SummaryScheduleError(SummaryError, ValueError):
    """``save_steps`` and ``save_secs`` were both given, or neither, or one is not positive."""


class SummaryDirectoryError(SummaryError):
    """The log directory is a file, cannot be created, or is not writable."""


class SummaryWriteError(SummaryError):
    """Writing or flushing an event file failed (disk full, file removed, permission...).

    Raised from the next step of the session that writes there, or from the next
    call on the writer; ``path`` is the event file and ``__cause__`` the OS error.
    """

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        #: The event file that could not be written.
        self.path = path


class SummaryReaderError(SummaryError):
    """An event file cannot be read: not a regular file, or a corrupt record.

    Its message names the file (found by listing a directory, maybe hostile) with
    every character a terminal would act on escaped (``monitored.printable``).
    """

    def __init__(self, *args: object) -> None:
        if args and isinstance(args[0], str):
            args = (printable(args[0]), *args[1:])
        super().__init__(*args)
