"""``summary_iterator``: TF1's event-file reader, safe on files that came from elsewhere.

An event file is a TFRecord file: each record is a little-endian ``uint64``
length, the masked CRC-32C of those 8 bytes, the serialized ``Event``, and the
masked CRC-32C of the event. The events are parsed by protobuf (tensorboardX's
``Event`` class) and the checksums computed by tensorboardX's ``masked_crc32c``;
only the 16 bytes of framing are read here. TensorBoard's own loader was the
first choice, but on a file someone else wrote it allocates whatever length a
record claims (a 12-byte file can ask for a terabyte), blocks forever on a FIFO,
and stops silently at a corrupt record. Here a record is read only if the file
holds all of it, only regular files are opened, and a corrupt record is a
:class:`SummaryReaderError` naming the file and the offset.

A file cut short (a crash, or a writer still writing) yields every complete
event: a last record that extends past the end of the file ends the iteration.
"""

from __future__ import annotations

import contextlib
import os
import stat
import struct
from collections.abc import Iterator
from typing import Any, BinaryIO, Final, cast

from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
from tensorboardX.proto.event_pb2 import Event
from tensorboardX.record_writer import masked_crc32c

from ._errors import SummaryReaderError
from ._logdir import is_local, url_to_fs

__all__ = ["MAX_EVENT_BYTES", "summary_iterator"]

#: The largest event read: protobuf cannot parse a message of 2 GiB or more.
MAX_EVENT_BYTES: Final = (1 << 31) - 1
_HEADER: Final = struct.Struct("<QI")
_FOOTER: Final = struct.Struct("<I")


def summary_iterator(path: str | os.PathLike[str]) -> Iterator[Any]:
    """Yield the ``Event`` protos of the event file ``path`` in order (TF1's reader).

    ``path`` is a local path or any fsspec URL (such as ``FileWriter.path`` of a
    writer to ``memory://`` or ``s3://``). Raises :class:`SummaryReaderError` if it
    is not a regular file or holds a corrupt record, ``FileNotFoundError`` if it
    does not exist.
    """
    name = os.fspath(path)
    with _open(name) as (file, size):
        offset = 0
        while size - offset >= _HEADER.size:
            header = file.read(_HEADER.size)
            if len(header) < _HEADER.size:
                return  # the file shrank while being read
            length, header_crc = _HEADER.unpack(header)
            if masked_crc32c(header[:8]) != header_crc:
                raise SummaryReaderError(
                    f"{name}: corrupt record header at byte {offset} (checksum mismatch); "
                    "not an event file, or damaged"
                )
            end = offset + _HEADER.size + length + _FOOTER.size
            if end > size:
                return  # cut short: every complete event was yielded
            if length > MAX_EVENT_BYTES:
                raise SummaryReaderError(
                    f"{name}: the record at byte {offset} claims {length} bytes, more than "
                    f"an event can have ({MAX_EVENT_BYTES}); refused"
                )
            data = file.read(length)
            footer = file.read(_FOOTER.size)
            if len(data) < length or len(footer) < _FOOTER.size:
                return
            if masked_crc32c(data) != _FOOTER.unpack(footer)[0]:
                raise SummaryReaderError(
                    f"{name}: corrupt event at byte {offset} (checksum mismatch)"
                )
            try:
                event = Event.FromString(data)
            except DecodeError as exc:
                raise SummaryReaderError(
                    f"{name}: the record at byte {offset} is not an Event: {exc}"
                ) from exc
            offset = end
            yield event


@contextlib.contextmanager
def _open(name: str) -> Iterator[tuple[BinaryIO, int]]:
    """Open the regular file ``name`` (a path or any fsspec URL); yield it and its size."""
    if "://" in name:
        fs, path = url_to_fs(name, "event file")
        if not is_local(fs):
            info = fs.info(path)
            if info.get("type") != "file":
                raise SummaryReaderError(
                    f"{name} is a {info.get('type')}, not an event file; refused"
                )
            with fs.open(path, "rb") as file:
                yield file, int(info.get("size") or 0)
            return
        name = path
    # The type is checked before opening (opening a FIFO blocks, a device may act)
    # and again on the descriptor, in case the entry changed in between.
    _require_regular(os.stat(name).st_mode, name)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(name, flags)
    with open(fd, "rb") as file:
        info = os.fstat(fd)
        _require_regular(info.st_mode, name)
        yield cast(BinaryIO, file), info.st_size


def _require_regular(mode: int, name: str) -> None:
    if not stat.S_ISREG(mode):
        kind = (
            "directory"
            if stat.S_ISDIR(mode)
            else "FIFO"
            if stat.S_ISFIFO(mode)
            else "device"
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "special file"
        )
        raise SummaryReaderError(f"{name} is a {kind}, not an event file; refused")
