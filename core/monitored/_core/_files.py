"""``open_regular_file``: open a file that someone else may have put there, safely.

Checkpoints, event files and whatever else a plugin reads back may come from
another user, another program or a copy that went wrong. Opening such a file
naively can hang the run (opening a FIFO blocks until a writer appears), act on
a device (``/dev/zero`` never ends, a tape rewinds), follow a link out of the
directory into another user's files, or allocate whatever size the file claims.
This module is the one place that opens such files, for the core and for every
plugin:

* only regular files are opened: the type is checked before opening (with
  ``O_NONBLOCK``, so a FIFO that slips in between cannot block) and again on
  the open descriptor, in case the entry was swapped meanwhile;
* with ``within``, the name must be a plain file name of that directory, and a
  symbolic link is followed only if its target, fully resolved, stays inside
  the directory;
* with ``max_bytes``, a file larger than the bound is refused before anything
  is read, and :func:`read_regular_file` never reads more than the bound, even
  from a file that grows while it is read.

What is refused raises :class:`UnsafeFileError`, naming the file and the reason;
a missing file raises ``FileNotFoundError``; other failures to open (permissions)
raise the ``OSError`` as it is. Plugins re-raise :class:`UnsafeFileError` as
their own error class where they have one.
"""

from __future__ import annotations

import contextlib
import os
import stat
from typing import BinaryIO, Final

from ._errors import MonitoredError

__all__ = [
    "MAX_NAME_BYTES",
    "UnsafeFileError",
    "is_plain_name",
    "open_regular_file",
    "read_regular_file",
]

#: The longest file name (in UTF-8 bytes) accepted with ``within``: POSIX's usual ``NAME_MAX``.
MAX_NAME_BYTES: Final = 255
_READ_CHUNK: Final = 1 << 20


class UnsafeFileError(MonitoredError):
    """A file was refused before being read: not a regular file, too large, or out of place.

    Raised by :func:`open_regular_file` and :func:`read_regular_file` for a FIFO,
    a device, a socket or a directory where a file should be, a file larger than
    the bound it was opened with, a name that is not a plain file name of its
    directory, or a symbolic link that leads out of it. ``path`` is the file as
    it was named. The message names the file (and a link's target) with every
    character a terminal would act on escaped (:func:`~monitored.printable`):
    they are names read from disk.
    """

    def __init__(self, message: str, *, path: str) -> None:
        from ._printable import printable  # here: ``import monitored`` imports this module

        super().__init__(printable(message))
        #: The refused file, as it was named (joined to its directory).
        self.path = path


def is_plain_name(name: object) -> bool:
    """Whether ``name`` is a plain file name: no directory part, nothing to resolve.

    Not empty, not ``.`` or ``..``, no ``/``, ``\\`` or NUL, at most 255 bytes
    of UTF-8 (lone surrogates are refused too). Such a name, joined to a
    directory, names an entry of that directory and nothing else.
    """
    if not isinstance(name, str) or name in ("", ".", ".."):
        return False
    if "/" in name or "\\" in name or "\0" in name:
        return False
    try:
        return len(name.encode("utf-8")) <= MAX_NAME_BYTES
    except UnicodeEncodeError:
        return False


