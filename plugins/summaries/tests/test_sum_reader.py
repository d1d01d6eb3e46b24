"""summary_iterator: reads our files and TensorBoard's, and hostile files safely."""

from __future__ import annotations

import os
import random
import struct
import time
import tracemalloc
import uuid
from pathlib import Path

import fsspec  # type: ignore[import-untyped]
import pytest
from tensorboardX.proto.event_pb2 import Event
from tensorboardX.proto.summary_pb2 import Summary
from tensorboardX.record_writer import masked_crc32c

from monitored_summaries import (
    MAX_RECORD_BYTES,
    FileWriter,
    SummaryReaderError,
    _reader,
    summary_iterator,
)
from monitored_summaries._reader import MAX_EVENT_BYTES


def record(data: bytes, *, header_crc: int | None = None, data_crc: int | None = None) -> bytes:
    header = struct.pack("<Q", len(data))
    head = masked_crc32c(header) if header_crc is None else header_crc
    tail = masked_crc32c(data) if data_crc is None else data_crc
    return header + struct.pack("<I", head) + data + struct.pack("<I", tail)


def event(step: int) -> bytes:
    summary = Summary(value=[Summary.Value(tag="x", simple_value=float(step))])
    return Event(step=step, summary=summary).SerializeToString()


def test_reads_what_the_writer_wrote(tmp_path: Path) -> None:
    writer = FileWriter(tmp_path)
    writer.add_summary(Summary(value=[Summary.Value(tag="x", simple_value=2.5)]), 9)
    writer.close()
    events = list(summary_iterator(Path(writer.path)))
    assert [e.step for e in events] == [0, 9]
    assert events[0].file_version == "brain.Event:2"
    assert events[1].summary.value[0].simple_value == 2.5


def test_a_file_cut_short_yields_every_complete_event(tmp_path: Path) -> None:
    data = record(event(1)) + record(event(2))
    for cut in range(len(record(event(1))), len(data)):
        path = tmp_path / f"cut{cut}"
        path.write_bytes(data[:cut])
        assert [e.step for e in summary_iterator(path)] == [1], cut


@pytest.mark.parametrize("chunk", [1, 13, 64, 1 << 20])
def test_records_across_read_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """The file is read in chunks: records straddling them, or larger, read the same."""
    monkeypatch.setattr(_reader, "_CHUNK", chunk)
    summaries = [
        Summary(value=[Summary.Value(tag="t" * (1 + 37 * i % 300), simple_value=i)])
        for i in range(40)
    ]
    frames = [record(Event(step=i, summary=v).SerializeToString()) for i, v in enumerate(summaries)]
    path = tmp_path / "events"
    path.write_bytes(b"".join(frames))
    assert [e.step for e in summary_iterator(path)] == list(range(40))
    cut = sum(len(f) for f in frames[:25]) + len(frames[25]) // 2
    path.write_bytes(b"".join(frames)[:cut])
    assert [e.step for e in summary_iterator(path)] == list(range(25))
    damaged = bytearray(b"".join(frames))
    damaged[sum(len(f) for f in frames[:30]) + 14] ^= 0xFF
    path.write_bytes(bytes(damaged))
    offset = sum(len(f) for f in frames[:30])
    with pytest.raises(SummaryReaderError, match=f"corrupt event at byte {offset}"):
        list(summary_iterator(path))


def test_a_record_claiming_more_than_the_file_is_not_read(tmp_path: Path) -> None:
    header = struct.pack("<Q", 1 << 20)
    path = tmp_path / "huge"
    path.write_bytes(record(event(1)) + header + struct.pack("<I", masked_crc32c(header)))
    assert [e.step for e in summary_iterator(path)] == [1]


