"""``FileWriter``: TF1's event-file writer on tensorboardX, with errors that surface.

tensorboardX's ``EventsWriter`` does the file format (TFRecord framing, CRCs,
the ``brain.Event:2`` header); this module adds what TF1's ``FileWriter`` promised
and tensorboardX's own queue does not keep: a failure in the writing thread is
never lost (it is raised from the next call, and handed to error listeners such
as a session's coordinator), a file or directory removed under the writer is
noticed at the next flush, ``flush`` returns only once everything queued
before it is on disk, and the log directory may be any fsspec URL (see
``_logdir``: a remote event file is uploaded whole at each flush).

Encoding (histogram buckets, PNG, WAV) also happens in the writer's thread: the
step loop only queues host values. The thread is woken every ``max_queue``
events (or by a flush or a close, and at least every ``flush_secs``), not for
each: a summary written every few steps does not cost a thread switch each time.

The writer's thread is a daemon thread, so it never holds up the interpreter's
exit (a second Ctrl-C that lands while a writer is being made, say, leaves one
nobody will close); what is queued is flushed at exit instead. Once the
interpreter starts to exit, a wait for a writer's thread (a flush, a close, room
in a full queue) ends when that thread has made no progress for
:data:`EXIT_STALL_SECS`: a thread stuck in a hung file system does not hang
the exit, and one that is writing is never cut off.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import logging
import os
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO, Final, final

from tensorboardX.proto.event_pb2 import Event, SessionLog
from tensorboardX.proto.summary_pb2 import Summary

from ._encode import encode
from ._errors import SummaryDirectoryError, SummaryWriteError
from ._logdir import LogDir, open_logdir
from ._naming import PREFIX, OrderedEventsWriter, event_file_name

__all__ = ["EXIT_STALL_SECS", "FileWriter", "FileWriterCache", "SummaryWriter"]

log = logging.getLogger("monitored.summaries")

#: A record of one step: (kind, name, value, extra arguments).
Record = tuple[str, str, Any, dict[str, Any]]

_LIVE: Final[weakref.WeakSet[FileWriter]] = weakref.WeakSet()
_SEQUENCE = iter(range(1 << 62))

#: Once the interpreter exits, how long a wait for a writer's thread goes on while
#: that thread makes no progress (writes nothing) before it is given up.
EXIT_STALL_SECS: Final = 2.0
#: How often a wait for a writer's thread checks that thread.
_POLL_SECS: Final = 0.1
#: From this ``flush_secs`` on, the writer's thread takes events ``max_queue`` at a
#: time (and looks every ``flush_secs`` for fewer); below it, each as it comes.
_BATCHING_FLUSH_SECS: Final = 1.0
#: When the interpreter started to exit (``time.monotonic``), or ``None``.
_exit_started: float | None = None


@final
class _Flush:
    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = threading.Event()


_CLOSE: Final = object()


@final
class _Pipe:
    """The events on their way to a writer's thread, first in first out.

    The thread is woken when ``batch`` items wait (or by an item put with
    ``wake``, such as a flush); a put waits for room while ``limit`` items wait.
    :meth:`get` hands the thread every waiting item at once.
    """

    def __init__(self, batch: int, limit: int) -> None:
        self._batch = batch
        self._limit = limit
        self._items: collections.deque[Any] = collections.deque()
        self._changed = threading.Condition(threading.Lock())
        self._wake = False

    def put(self, item: Any, timeout: float | None = None, *, wake: bool = True) -> bool:
        """Add ``item``; ``False`` if there was no room within ``timeout`` seconds."""
        with self._changed:
            items = self._items
            if len(items) >= self._limit and not self._changed.wait_for(
                lambda: len(items) < self._limit, timeout
            ):
                return False
            items.append(item)
            if wake or len(items) >= self._batch:
                self._wake = True
                self._changed.notify_all()
        return True

    def get(self, timeout: float | None) -> list[Any]:
        """Every waiting item, once woken or after ``timeout`` seconds (maybe none)."""
        with self._changed:
            if not self._wake:
                self._changed.wait_for(lambda: self._wake, timeout)
            self._wake = False
            taken = list(self._items)
            self._items.clear()
            if taken:
                self._changed.notify_all()  # room for waiting puts
            return taken

    def __len__(self) -> int:
        return len(self._items)


#: Scalar tags written by this process, by directory (``_directory_key``).
_SCALAR_TAGS: dict[str, set[str]] = {}


def _directory_key(logdir: str) -> str:
    """One key per directory however it is spelled (a URL stays as given, unslashed)."""
    if "://" in logdir and not logdir.startswith("file://"):
        return logdir.rstrip("/")
    return os.path.realpath(logdir.removeprefix("file://"))


def scalar_tags_in(logdir: str) -> dict[str, set[str]]:
    """The scalar tags this process wrote to ``logdir`` and to directories under it.

    Keyed by the directory relative to ``logdir`` (``"."`` for ``logdir`` itself),
    as given to the writers (not yet cleaned by TF1's tag rules).
    """
    root = _directory_key(logdir)
    found = {}
    for directory, tags in _SCALAR_TAGS.items():
        if directory == root:
            found["."] = set(tags)
        elif directory.startswith(root.rstrip("/") + "/"):
            found[directory[len(root.rstrip("/")) + 1 :]] = set(tags)
    return found


class FileWriter:
    """Writes ``Event`` protos to a new event file in ``logdir``, in a background thread.

    TF1's ``tf.summary.FileWriter`` (also exported as :class:`SummaryWriter`): the
    writer's thread takes events ``max_queue`` at a time (at most twice as many wait
    in memory; each as it comes when ``flush_secs`` is under a second), and the
    file is flushed at least every
    ``flush_secs`` seconds and on :meth:`flush` and :meth:`close`. A failure to write
    is raised from the next call (as :class:`SummaryWriteError`, naming the file and
    the cause) and handed to every listener added with :meth:`add_error_listener`.
    ``logdir`` is a path or any fsspec URL (``file://``, ``memory://``, ``s3://``...);
    a remote event file is staged locally and uploaded whole at each flush.
    """

    def __init__(
        self,
        logdir: str | os.PathLike[str],
        max_queue: int = 10,
        flush_secs: float = 120,
        filename_suffix: str = "",
    ) -> None:
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {max_queue}")
        if flush_secs < 0:
            raise ValueError(f"flush_secs must be >= 0, got {flush_secs}")
        self._logdir = os.fspath(logdir)
        self._dir: LogDir = open_logdir(self._logdir)
        self._dir.check()
        # TensorBoard reads a directory's files in name order: the name's seconds
        # follow the directory's newest file, not the clock (``_naming``), and the
        # time in nanoseconds and the pid order files made within one second.
        suffix = f".{time.time_ns():020d}.{os.getpid()}.{next(_SEQUENCE)}{filename_suffix}"
        where = (
            self._dir.local
            if self._dir.local is not None
            else tempfile.mkdtemp(prefix="monitored-summaries-")
        )
        try:
            name = event_file_name(self._dir.names(), time.time(), suffix)
            self._events = OrderedEventsWriter(os.path.join(where, name), time.time())
            # The file's header goes to disk now, as TF1's writer did: a run killed
            # before its first flush still leaves a readable event file, not 0 bytes.
            self._events.flush()
        except OSError as exc:
            if self._dir.local is None:
                shutil.rmtree(where, ignore_errors=True)
            raise SummaryDirectoryError(
                f"cannot create an event file in {self._logdir!r}: {exc.strerror or exc}"
            ) from exc
        self._name = os.path.basename(self._events._file_name)
        #: The event file this writer appends to (a URL for a remote directory).
        self.path: str = self._dir.join(self._name)
        #: A remote writer's local copy of its event file, uploaded at each flush.
        self._staged: BinaryIO | None = None
        if self._dir.local is None:
            self._stage(where)
        self._flush_secs = flush_secs
        #: The last global step whose step outputs a ``SummarySaverHook`` wrote here:
        #: hooks sharing this writer write each step's outputs once.
        self.outputs_step: int | None = None
        #: The scalar tags (as given) written to this directory by any writer of the
        #: process: what an HParams metric is looked for in (see ``scalar_tags_in``).
        self._scalar_tags = _SCALAR_TAGS.setdefault(_directory_key(self._logdir), set())
        # A flush_secs under a second asks for events on disk at once: the thread is
        # woken for each (and never polls, see _work).
        batch = max_queue if flush_secs >= _BATCHING_FLUSH_SECS else 1
        self._queue = _Pipe(batch, 2 * max_queue)
        self._error: SummaryWriteError | None = None
        self._listeners: list[Callable[[SummaryWriteError], None]] = []
        self._lock = threading.Lock()
        self._closed = False
        #: Set when the event file is dropped on purpose (removed by its owner): a
        #: failure then is neither logged nor handed to listeners.
        self._quiet = False
        #: When the writer's thread last finished an item (``time.monotonic``).
        self._progress = time.monotonic()
        #: Who closes the files of a writer whose start was interrupted: the thread
        #: once it runs, the constructor while it does not (both under ``_lock``).
        self._running = False
        self._abandoned = False
        self._thread = threading.Thread(
            target=self._work, name=f"summary-writer {self.path}", daemon=True
        )
        try:
            _LIVE.add(self)
            self._thread.start()
        except BaseException:
            # A KeyboardInterrupt while the thread starts: nobody gets this writer, so
            # it is closed here, or by its thread if that runs already. The file's
            # header is on disk: what is left is a readable event file.
            _LIVE.discard(self)
            with self._lock:
                self._closed = self._abandoned = True
                running = self._running
            if running:
                self._queue.put(_CLOSE)
            else:
                self._close_files()
            raise

    def _stage(self, staging: str) -> None:
        """Keep a reader of the staged file and remove its name (nothing left behind),
        then upload the file once, so a remote directory that refuses writes fails now."""
        staged = self._events._file_name
        self._staged = open(staged, "rb")  # noqa: SIM115 (closed with the writer)
        with contextlib.suppress(OSError):  # where open files cannot be removed: at close
            os.remove(staged)
            os.rmdir(staging)
        try:
            self._flush_file()
        except Exception as exc:
            self._close_files()
            raise SummaryDirectoryError(
                f"cannot write an event file to summary log directory {self._logdir!r}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    # -- TF1's API ------------------------------------------------------------------------------
    def get_logdir(self) -> str:
        """The directory this writer writes to."""
        return self._logdir

    def add_summary(self, summary: Summary | bytes, global_step: int | None = None) -> None:
        """Queue a ``Summary`` proto (or its serialized bytes) for ``global_step``."""
        if isinstance(summary, bytes):
            summary = Summary.FromString(summary)
        tags = self._scalar_tags
        for value in summary.value:
            if value.HasField("simple_value"):
                tags.add(value.tag)
        event = Event(summary=summary)
        if global_step is not None:
            event.step = int(global_step)
        self.add_event(event)

    def add_session_log(self, session_log: SessionLog, global_step: int | None = None) -> None:
        """Queue a ``SessionLog`` (START, CHECKPOINT or STOP) for ``global_step``."""
        event = Event(session_log=session_log)
        if global_step is not None:
            event.step = int(global_step)
        self.add_event(event)

    def add_event(self, event: Event) -> None:
        """Queue an ``Event``; its ``wall_time`` is set to now when it has none."""
        if not event.wall_time:
            event.wall_time = time.time()
        self._put(event)

    def add_records(self, step: int, records: Sequence[Record], host: Sequence[Any]) -> None:
        """Queue one step's recorded summaries, to be encoded in the writer's thread."""
        tags = self._scalar_tags
        for kind, name, _, _ in records:
            if kind == "scalar":
                tags.add(name)
        self._put((int(step), time.time(), records, host))

    def flush(self) -> None:
        """Write everything queued so far to disk; return once it is there."""
        self._raise_error()
        if self._closed:
            return
        marker = _Flush()
        self._put(marker, wake=True)
        while not marker.done.wait(_POLL_SECS):
            if not self._thread.is_alive():  # pragma: no cover - the thread never dies silently
                break
            self._check_stalled("flushing")
        self._raise_error()

    def close(self) -> None:
        """Flush, stop the thread and close the file; later calls do nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._enqueue(_CLOSE, "closing")
            while self._thread.is_alive():
                self._thread.join(_POLL_SECS)
                self._check_stalled("closing")
        finally:
            _LIVE.discard(self)
        self._raise_error()

    def _newest(self) -> bool:
        """Whether this writer's event file is there and sorts last in its directory."""
        if self._gone():
            return False
        files = [name for name in self._dir.names() if name.startswith(PREFIX)]
        return bool(files) and max(files) == self._name

    def _gone(self) -> bool:
        """Whether this local writer's event file was removed (with its directory, say)."""
        return self._dir.local is not None and not os.path.exists(self.path)

    def _discard(self) -> None:
        """Close without reporting: the event file was removed by whoever owns it, so
        what is still queued has nowhere to go and nobody to tell."""
        self._quiet = True
        with contextlib.suppress(SummaryWriteError):
            self.close()

    def reopen(self) -> None:
        """TF1's ``reopen``: here a closed writer stays closed; make a new one instead."""
        if self._closed:
            raise SummaryWriteError(
                f"the writer of {self.path} is closed; make a new FileWriter (or use "
                "FileWriterCache.get) to write to that directory again",
                path=self.path,
            )

    # -- errors ------------------------------------------------------------------------------
    @property
    def error(self) -> SummaryWriteError | None:
        """The failure that stopped this writer, if one did."""
        return self._error

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def add_error_listener(self, listener: Callable[[SummaryWriteError], None]) -> None:
        """Call ``listener(error)`` (from the writer's thread) when writing fails."""
        self._listeners.append(listener)
        if self._error is not None:
            listener(self._error)

    def remove_error_listener(self, listener: Callable[[SummaryWriteError], None]) -> None:
        """Stop calling ``listener``."""
        if listener in self._listeners:
            self._listeners.remove(listener)

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def _put(self, item: Any, *, wake: bool = False) -> None:
        self._raise_error()
        if self._closed:
            raise SummaryWriteError(f"the writer of {self.path} is closed", path=self.path)
        self._enqueue(item, "writing", wake=wake)

    def _enqueue(self, item: Any, doing: str, *, wake: bool = True) -> None:
        """Queue ``item``, waiting for room as long as the writer's thread is not stalled;
        ``wake``: the thread takes it now, else with the next ``max_queue`` events."""
        while not self._queue.put(item, _POLL_SECS, wake=wake):
            self._check_stalled(doing)

    def _check_stalled(self, doing: str) -> None:
        """Raise :class:`SummaryWriteError` if the interpreter is exiting and the writer's
        thread has made no progress for :data:`EXIT_STALL_SECS` (see the module's doc)."""
        started = _exit_started
        if started is None:
            return
        idle = time.monotonic() - max(started, self._progress)
        if idle < EXIT_STALL_SECS:
            return
        waiting = len(self._queue)
        raise SummaryWriteError(
            f"{doing} {self.path} at exit: gave up after its writer's thread wrote nothing "
            f"for {idle:.1f} s; {waiting} queued item(s) not written",
            path=self.path,
        )

    # -- the writer's thread ----------------------------------------------------------------------
    def _work(self) -> None:
        with self._lock:
            if self._abandoned:
                return
            self._running = True
        next_flush = time.monotonic() + self._flush_secs
        pending = False
        # Events wait for the thread until max_queue of them do: it looks at least every
        # flush_secs, so that none waits much longer than that for its flush.
        idle = self._flush_secs if self._flush_secs >= _BATCHING_FLUSH_SECS else None
        while True:
            # After a failure nothing is flushed again: wait for close, never spin.
            failed = self._error is not None
            timeout = (
                None if failed else max(0.0, next_flush - time.monotonic()) if pending else idle
            )
            for item in self._queue.get(timeout):
                try:
                    if item is _CLOSE:
                        try:
                            if self._error is None:
                                self._flush_file()
                        finally:
                            self._close_files()
                        return
                    if isinstance(item, _Flush):
                        if self._error is None:
                            self._flush_file()
                            pending = False
                        item.done.set()
                    elif self._error is None:
                        self._write(item)
                        pending = True
                except Exception as exc:
                    self._fail(exc)
                    if isinstance(item, _Flush):
                        item.done.set()
                    if item is _CLOSE:
                        return
                finally:
                    self._progress = time.monotonic()
            try:
                if pending and self._error is None and time.monotonic() >= next_flush:
                    self._flush_file()
                    pending = False
                    next_flush = time.monotonic() + self._flush_secs
            except Exception as exc:
                self._fail(exc)
            finally:
                self._progress = time.monotonic()

    def _write(self, item: Any) -> None:
        if isinstance(item, Event):
            self._events.write_event(item)
            return
        step, wall_time, records, host = item
        summary = encode(records, host, step)
        self._events.write_event(Event(wall_time=wall_time, step=step, summary=summary))

    def _flush_file(self) -> None:
        self._events.flush()
        if self._staged is not None:
            self._dir.upload(self._staged, self._name)
        elif not os.path.exists(self.path):
            raise FileNotFoundError(f"the event file was removed while being written: {self.path}")

    def _close_files(self) -> None:
        """Close the event file, and a remote writer's staged copy (removing it)."""
        try:
            self._events.close()
        finally:
            staged, self._staged = self._staged, None
            if staged is not None:
                staged.close()
                if os.path.exists(staged.name):
                    shutil.rmtree(os.path.dirname(staged.name), ignore_errors=True)

    def _fail(self, exc: BaseException) -> None:
        if self._error is not None:
            return
        if isinstance(exc, SummaryWriteError):
            error = exc
        elif isinstance(exc, OSError):
            cause = exc.strerror or str(exc)
            error = SummaryWriteError(
                f"writing summaries to {self.path} failed: {cause}", path=self.path
            )
            error.__cause__ = exc
        else:  # an encoding failure (a NaN histogram): keep its class and message
            exc.add_note(f"while writing summaries to {self.path}")
            error = SummaryWriteError(f"{exc} (writing to {self.path})", path=self.path)
            error.__cause__ = exc
        self._error = error
        if self._quiet:
            return
        log.error("%s", error)
        for listener in list(self._listeners):
            try:
                listener(error)
            except Exception:  # pragma: no cover - a listener must not kill the thread
                log.exception("summary writer error listener %r failed", listener)

    def __repr__(self) -> str:
        status = "failed" if self._error else "closed" if self._closed else "open"
        return f"<FileWriter {self.path} {status}>"


#: TF2's name for the same writer (tensorboardX's too).
SummaryWriter = FileWriter


@final
class FileWriterCache:
    """One :class:`FileWriter` per log directory, shared by everything that writes there.

    TF1's ``FileWriterCache``: every writer of a directory appends to one event
    file, which TensorBoard reads better than several files written at once.
    A writer that was closed or failed is replaced by a fresh one.

    :meth:`get` hands out a directory's writer for good (TF1's way: it stays open
    until :meth:`clear` or the end of the process). A session takes it with
    :meth:`acquire` and gives it back with :meth:`release` when it ends, so the
    writer is flushed then and closed once no session (and no :meth:`get`) holds
    it: nothing is left to write into a directory after its last session.

    A session that gives its writer back with ``keep_open=True`` (an evaluation's:
    a training evaluates its model directory again and again) leaves it open, flushed,
    for the next session of that directory in this process: the evaluations of one
    process append to one event file instead of opening one each. Such an idle
    writer is closed after :attr:`idle_close_secs` unused, by :meth:`clear`, or at
    exit; a session that finds its event file no longer the newest of the directory
    (another writer's file sorts after it) or removed gets a new writer, so the
    files of a directory still sort in the order of the run.
    """

    #: How long a writer given back with ``keep_open=True`` stays open unused.
    idle_close_secs: float = 600.0

    _writers: dict[str, FileWriter] = {}  # noqa: RUF012 (a process-wide cache, on purpose)
    #: How many sessions hold each writer (acquire/release).
    _holders: dict[FileWriter, int] = {}  # noqa: RUF012
    #: Writers handed out by get: never closed by a release.
    _pinned: weakref.WeakSet[FileWriter] = weakref.WeakSet()  # noqa: RUF012
    #: Writers given back with ``keep_open=True`` that no session holds: their closers.
    _idle: dict[FileWriter, threading.Timer] = {}  # noqa: RUF012
    _lock = threading.Lock()

    @classmethod
    def get(cls, logdir: str | os.PathLike[str]) -> FileWriter:
        """The writer of ``logdir``, made on first use; it stays open until :meth:`clear`."""
        with cls._lock:
            writer = cls._current(logdir)
            cls._pinned.add(writer)
            return writer

    @classmethod
    def acquire(cls, logdir: str | os.PathLike[str]) -> FileWriter:
        """The writer of ``logdir``, held until :meth:`release` (a session's writer)."""
        with cls._lock:
            writer = cls._current(logdir)
            cls._holders[writer] = cls._holders.get(writer, 0) + 1
            return writer

    @classmethod
    def release(cls, writer: FileWriter, *, keep_open: bool = False) -> None:
        """Give back a writer taken with :meth:`acquire`: flush it, and close it (and
        forget it) if nothing else holds it. Raises its :class:`SummaryWriteError`.

        With ``keep_open`` a writer nothing else holds is flushed and kept for the
        next session of its directory, and closed after :attr:`idle_close_secs`
        unused. A writer closed meanwhile (by :meth:`clear`, say) needs nothing more.
        """
        with cls._lock:
            holders = cls._holders.get(writer, 0) - 1
            if holders < 0:
                if writer.closed:
                    return
                raise ValueError(f"FileWriterCache.release: {writer!r} was not acquired")
            if holders:
                cls._holders[writer] = holders
            else:
                del cls._holders[writer]
            last = not holders and writer not in cls._pinned
            if last and keep_open and writer.error is None and not writer.closed:
                closer = threading.Timer(cls.idle_close_secs, cls._close_idle, (writer,))
                closer.daemon = True
                cls._idle[writer] = closer
                closer.start()
                last = False
            if last:
                for key, cached in list(cls._writers.items()):
                    if cached is writer:
                        del cls._writers[key]
        if last:
            writer.close()
        else:
            writer.flush()

    @classmethod
    def clear(cls) -> None:
        """Close and forget every cached writer (errors of failed writers are dropped)."""
        with cls._lock:
            writers, cls._writers = list(cls._writers.values()), {}
            cls._holders.clear()
            cls._pinned.clear()
            for closer in cls._idle.values():
                closer.cancel()
            cls._idle.clear()
        for writer in writers:
            with contextlib.suppress(SummaryWriteError):
                writer.close()

    @classmethod
    def _current(cls, logdir: str | os.PathLike[str]) -> FileWriter:
        """The live writer of ``logdir``, made anew if there is none (called locked)."""
        key = open_logdir(logdir).key
        writer = cls._writers.get(key)
        closer = cls._idle.pop(writer, None) if writer is not None else None
        if closer is not None:
            closer.cancel()
            assert writer is not None
            if not writer._newest():
                # Another writer's file sorts after it (or it was removed): a new file,
                # so the directory's files stay in the order of the run.
                writer._discard()
        if writer is None or writer.closed or writer.error is not None:
            writer = cls._writers[key] = FileWriter(os.fspath(logdir))
        return writer

    @classmethod
    def _close_idle(cls, writer: FileWriter) -> None:
        """Close a writer kept open by ``release(keep_open=True)`` that stayed unused."""
        with cls._lock:
            if cls._idle.pop(writer, None) is None:
                return  # taken again (or cleared) meanwhile
            for key, cached in list(cls._writers.items()):
                if cached is writer:
                    del cls._writers[key]
        if writer._gone():
            writer._discard()  # its directory was removed: nothing to close it into
            return
        try:
            writer.close()
        except SummaryWriteError as exc:
            log.error("closing the idle writer of %s: %s", writer.path, exc)


def _start_exit_clock() -> None:
    """Note that the interpreter started to exit: waits for stalled writers end from now."""
    global _exit_started
    if _exit_started is None:
        _exit_started = time.monotonic()


# threading's exit callbacks run before the non-daemon threads (anyio's workers,
# which may be flushing or closing a writer) are joined; atexit's only after.
with contextlib.suppress(AttributeError, RuntimeError):
    threading._register_atexit(_start_exit_clock)  # type: ignore[attr-defined]


@atexit.register
def _flush_all_at_exit() -> None:
    """Flush every open writer when the interpreter exits (even after a crash).

    A writer whose event file was removed meanwhile (its directory deleted, as a
    test's temporary directory is) is closed without a word: there is nothing
    to flush it to, and nobody asked for it any more. A writer whose thread is
    stalled is given up after :data:`EXIT_STALL_SECS`, with an error logged
    that says how much was not written.
    """
    _start_exit_clock()
    for writer in list(_LIVE):
        if writer.error is not None or writer.closed:
            continue  # its failure was raised already
        if writer._gone():
            log.debug("at exit: %s was removed; closing its writer", writer.path)
            writer._discard()
            continue
        try:
            writer.flush()
        except SummaryWriteError as exc:
            if writer.error is not exc:  # a failure of the thread's was logged by it
                log.error("%s", exc)
