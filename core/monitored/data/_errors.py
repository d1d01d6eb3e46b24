"""The exception classes of ``monitored.data``: one class per kind of input failure.

Every message names the pipeline's source and, where one is concerned, the batch
index and the field, so a bad record can be found without a debugger.
"""

from __future__ import annotations

from .._core._errors import MonitoredError

__all__ = [
    "BatchError",
    "DataError",
    "InputStateError",
    "ProducerError",
    "QueueClosedError",
    "ResumeMismatchError",
]


class DataError(MonitoredError):
    """Base class of the errors raised by ``monitored.data``."""


class ProducerError(DataError):
    """A producer (the source, a loader thread or task) raised.

    ``source`` is the pipeline's name and ``index`` the batch being produced; the
    original exception is the ``__cause__``. Raised from the step that would have
    consumed that batch: the batches before it are delivered first.
    """

    def __init__(self, message: str, *, source: str, index: int) -> None:
        super().__init__(message)
        self.source = source
        self.index = index


class BatchError(DataError, TypeError):
    """A batch is not a structure of arrays, or its structure changed.

    ``field`` is the path of the offending entry (``"['x']"``, ``"[1]"``).
    """

    def __init__(self, message: str, *, source: str, index: int, field: str) -> None:
        super().__init__(message)
        self.source = source
        self.index = index
        self.field = field


class ResumeMismatchError(DataError, ValueError):
    """A checkpoint's input position was saved by a pipeline configured differently.

    Resuming would silently feed other batches than the interrupted run would
    have; the message names each setting that differs.
    """


class InputStateError(DataError, ValueError):
    """The input position a checkpoint holds for a pipeline is damaged.

    Not a number where the next batch's index should be, a negative index, a
    skipped range that is not ``[start, stop]``: resuming from it would feed
    batches from nowhere. The message names the pipeline and the entry.
    """


class QueueClosedError(DataError):
    """An enqueue on a closed :class:`~monitored.data.FIFOQueue`."""
