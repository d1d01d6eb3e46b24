"""``summary_iterator``: TF1's event-file reader, safe on files that came from elsewhere.

An event file is a TFRecord file: each record is a little-endian ``uint64``
length, the masked CRC-32C of those 8 bytes, the serialized ``Event``, and the
masked CRC-32C of the event. The events are parsed by protobuf (tensorboardX's
``Event`` class) and the checksums computed by the ``crc32c`` package (hardware
CRC-32C where the CPU has it, C otherwise: without it tensorboardX falls back to
pure Python, about 4 MiB/s); only the framing is read here. TensorBoard's own
loader was the first choice, but on a file someone else wrote it allocates
whatever length a record claims (a 12-byte file can ask for a terabyte), blocks
forever on a FIFO, and stops silently at a corrupt record. Here only regular
files are opened (through :func:`monitored.open_regular_file`), a record is read
only if the file holds all of it and it is no larger than ``max_record_bytes``
(:data:`MAX_RECORD_BYTES` by default, checked before anything of it is read),
and a corrupt record is a :class:`SummaryReaderError` naming the file and the
offset.

A file cut short (a crash, or a writer still writing) yields every complete
event: a last record that extends past the end of the file ends the iteration,
whatever length its header claims (2 GiB, ``2**64 - 1``): only a record the file
holds whole is checked against ``max_record_bytes``.
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Iterator
from typing import Any, BinaryIO, Final

from crc32c import crc32c
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
from tensorboardX.proto.event_pb2 import Event

from monitored import UnsafeFileError, open_regular_file

from ._errors import SummaryReaderError
from ._logdir import is_local, url_to_fs

__all__ = ["MAX_EVENT_BYTES", "MAX_RECORD_BYTES", "masked_crc32c", "summary_iterator"]

#: The largest event protobuf can parse (2 GiB - 1): the most ``max_record_bytes`` may be.
MAX_EVENT_BYTES: Final = (1 << 31) - 1
#: The largest record :func:`summary_iterator` reads by default (64 MiB). A record is
#: read whole into memory, so this bounds what one record of a file from elsewhere
#: costs; raise it with ``max_record_bytes`` for files of very large images or audio.
MAX_RECORD_BYTES: Final = 64 << 20
_HEADER: Final = struct.Struct("<QI")
_FOOTER: Final = struct.Struct("<I")
_MASK_DELTA: Final = 0xA282EAD8
#: How much of an event file is read at a time.
_CHUNK: Final = 1 << 20


def masked_crc32c(data: bytes | memoryview) -> int:
    """The masked CRC-32C of ``data``, as TFRecord framing stores it (accelerated)."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def summary_iterator(
    path: str | os.PathLike[str], *, max_record_bytes: int = MAX_RECORD_BYTES
) -> Iterator[Any]:
    """Yield the ``Event`` protos of the event file ``path`` in order (TF1's reader).

    ``path`` is a local path or any fsspec URL (such as ``FileWriter.path`` of a
    writer to ``memory://`` or ``s3://``). A record larger than
    ``max_record_bytes`` (at most :data:`MAX_EVENT_BYTES`) is refused before any
    of it is read. Raises :class:`SummaryReaderError` if ``path`` is not a
    regular file, holds a corrupt record or one that is too large,
    ``FileNotFoundError`` if it does not exist.
    """
    if (
        not isinstance(max_record_bytes, int)
        or isinstance(max_record_bytes, bool)
        or not 0 < max_record_bytes <= MAX_EVENT_BYTES
    ):
        raise ValueError(
            f"summary_iterator: max_record_bytes must be an int from 1 to {MAX_EVENT_BYTES}, "
            f"got {max_record_bytes!r}"
        )
    name = os.fspath(path)
    with _open(name) as (file, size):
        for offset, data in _records(file, size, name, max_record_bytes):
            try:
                event = Event.FromString(data)
            except DecodeError as exc:
                raise SummaryReaderError(
                    f"{name}: the record at byte {offset} is not an Event: {exc}"
                ) from exc
            yield event


def _records(
    file: BinaryIO, size: int, name: str, max_record_bytes: int
) -> Iterator[tuple[int, memoryview]]:
    """``(offset, data)`` of each complete, checked record of the first ``size`` bytes.

    The file is read in chunks of :data:`_CHUNK` bytes and records are cut out of
    them (a record larger than a chunk is read whole, once its header is checked):
    two small reads per record cost more than the checks on a file of scalars.
    """
    header_size, footer_size = _HEADER.size, _FOOTER.size
    buffer = b""
    view = memoryview(buffer)
    at = 0  # where the next record starts in buffer
    offset = 0  # where it starts in the file
    while size - offset >= header_size:
        if len(buffer) - at < header_size:
            wanted = max(header_size - (len(buffer) - at), min(_CHUNK, size - offset))
            buffer = buffer[at:] + file.read(wanted)
            view, at = memoryview(buffer), 0
            if len(buffer) < header_size:
                return  # the file shrank while being read
        length, header_crc = _HEADER.unpack_from(buffer, at)
        if masked_crc32c(view[at : at + 8]) != header_crc:
            raise SummaryReaderError(
                f"{name}: corrupt record header at byte {offset} (checksum mismatch); "
                "not an event file, or damaged"
            )
        record_size = header_size + length + footer_size
        if offset + record_size > size:
            # A record that claims more than the file holds, however much (2 GiB,
            # 2**64 - 1): a tail cut short by a crash, or still being written. Every
            # complete event was yielded; stop, as TensorBoard's reader does.
            return
        if length > max_record_bytes:
            raise SummaryReaderError(
                f"{name}: the record at byte {offset} claims {length} bytes, more than "
                f"the {max_record_bytes} a record may have (summary_iterator's "
                "max_record_bytes); refused"
            )
        if len(buffer) - at < record_size:
            wanted = max(record_size - (len(buffer) - at), min(_CHUNK, size - offset))
            buffer = buffer[at:] + file.read(wanted)
            view, at = memoryview(buffer), 0
            if len(buffer) < record_size:
                return  # the file shrank while being read
        data = view[at + header_size : at + header_size + length]
        if masked_crc32c(data) != _FOOTER.unpack_from(buffer, at + header_size + length)[0]:
            raise SummaryReaderError(f"{name}: corrupt event at byte {offset} (checksum mismatch)")
        yield offset, data
        at += record_size
        offset += record_size


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
    try:
        file = open_regular_file(name, what="an event file")
    except UnsafeFileError as exc:
        raise SummaryReaderError(str(exc)) from exc
    with file:
        yield file, os.fstat(file.fileno()).st_size
