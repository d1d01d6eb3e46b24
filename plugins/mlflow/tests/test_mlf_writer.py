"""The frames between the training process and the sender process, on real pipes."""

from __future__ import annotations

import contextlib
import os
import struct
import threading
from collections.abc import Iterator

import pytest

from monitored_mlflow._writer import MAX_FRAME_BYTES, ProtocolError, read_frame, write_frame


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    read_end, write_end = os.pipe()
    yield read_end, write_end
    for fd in (read_end, write_end):
        with contextlib.suppress(OSError):  # closed by the test
            os.close(fd)


def test_frames_go_through_in_order_and_the_end_reads_none(pipe: tuple[int, int]) -> None:
    read_end, write_end = pipe
    big = ("items", [(step, 1000 + step, {"loss": 0.5, "lr": 0.1}) for step in range(20_000)], [])
    # Larger than the pipe's buffer: the reader reads while the writer writes.
    writer = threading.Thread(
        target=lambda: [write_frame(write_end, m) for m in (("start", {}), big, ("close",))]
    )
    writer.start()
    assert read_frame(read_end) == ("start", {})
    assert read_frame(read_end) == big
    assert read_frame(read_end) == ("close",)
    writer.join()
    os.close(write_end)
    assert read_frame(read_end) is None


def test_a_frame_cut_short_is_a_protocol_error(pipe: tuple[int, int]) -> None:
    read_end, write_end = pipe
    os.write(write_end, struct.pack(">I", 100) + b"x" * 10)
    os.close(write_end)
    with pytest.raises(ProtocolError, match=r"the stream ended inside a frame \(10 of 100 bytes\)"):
        read_frame(read_end)


def test_an_oversized_frame_is_refused_before_it_is_read(pipe: tuple[int, int]) -> None:
    read_end, write_end = pipe
    os.write(write_end, struct.pack(">I", MAX_FRAME_BYTES + 1))
    with pytest.raises(ProtocolError, match="over the limit"):
        read_frame(read_end)


def test_writing_to_a_closed_pipe_is_an_oserror(pipe: tuple[int, int]) -> None:
    read_end, write_end = pipe
    os.close(read_end)
    with pytest.raises(BrokenPipeError):
        write_frame(write_end, ("items", [], []))