def open_regular_file(
    path: str | os.PathLike[str],
    *,
    within: str | os.PathLike[str] | None = None,
    max_bytes: int | None = None,
    what: str = "a regular file",
    buffering: int = -1,
) -> BinaryIO:
    """Open the regular file ``path`` for reading in binary mode, refusing anything else.

    Args:
        path: the file; with ``within``, a plain file name of that directory
            (see :func:`is_plain_name`), else any path (symbolic links are
            followed, and their target must be a regular file).
        within: the directory the file must be in. A symbolic link there is
            followed only if its target, fully resolved, is in this directory
            or below it.
        max_bytes: refuse a file larger than this many bytes (checked on the
            open descriptor, before anything is read).
        what: what the file should be, for messages ("an event file").
        buffering: as for :func:`open` (``0`` gives an unbuffered ``FileIO``).

    Returns the open file (a context manager, positioned at the start); its
    size at opening is ``os.fstat(file.fileno()).st_size``. Opening never
    blocks on a FIFO and never opens a device.

    Raises:
        UnsafeFileError: the file is refused (its type, size, name or link).
        FileNotFoundError: it does not exist (or is a broken link).
        OSError: it cannot be opened otherwise (permissions, ...).
    """
    where, target, no_follow = _locate(path, within)
    _require_regular(os.stat(target).st_mode, where, what)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    flags |= getattr(os, "O_BINARY", 0)
    if no_follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(target, flags)
    except FileNotFoundError:
        raise
    except OSError:
        if no_follow and os.path.islink(target):  # swapped for a link since it was checked
            raise UnsafeFileError(
                f"{where} became a symbolic link while being opened; refused", path=where
            ) from None
        raise
    try:
        info = os.fstat(fd)
        _require_regular(info.st_mode, where, what)
        if max_bytes is not None and info.st_size > max_bytes:
            raise UnsafeFileError(
                f"{where} has {info.st_size} bytes, more than the {max_bytes} {what} may "
                "have; refused",
                path=where,
            )
        _clear_nonblocking(fd)
        return open(fd, "rb", buffering=buffering)
    except BaseException:
        os.close(fd)
        raise


def read_regular_file(
    path: str | os.PathLike[str],
    *,
    max_bytes: int,
    within: str | os.PathLike[str] | None = None,
    what: str = "a regular file",
) -> bytes:
    """The whole content of the regular file ``path``, at most ``max_bytes`` of it.

    Opened as :func:`open_regular_file` opens it (the same arguments and
    errors). A file larger than ``max_bytes`` is refused before it is read, and
    at most ``max_bytes + 1`` bytes are ever read, so a file that grows while it
    is read, or lies about its size, cannot make it read more:
    :class:`UnsafeFileError` then too.
    """
    if max_bytes < 0:
        raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
    with open_regular_file(
        path, within=within, max_bytes=max_bytes, what=what, buffering=0
    ) as file:
        chunks: list[bytes] = []
        left = max_bytes + 1
        while left > 0:
            chunk = file.read(min(left, _READ_CHUNK))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    data = b"".join(chunks)
    if len(data) > max_bytes:
        where = _where(path, within)
        raise UnsafeFileError(
            f"{where} grew past the {max_bytes} bytes {what} may have while it was read; refused",
            path=where,
        )
    return data


def _where(path: str | os.PathLike[str], within: str | os.PathLike[str] | None) -> str:
    name = os.fspath(path)
    return name if within is None else os.path.join(os.fspath(within), name)


def _locate(
    path: str | os.PathLike[str], within: str | os.PathLike[str] | None
) -> tuple[str, str, bool]:
    """``(where, target, no_follow)``: the name for messages, the path to open, and
    whether a link found there at opening time means the entry was swapped."""
    where = _where(path, within)
    if within is None:
        return where, where, False
    name = os.fspath(path)
    if not is_plain_name(name):
        shown = repr(name)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        raise UnsafeFileError(
            f"{os.fspath(within)}: {shown} is not a plain file name of the directory "
            "(absolute, with a directory part, '..', a NUL byte or too long); refused",
            path=where,
        )
    if not os.path.islink(where):
        return where, where, True
    root = os.path.realpath(within)
    target = os.path.realpath(where)
    if os.path.commonpath([root, target]) != root:
        raise UnsafeFileError(
            f"{where} is a symbolic link to {target}, outside {os.fspath(within)}; refused",
            path=where,
        )
    return where, target, True


def _require_regular(mode: int, where: str, what: str) -> None:
    if stat.S_ISREG(mode):
        return
    kind = (
        "directory"
        if stat.S_ISDIR(mode)
        else "FIFO"
        if stat.S_ISFIFO(mode)
        else "device"
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
        else "socket"
        if stat.S_ISSOCK(mode)
        else "special file"
    )
    raise UnsafeFileError(f"{where} is a {kind}, not {what}; refused", path=where)


def _clear_nonblocking(fd: int) -> None:
    """Reads of the regular file that was opened block as usual (``O_NONBLOCK`` was for
    the open only: some filesystems honour it on reads too)."""
    with contextlib.suppress(ImportError, OSError):
        import fcntl

        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
