"""Where checkpoints live: a local directory or any fsspec URL.

Two stores with one small interface. :class:`LocalStore` talks to the operating
system directly, so a file appears whole or not at all: it is written under a
temporary name, ``fsync``-ed, renamed into place and the directory ``fsync``-ed.
:class:`FsspecStore` serves every other URL (``memory://``, ``s3://``, ...). Object
stores have no atomic rename (fsspec's ``mv`` is a copy and a delete there), so it
writes each file in place; object stores make each object appear whole once its
upload completes, and the checkpoint protocol (manifest written last, see
``_format``) keeps a partly written checkpoint invisible on any store.

A checkpoint directory may have been written by someone else, so every name a
store is given must be a plain file name of the directory (:func:`check_name`),
and a local store opens regular files only, through the core's
:func:`monitored.open_regular_file`: a FIFO, a device or a symbolic link that
leads out of the directory is refused with :class:`UnsafeCheckpointError` before
anything is read, and :meth:`Store.read_bytes` never reads more than the limit it
is given (see "Security" in ``docs/checkpoint.md``).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import secrets
import uuid
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO, Final, TypeVar, cast, final

from monitored import (
    UnsafeFileError,
    check_run_owner,
    is_plain_name,
    open_regular_file,
    read_regular_file,
)

from ._errors import CheckpointDirectoryError, CorruptCheckpointError, UnsafeCheckpointError
from ._remote import (
    OPERATION_TIMEOUT_ENV,
    SAVE_TIMEOUT_ENV,
    Deadline,
    RemoteBounds,
    call_with_deadline,
    storage_options,
)

__all__ = [
    "TEMP_MARKER",
    "FsspecStore",
    "LocalStore",
    "Store",
    "check_name",
    "fixed_directory",
    "is_plain_name",
    "open_store",
    "write_all",
]

#: Part of the name of every temporary file, so leftovers of a killed save are recognized.
TEMP_MARKER: Final = ".tmp-"


def check_name(name: object, where: str) -> str:
    """``name`` if it is a plain file name (:func:`monitored.is_plain_name`), else
    :class:`UnsafeCheckpointError`.

    ``where`` (the directory or the file that gave the name) goes in the message.
    """
    if not is_plain_name(name):
        shown = repr(name)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        raise UnsafeCheckpointError(
            f"{where}: {shown} is not a plain file name of the checkpoint directory "
            "(absolute, with a directory part, '..', a NUL byte or too long); refused"
        )
    assert isinstance(name, str)
    return name


Writer = Callable[[BinaryIO], None]
T = TypeVar("T")


class _TempNames:
    """Unique temporary-file suffixes, ``<pid>-<8 hex digits>``, without a system call each.

    The pid (which ``_writer_alive`` reads back) and a random start are taken once
    per process (again in a forked child); the hex part counts up from there. A
    name of a dead process's leftover that happens to match is never overwritten:
    temporary files are opened with ``O_EXCL``.
    """

    __slots__ = ("_counter", "_pid")

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._counter = itertools.count(secrets.randbits(32))

    def next(self) -> str:
        return f"{self._pid}-{next(self._counter) & 0xFFFFFFFF:08x}"


_temp_names = _TempNames()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_temp_names._reset)


@final
class _RawFile:
    """What a local write hands its writer: ``os.write`` on the file descriptor.

    Not ``open(fd, "wb", buffering=0)``, whose set-up costs a system call (``fstat``).
    ``write_views`` writes several buffers with one ``writev``.
    """

    __slots__ = ("_fd",)

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def fileno(self) -> int:
        return self._fd

    def write(self, data: memoryview | bytes) -> int:
        return os.write(self._fd, data)

    def write_views(self, views: list[memoryview]) -> None:
        """Write every byte of ``views``, in order (``writev`` may write less than asked)."""
        pending = [v.cast("B") for v in views if v.nbytes]
        while pending:
            written = os.writev(self._fd, pending[:_IOV_MAX])
            while pending and written >= pending[0].nbytes:
                written -= pending[0].nbytes
                pending.pop(0)
            if written:
                pending[0] = pending[0][written:]


#: The most buffers one ``writev`` takes (POSIX's minimum for ``IOV_MAX``).
_IOV_MAX: Final = 16


def write_all(file: BinaryIO, data: memoryview | bytes) -> None:
    """Write all of ``data``: raw files may write less than asked."""
    view = memoryview(data).cast("B")
    while view.nbytes:
        written = file.write(view)
        if written is None:  # a non-blocking raw file that could not write now
            continue
        view = view[written:]


class Store:
    """A directory of checkpoint files: list, read, write atomically where possible."""

    __slots__ = ("url",)

    #: Whether a written file appears whole or not at all (rename-based commit).
    atomic: bool = False

    def __init__(self, url: str) -> None:
        #: The directory as the user named it (a path or a URL), without trailing "/".
        self.url = url

    def path(self, name: str) -> str:
        """The full path or URL of the entry ``name`` of this directory."""
        return f"{self.url}/{name}"

    def ensure_directory(self) -> None:
        """Create the directory (and its parents) if it does not exist."""
        raise NotImplementedError

    def begin_save(self) -> None:
        """A save starts: on a remote store, its operations end by the save's deadline."""

    def check_writable(self) -> None:
        """Create the directory if needed and prove it is writable with a probe file.

        Raises :class:`CheckpointDirectoryError` naming the directory and the cause,
        so a bad directory fails at the start of training, not at the first save.
        """
        try:
            self.ensure_directory()
            probe = f".monitored-probe{TEMP_MARKER}{os.getpid()}-{uuid.uuid4().hex[:8]}"
            self.write(probe, lambda f: write_all(f, b"probe"), durable="never")
            self.remove(probe)
        except CheckpointDirectoryError:
            raise
        except OSError as exc:
            raise CheckpointDirectoryError(
                f"checkpoint directory {self.url} is not writable: {type(exc).__name__}: {exc}"
            ) from exc

    def list(self) -> list[str]:
        """Names of the files directly in the directory (empty if it does not exist)."""
        raise NotImplementedError

    def is_directory(self) -> bool:
        """Whether the directory exists (as a directory, or a link to one)."""
        raise NotImplementedError

    def write(self, name: str, writer: Writer, *, durable: str = "now") -> None:
        """Create or replace ``name`` with what ``writer(file)`` writes.

        ``durable`` orders the directory ``fsync`` of a renaming store (what makes
        renames survive a power loss); other stores ignore it:

        * ``"now"``: the file is in place and durable when this returns;
        * ``"later"``: its content is durable, its rename is made durable by the
          next write of this directory that syncs it (a ``"before"`` or ``"now"``);
        * ``"before"``: the directory is synced *before* this file is renamed
          into place, so every earlier rename is durable before this name can
          appear; its own rename is made durable by the next ``"now"``;
        * ``"never"``: nothing is synced (the probe that shows the directory is
          writable, removed at once: two ``fsync``s less at each session's start).

        A checkpoint writes its data file ``"later"``, its manifest ``"before"``
        (a manifest never survives without its data) and the state file
        ``"now"``: two directory ``fsync``s instead of three.
        """
        raise NotImplementedError

    def sync_directory(self) -> None:
        """Make the renames done in the directory so far durable (renaming stores)."""

    @contextlib.contextmanager
    def open_file(self, name: str) -> Iterator[tuple[BinaryIO, int]]:
        """Open the regular file ``name`` for reading; yield it and its size.

        ``FileNotFoundError`` if it does not exist; :class:`UnsafeCheckpointError`
        if ``name`` is not a plain name or not a regular file of this directory;
        :class:`CorruptCheckpointError` if it cannot be opened (permissions...).
        """
        raise NotImplementedError
        yield  # pragma: no cover

    @contextlib.contextmanager
    def open_read(self, name: str) -> Iterator[BinaryIO]:
        """Open ``name`` for reading (see :meth:`open_file`)."""
        with self.open_file(name) as (file, _):
            yield file

    def read_bytes(self, name: str, limit: int) -> bytes:
        """The whole content of ``name``, refused if it is larger than ``limit`` bytes.

        Reads at most ``limit + 1`` bytes whatever the file claims, so a file that
        grows while it is read, or lies about its size, cannot make it read more.
        """
        with self.open_file(name) as (file, size):
            if size > limit:
                raise UnsafeCheckpointError(
                    f"{self.path(name)} has {size} bytes, more than the {limit} "
                    f"{_kind(name)} may have; refused"
                )
            chunks: list[bytes] = []
            left = limit + 1
            while left > 0:
                chunk = file.read(min(left, 1 << 20))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
            data = b"".join(chunks)
        if len(data) > limit:
            raise UnsafeCheckpointError(
                f"{self.path(name)} is larger than the {limit} bytes {_kind(name)} may "
                "have; refused"
            )
        return data

    def size(self, name: str) -> int:
        """The size of ``name`` in bytes."""
        raise NotImplementedError

    def stamp(self, name: str) -> tuple[object, ...] | None:
        """What changes when ``name`` is replaced, grows or is rewritten; ``None`` if it is gone.

        Read from the file's metadata only (nothing is opened), so a follower
        can tell, at the cost of a ``stat``, whether a file it found unusable
        has changed since, without reading it again.
        """
        raise NotImplementedError

    def remove(self, name: str, *, fenced: bool = True) -> None:
        """Delete ``name``; a missing file is not an error.

        Fenced (the run ownership is checked first, :func:`monitored.check_run_owner`)
        unless ``fenced`` is false: for the second file of one checkpoint's deletion,
        checked once for both.
        """
        raise NotImplementedError

    def check_owner(self) -> None:
        """Fencing: raise ``RunOwnershipLostError`` if this run directory was taken over."""
        check_run_owner(self.url)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


