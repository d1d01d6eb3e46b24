"""Event file names that sort in the order of the run, whatever the wall clock does.

TensorBoard reads a log directory's event files in the order of their names
(``DirectoryWatcher`` and ``DirectoryLoader`` both sort the paths), and its
reader drops what an earlier file holds from a step on when a later file starts
again at a lower step (orphaned data from a crash). TF1 (and tensorboardX) put
the wall-clock second in the name (``events.out.tfevents.<seconds>.<host>``): a
run resumed with the clock set back (a VM restored from a snapshot, NTP
stepping) made a file that sorted *before* the previous run's, and TensorBoard
then hid the resumed steps.

Here the ``<seconds>`` field is the later of the clock and one more than the
newest such field already in the directory: a new file always sorts after every
earlier one of the directory, and the names keep TF1's form (tools that look for
``events.out.tfevents.*`` still find them). Two writers starting in the same
second in one directory (not one run's files) are ordered by the rest of the
name, which carries the time in nanoseconds, the pid and a sequence number.
"""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Iterable
from typing import Any, Final

from tensorboardX.event_file_writer import EventsWriter
from tensorboardX.proto import event_pb2
from tensorboardX.record_writer import RecordWriter

__all__ = ["PREFIX", "OrderedEventsWriter", "event_file_name", "next_stamp"]

#: The start of every event file's name (TF1's).
PREFIX: Final = "events.out.tfevents."
_STAMP: Final = re.compile(r"events\.out\.tfevents\.(\d{10})\.")


def next_stamp(names: Iterable[str], now: float) -> int:
    """The ``<seconds>`` field of a new event file among ``names``: it sorts last."""
    newest = -1
    for name in names:
        match = _STAMP.match(name)
        if match is not None:
            newest = max(newest, int(match.group(1)))
    return max(int(now), newest + 1)


def event_file_name(names: Iterable[str], now: float, suffix: str) -> str:
    """The name of a new event file of a directory holding ``names``."""
    return f"{PREFIX}{next_stamp(names, now):010d}.{socket.gethostname()}{suffix}"


class OrderedEventsWriter(EventsWriter):  # type: ignore[misc]
    """tensorboardX's ``EventsWriter`` on a file name chosen by the caller.

    tensorboardX makes the name itself from the clock; the format (TFRecord
    framing, the ``brain.Event:2`` header first) is its own, unchanged.
    """

    def __init__(self, path: str, wall_time: float) -> None:
        self._file_name = path
        self._num_outstanding_events = 0
        self._py_recordio_writer: Any = RecordWriter(path)
        self._event = event_pb2.Event()
        self._event.wall_time = wall_time
        self._event.file_version = "brain.Event:2"
        self._lock = threading.Lock()
        self.write_event(self._event)