@pytest.mark.parametrize("claimed", [2 << 30, (1 << 31) - 1, (1 << 64) - 1])
@pytest.mark.parametrize("tail", [0, 5, 100])
def test_a_last_record_claiming_more_than_the_bound_and_the_file_is_a_cut_tail(
    tmp_path: Path, claimed: int, tail: int
) -> None:
    """Issue 31 §6: a length beyond the bound that the file does not hold is a tail
    cut short (a crash, a writer still writing), as TensorBoard reads it: every
    complete event before it, then the end; nothing of it is allocated."""
    header = struct.pack("<Q", claimed)
    path = tmp_path / "events.out.tfevents.cut"
    path.write_bytes(
        record(event(1))
        + record(event(2))
        + header
        + struct.pack("<I", masked_crc32c(header))
        + b"\x00" * tail
    )
    tracemalloc.start()
    try:
        assert [e.step for e in summary_iterator(path)] == [1, 2]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20


def sparse_event_file(path: Path, claimed: int) -> int:
    """A good event, then a record header claiming ``claimed`` bytes, in a sparse file
    as long as the claim (no disk used); returns the offset of the big record."""
    first = record(event(1))
    header = struct.pack("<Q", claimed)
    with open(path, "wb") as file:
        file.write(first + header + struct.pack("<I", masked_crc32c(header)))
        file.truncate(len(first) + 12 + claimed + 4)
    return len(first)


