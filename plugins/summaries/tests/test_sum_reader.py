"""summary_iterator: reads our files and TensorBoard's, and hostile files safely."""

from __future__ import annotations

import os
import struct
import uuid
from pathlib import Path

import fsspec  # type: ignore[import-untyped]
import pytest
from tensorboardX.proto.event_pb2 import Event
from tensorboardX.proto.summary_pb2 import Summary
from tensorboardX.record_writer import masked_crc32c

from monitored_summaries import FileWriter, SummaryReaderError, summary_iterator


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


def test_a_record_claiming_more_than_the_file_is_not_read(tmp_path: Path) -> None:
    header = struct.pack("<Q", 1 << 40)
    path = tmp_path / "huge"
    path.write_bytes(record(event(1)) + header + struct.pack("<I", masked_crc32c(header)))
    assert [e.step for e in summary_iterator(path)] == [1]


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