_CREATE_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)


@final
class LocalStore(Store):
    """A directory on a local (POSIX) filesystem: temporary name, fsync, rename."""

    __slots__ = ("_dir",)
    atomic = True

    def __init__(self, url: str, directory: str) -> None:
        super().__init__(url)
        self._dir = directory

    def path(self, name: str) -> str:
        return os.path.join(self.url, name)

    def ensure_directory(self) -> None:
        if os.path.lexists(self._dir) and not os.path.isdir(self._dir):
            raise CheckpointDirectoryError(
                f"checkpoint directory {self.url} is a file, not a directory: give a "
                "directory (it is created if missing)"
            )
        try:
            os.makedirs(self._dir, exist_ok=True)
        except OSError as exc:
            raise CheckpointDirectoryError(
                f"checkpoint directory {self.url} does not exist and cannot be created: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if not os.path.isdir(self._dir):  # pragma: no cover - makedirs raises first
            raise CheckpointDirectoryError(f"checkpoint directory {self.url} is not a directory")

    def is_directory(self) -> bool:
        return os.path.isdir(self._dir)  # a stat: a FIFO or device is never opened

    def list(self) -> list[str]:
        try:
            with os.scandir(self._dir) as entries:
                return sorted(e.name for e in entries if e.is_file(follow_symlinks=True))
        except FileNotFoundError:
            return []
        except NotADirectoryError as exc:
            raise CheckpointDirectoryError(
                f"checkpoint directory {self.url} is not a directory"
            ) from exc

    def sync_directory(self) -> None:
        _fsync_directory(self._dir)

    def write(self, name: str, writer: Writer, *, durable: str = "now") -> None:
        check_name(name, self.url)
        final_path = os.path.join(self._dir, name)
        temp = os.path.join(self._dir, f".{name}{TEMP_MARKER}{_temp_names.next()}")
        fd = os.open(temp, _CREATE_FLAGS, 0o644)
        try:
            try:
                writer(cast(BinaryIO, _RawFile(fd)))
                if durable != "never":
                    os.fsync(fd)
            finally:
                os.close(fd)
            if durable == "before":
                _fsync_directory(self._dir)
            check_run_owner(self._dir)  # fencing: never commit into a run taken over
            os.replace(temp, final_path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(temp)
            raise
        if durable == "now":
            _fsync_directory(self._dir)

    @contextlib.contextmanager
    def _refusing(self, name: str) -> Iterator[None]:
        """Turn the core opener's refusals into this plugin's errors."""
        try:
            yield
        except UnsafeFileError as exc:
            raise UnsafeCheckpointError(str(exc)) from exc
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise CorruptCheckpointError(
                f"{self.path(name)} cannot be opened: {type(exc).__name__}: {exc}"
            ) from None

    @contextlib.contextmanager
    def open_file(self, name: str) -> Iterator[tuple[BinaryIO, int]]:
        check_name(name, self.url)
        with self._refusing(name):
            file = open_regular_file(name, within=self._dir, buffering=0)
        with file:
            yield file, os.fstat(file.fileno()).st_size

    def read_bytes(self, name: str, limit: int) -> bytes:
        check_name(name, self.url)
        with self._refusing(name):
            return read_regular_file(name, within=self._dir, max_bytes=limit, what=_kind(name))

    def size(self, name: str) -> int:
        with self.open_file(name) as (_, size):
            return size

    def stamp(self, name: str) -> tuple[object, ...] | None:
        try:
            info = os.stat(os.path.join(self._dir, check_name(name, self.url)))
        except OSError:  # gone, or a link to nowhere: unusable either way
            return None
        return (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)

    def check_owner(self) -> None:
        check_run_owner(self._dir)

    def remove(self, name: str, *, fenced: bool = True) -> None:
        # A link is removed itself, never its target.
        if fenced:
            check_run_owner(self._dir)
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(self._dir, check_name(name, self.url)))


@final
class FsspecStore(Store):
    """A directory on any fsspec filesystem; each file is written in place.

    Every operation is bounded (``_remote``): at most
    ``MONITORED_CHECKPOINT_OPERATION_TIMEOUT`` seconds, and within a save (after
    :meth:`begin_save`) no later than ``MONITORED_CHECKPOINT_SAVE_TIMEOUT``
    seconds after its start; past that, :class:`CheckpointStoreTimeoutError`.
    """

    __slots__ = ("_bounds", "_deadline", "_fs", "_root")

    def __init__(self, url: str, fs: Any, root: str, bounds: RemoteBounds | None = None) -> None:
        super().__init__(url)
        self._fs = fs
        self._root = root.rstrip("/")
        self._bounds = bounds or RemoteBounds()
        self._deadline: Deadline | None = None

    def _full(self, name: str) -> str:
        return f"{self._root}/{check_name(name, self.url)}"

    def begin_save(self) -> None:
        self._deadline = Deadline(self._bounds.save)

    def _bounded(self, what: str, func: Callable[[], T]) -> T:
        """``func()`` within the operation's bound and the save's deadline, or
        :class:`CheckpointStoreTimeoutError` naming the store and ``what``."""
        seconds, setting = (
            self._bounds.operation,
            f"{OPERATION_TIMEOUT_ENV}={self._bounds.operation:g}",
        )
        deadline = self._deadline
        if deadline is not None and deadline.left() < seconds:
            seconds = deadline.left()
            setting = f"{SAVE_TIMEOUT_ENV}={deadline.seconds:g}, for the whole save"

        def describe() -> str:
            return (
                f"checkpoint store {self.url} did not answer: {what} took longer than its "
                f"bound ({setting}); the store accepted the work but never finished it"
            )

        return call_with_deadline(func, seconds, describe)

    def ensure_directory(self) -> None:
        self._bounded("creating the directory", self._ensure_directory)

    def _ensure_directory(self) -> None:
        try:
            self._fs.makedirs(self._root, exist_ok=True)
        except FileExistsError as exc:
            raise CheckpointDirectoryError(
                f"checkpoint directory {self.url} cannot be created: a file is in the way ({exc})"
            ) from exc
        except OSError as exc:
            raise CheckpointDirectoryError(
                f"checkpoint directory {self.url} does not exist and cannot be created: "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    def is_directory(self) -> bool:
        return bool(self._bounded("looking at the directory", lambda: self._fs.isdir(self._root)))

    def list(self) -> list[str]:
        try:
            entries = self._bounded(
                "listing the directory", lambda: self._fs.ls(self._root, detail=True)
            )
        except (FileNotFoundError, NotADirectoryError):
            return []
        names = []
        for entry in entries:
            if entry.get("type") == "file":
                names.append(str(entry["name"]).rstrip("/").rsplit("/", 1)[-1])
        return sorted(names)

    def write(self, name: str, writer: Writer, *, durable: str = "now") -> None:
        path = self._full(name)
        check_run_owner(self.url)
        self._bounded(f"writing {name}", lambda: self._write(path, writer))

    def _write(self, path: str, writer: Writer) -> None:
        try:
            with self._fs.open(path, "wb") as file:
                writer(file)
        except BaseException:
            with contextlib.suppress(Exception):
                self._fs.rm_file(path)
            raise

    @contextlib.contextmanager
    def open_file(self, name: str) -> Iterator[tuple[BinaryIO, int]]:
        path = self._full(name)
        try:
            info = self._bounded(f"looking up {name}", lambda: self._fs.info(path))
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise CorruptCheckpointError(
                f"{self.path(name)} cannot be opened: {type(exc).__name__}: {exc}"
            ) from None
        if info.get("type") != "file":
            raise UnsafeCheckpointError(
                f"{self.path(name)} is a {info.get('type')}, not a regular file; refused"
            )
        with self._fs.open(path, "rb") as file:
            yield file, int(info.get("size") or 0)

    def read_bytes(self, name: str, limit: int) -> bytes:
        return self._bounded(f"reading {name}", lambda: Store.read_bytes(self, name, limit))

    def size(self, name: str) -> int:
        path = self._full(name)
        return int(self._bounded(f"looking up {name}", lambda: self._fs.size(path)))

    def stamp(self, name: str) -> tuple[object, ...] | None:
        path = self._full(name)
        try:
            info = self._bounded(f"looking up {name}", lambda: self._fs.info(path))
        except OSError:
            return None
        return tuple(str(info.get(key)) for key in _STAMP_FIELDS)

    def remove(self, name: str, *, fenced: bool = True) -> None:
        if fenced:
            check_run_owner(self.url)
        path = self._full(name)

        def remove() -> None:
            with contextlib.suppress(FileNotFoundError):
                self._fs.rm_file(path)

        self._bounded(f"removing {name}", remove)


def fixed_directory(directory: str | os.PathLike[str]) -> str:
    """``directory`` as a hook keeps it: a relative path made absolute now, once.

    A hook resolves its directory when it is made (at the latest, when a session
    starts), so an ``os.chdir`` during training does not move where it writes.
    URLs are kept as given.
    """
    url = os.fspath(directory)
    if not url or "://" in url:
        return url
    return os.path.abspath(url)


def open_store(directory: str | os.PathLike[str]) -> Store:
    """The store for ``directory``: a local path, a ``file://`` URL or any fsspec URL."""
    url = os.fspath(directory)
    if not url:
        raise CheckpointDirectoryError("checkpoint directory is empty; name a directory")
    url = url.rstrip("/") or "/"
    if "://" not in url:
        return LocalStore(url, os.path.abspath(url))
    import fsspec  # type: ignore[import-untyped]

    bounds = RemoteBounds()
    protocol = url.partition("://")[0]
    try:
        fs, root = fsspec.core.url_to_fs(url, **storage_options(protocol, bounds))
    except (ImportError, ValueError) as exc:
        raise CheckpointDirectoryError(
            f"checkpoint directory {url}: no filesystem for this URL ({exc}); install the "
            "fsspec backend for its protocol"
        ) from exc
    if "file" in _protocols(fs):
        return LocalStore(url, os.path.abspath(root))
    return FsspecStore(url, fs, root, bounds)


#: The fields of an fsspec ``info`` that change when an object is rewritten (by backend).
_STAMP_FIELDS: Final = ("size", "mtime", "LastModified", "last_modified", "ETag", "etag", "created")


def _kind(name: str) -> str:
    if name.endswith(".json"):
        return "a manifest"
    if name == "checkpoint":
        return "a state file"
    return "a file of this kind"


def _protocols(fs: Any) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def _fsync_directory(directory: str) -> None:
    """Make a rename in ``directory`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # pragma: no cover - Windows cannot open directories
        return
    try:
        os.fsync(fd)
    except OSError as exc:  # pragma: no cover - some filesystems refuse directory fsync
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)