@pytest.mark.parametrize("claimed", [256 << 20, 2 << 30, 1 << 40])
def test_refuse_records_larger_than_the_bound_before_reading_them(
    tmp_path: Path, claimed: int
) -> None:
    """Issue 25 §6: a crafted 256 MiB or 2 GiB record fails fast, allocating nothing."""
    path = tmp_path / f"events.out.tfevents.{claimed}"
    offset = sparse_event_file(path, claimed)
    assert os.stat(path).st_size > claimed
    steps: list[int] = []
    tracemalloc.start()
    started = time.process_time()
    try:
        with pytest.raises(
            SummaryReaderError,
            match=rf"{path}: the record at byte {offset} claims {claimed} bytes, more than "
            rf"the {MAX_RECORD_BYTES} a record may have",
        ):
            steps.extend(e.step for e in summary_iterator(path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert steps == [1], "the events before it are yielded"
    assert peak < 4 << 20, f"{peak} bytes allocated for a refused record"
    assert time.process_time() - started < 5


def test_the_record_bound_is_documented_and_adjustable(tmp_path: Path) -> None:
    assert MAX_RECORD_BYTES == 64 << 20
    path = tmp_path / "events"
    data = event(1)
    path.write_bytes(record(data) + record(event(2)))
    assert [e.step for e in summary_iterator(path, max_record_bytes=len(data))] == [1, 2]
    with pytest.raises(SummaryReaderError, match=f"claims {len(data)} bytes, more than the 4"):
        list(summary_iterator(path, max_record_bytes=4))
    for bad in (0, -1, MAX_EVENT_BYTES + 1, 1.5, True):
        with pytest.raises(ValueError, match="max_record_bytes must be an int"):
            list(summary_iterator(path, max_record_bytes=bad))  # type: ignore[arg-type]


def test_reading_event_files_at_library_speed_uses_the_accelerated_crc32c() -> None:
    """Issue 25 §6: the reader and tensorboardX's writer both use the ``crc32c`` package
    (tensorboardX falls back to pure Python without it)."""
    import crc32c
    import tensorboardX.crc32c
    import tensorboardX.record_writer

    assert tensorboardX.record_writer.crc32c is crc32c.crc32c, "the writer's CRC is pure Python"
    assert _reader.crc32c is crc32c.crc32c
    rng = random.Random(0)
    for size in (0, 1, 7, 8, 100, 4096, 100_003):
        data = rng.randbytes(size)
        slow = tensorboardX.crc32c._crc32c(data)
        expected = ((((slow >> 15) | (slow << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF
        assert _reader.masked_crc32c(data) == masked_crc32c(data) == expected, size
        assert _reader.masked_crc32c(memoryview(data)) == expected


def test_a_corrupt_header_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "bad"
    path.write_bytes(record(event(1)) + record(event(2), header_crc=0))
    offset = len(record(event(1)))
    with pytest.raises(SummaryReaderError, match=f"{path}: corrupt record header at byte {offset}"):
        list(summary_iterator(path))


def test_a_corrupt_event_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "bad"
    path.write_bytes(record(event(1), data_crc=0))
    with pytest.raises(SummaryReaderError, match=f"{path}: corrupt event at byte 0"):
        list(summary_iterator(path))


def test_a_record_that_is_not_an_event_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "bad"
    path.write_bytes(record(b"\xff\xff\xff"))
    with pytest.raises(SummaryReaderError, match=f"{path}: the record at byte 0 is not an Event"):
        list(summary_iterator(path))


def test_a_text_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("these are not the events you are looking for\n")
    with pytest.raises(SummaryReaderError, match="corrupt record header at byte 0"):
        list(summary_iterator(path))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    path = tmp_path / "events.out.tfevents.fifo"
    os.mkfifo(path)
    with pytest.raises(SummaryReaderError, match="is a FIFO, not an event file"):
        list(summary_iterator(path))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_one_way_to_open_the_reader_refuses_through_the_core_opener(tmp_path: Path) -> None:
    """Issue 25 §7: the reader has no opener of its own; links are followed to a
    regular file only."""
    from monitored import UnsafeFileError

    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "events.link").symlink_to(tmp_path / "fifo")
    with pytest.raises(SummaryReaderError, match="events.link is a FIFO") as info:
        list(summary_iterator(tmp_path / "events.link"))
    assert isinstance(info.value.__cause__, UnsafeFileError)
    (tmp_path / "real").write_bytes(record(event(7)))
    (tmp_path / "good.link").symlink_to(tmp_path / "real")
    assert [e.step for e in summary_iterator(tmp_path / "good.link")] == [7]


def test_a_directory_and_a_device_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SummaryReaderError, match="is a directory, not an event file"):
        list(summary_iterator(tmp_path))
    if os.path.exists("/dev/zero"):
        with pytest.raises(SummaryReaderError, match="is a device, not an event file"):
            list(summary_iterator("/dev/zero"))


def test_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        list(summary_iterator(tmp_path / "missing"))


def test_reads_an_fsspec_url_and_refuses_a_remote_directory() -> None:
    fs = fsspec.filesystem("memory")
    root = f"/read-{uuid.uuid4().hex}"
    try:
        fs.pipe_file(f"{root}/events", record(event(4)) + record(event(5))[:-1])
        assert [e.step for e in summary_iterator(f"memory://{root}/events")] == [4]
        with pytest.raises(SummaryReaderError, match="is a directory, not an event file"):
            list(summary_iterator(f"memory://{root}"))
    finally:
        fs.rm(root, recursive=True)


def test_reads_a_file_written_by_tensorboard(tmp_path: Path) -> None:
    """The real ``tensorboard`` package's writer: the formats agree both ways."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(tmp_path))
    value = summary_pb2.Summary.Value(tag="t", simple_value=1.0)
    writer.add_event(event_pb2.Event(step=3, summary=summary_pb2.Summary(value=[value])))
    writer.close()
    [path] = [p for p in tmp_path.iterdir() if p.name.startswith("events.out.tfevents.")]
    events = list(summary_iterator(path))
    assert events[-1].step == 3
    assert events[-1].summary.value[0].simple_value == 1.0


def test_an_event_file_named_with_control_characters_is_named_escaped(tmp_path: Path) -> None:
    """Issue 34 §2: an event file found by listing a log directory may be named with
    ESC/OSC sequences, a newline and bytes that are not UTF-8: the reader's errors
    name it escaped, on one line."""
    from _hostile import HOSTILE_NAME, assert_safe_line

    damaged = tmp_path / f"events.out.tfevents.1.{HOSTILE_NAME}"
    damaged.write_bytes(record(event(1), data_crc=0))
    fifo = tmp_path / f"events.out.tfevents.2.{HOSTILE_NAME}"
    os.mkfifo(fifo)
    for path in sorted(tmp_path.iterdir()):  # as a reader of a log directory finds them
        with pytest.raises(SummaryReaderError) as info:
            list(summary_iterator(path))
        assert_safe_line(str(info.value))
