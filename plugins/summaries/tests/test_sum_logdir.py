"""Event files on fsspec URLs: ``memory://`` (a remote filesystem) and ``file://``."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import fsspec  # type: ignore[import-untyped]
import numpy as np
import pytest
from tensorboardX.proto.summary_pb2 import Summary

import monitored_summaries as summaries
from monitored import MonitoredTrainingSession, StopAtStepHook, TrainState
from monitored_summaries import (
    FileWriter,
    FileWriterCache,
    SummaryDirectoryError,
    SummarySaverHook,
    SummaryWriteError,
    summary_iterator,
)


@pytest.fixture
def mem_dir() -> Iterator[str]:
    """A fresh ``memory://`` log directory, removed afterwards."""
    root = f"/logs-{uuid.uuid4().hex}"
    yield f"memory://{root}"
    fs = fsspec.filesystem("memory")
    if fs.exists(root):
        fs.rm(root, recursive=True)


def one(tag: str, value: float) -> Summary:
    return Summary(value=[Summary.Value(tag=tag, simple_value=value)])


def event_files(url: str) -> list[str]:
    fs, root = fsspec.core.url_to_fs(url)
    names = [p.rsplit("/", 1)[-1] for p in fs.ls(root, detail=False)]
    return sorted(f"{url}/{n}" for n in names if n.startswith("events.out.tfevents."))


def test_a_remote_writer_uploads_at_each_flush_and_close(mem_dir: str) -> None:
    writer = FileWriter(mem_dir)
    assert writer.path.startswith(mem_dir + "/events.out.tfevents.")
    assert writer.get_logdir() == mem_dir
    # The file exists from the start (with its header), so a bad directory fails early.
    assert [e.file_version for e in summary_iterator(writer.path)] == ["brain.Event:2"]
    writer.add_summary(one("a", 1.0), 1)
    writer.flush()
    assert [e.step for e in summary_iterator(writer.path)] == [0, 1]
    writer.add_summary(one("a", 2.0), 2)
    writer.close()
    steps = [e.step for e in summary_iterator(writer.path)]
    assert steps == [0, 1, 2]
    assert event_files(mem_dir) == [writer.path]


def test_a_remote_writer_leaves_no_staging_file(
    mem_dir: str, tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    writer = FileWriter(mem_dir)
    writer.add_summary(one("a", 1.0), 1)
    assert list(tmp_path.iterdir()) == [], "the staged file has no name from the start"
    writer.close()
    assert list(tmp_path.iterdir()) == []


def test_file_writer_cache_keys_urls_by_directory(mem_dir: str, tmp_path: Path) -> None:
    assert FileWriterCache.get(mem_dir) is FileWriterCache.get(mem_dir + "/")
    local = tmp_path / "logs"
    assert FileWriterCache.get(f"file://{local}") is FileWriterCache.get(str(local))


def test_a_file_url_writes_a_local_file(tmp_path: Path) -> None:
    writer = FileWriter(f"file://{tmp_path}/logs")
    assert os.path.dirname(writer.path) == str(tmp_path / "logs")
    writer.add_summary(one("a", 1.0), 3)
    writer.close()
    assert [e.step for e in summary_iterator(f"file://{writer.path}")] == [0, 3]


def test_a_remote_directory_that_is_a_file(mem_dir: str) -> None:
    fsspec.filesystem("memory").pipe_file(mem_dir.removeprefix("memory://"), b"x")
    with pytest.raises(SummaryDirectoryError, match=f"{mem_dir}.* is a file, not a directory"):
        FileWriter(mem_dir)


def test_a_url_without_a_filesystem() -> None:
    with pytest.raises(SummaryDirectoryError, match="no filesystem for this URL"):
        FileWriter("nosuchprotocol://bucket/logs")


def test_a_remote_directory_that_cannot_be_made(mem_dir: str, monkeypatch: Any) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise PermissionError(13, "Access denied")

    monkeypatch.setattr(fsspec.filesystem("memory"), "makedirs", refuse)
    with pytest.raises(SummaryDirectoryError, match=f"cannot create .*{mem_dir}.*Access denied"):
        FileWriter(mem_dir)


def test_a_remote_directory_that_refuses_writes_fails_at_once(
    mem_dir: str, monkeypatch: Any
) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise PermissionError(13, "Access denied")

    monkeypatch.setattr(fsspec.filesystem("memory"), "open", refuse)
    with pytest.raises(SummaryDirectoryError, match=f"cannot write an event file to .*{mem_dir}"):
        FileWriter(mem_dir)


def test_a_failed_upload_is_raised_from_the_next_call(mem_dir: str, monkeypatch: Any) -> None:
    writer = FileWriter(mem_dir)

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise OSError(5, "Service unavailable")

    monkeypatch.setattr(fsspec.filesystem("memory"), "open", refuse)
    writer.add_summary(one("a", 1.0), 1)
    with pytest.raises(SummaryWriteError, match=f"{writer.path}.*Service unavailable") as info:
        writer.flush()
    assert info.value.path == writer.path
    assert isinstance(info.value.__cause__, OSError)
    with pytest.raises(SummaryWriteError):
        writer.close()


def test_a_failed_upload_keeps_the_last_complete_copy_and_no_partial_file(
    mem_dir: str, monkeypatch: Any
) -> None:
    writer = FileWriter(mem_dir)
    writer.add_summary(one("a", 1.0), 1)
    writer.flush()
    fs = fsspec.filesystem("memory")

    def broken_move(*args: Any, **kwargs: Any) -> None:
        raise OSError(5, "connection reset")

    monkeypatch.setattr(fs, "mv", broken_move)
    writer.add_summary(one("a", 2.0), 2)
    with pytest.raises(SummaryWriteError, match="connection reset"):
        writer.flush()
    assert [e.step for e in summary_iterator(writer.path)] == [0, 1]
    root = mem_dir.removeprefix("memory://")
    assert [p.rsplit("/", 1)[-1] for p in fs.ls(root, detail=False)] == [
        writer.path.rsplit("/", 1)[-1]
    ]
    with pytest.raises(SummaryWriteError):
        writer.close()


def test_a_failed_writer_waits_for_close_instead_of_spinning(
    mem_dir: str, monkeypatch: Any
) -> None:
    writer = FileWriter(mem_dir, flush_secs=0.001)
    monkeypatch.setattr(fsspec.filesystem("memory"), "mv", _refuse)
    writer.add_summary(one("a", 1.0), 1)
    with pytest.raises(SummaryWriteError):
        writer.flush()
    calls = 0
    get = writer._queue.get

    def counting_get(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return get(*args, **kwargs)

    monkeypatch.setattr(writer._queue, "get", counting_get)
    writer._queue.put(None)  # wake the thread once, so that it runs the loop again
    time.sleep(0.2)
    # A thread that spun (a zero timeout after the failure) would have looped thousands of times.
    assert calls <= 2
    with pytest.raises(SummaryWriteError):
        writer.close()


def _refuse(*args: Any, **kwargs: Any) -> None:
    raise OSError(5, "connection reset")


def test_a_remote_writer_that_cannot_start_leaves_no_staging_directory(
    mem_dir: str, tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)

    def no_events_file(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("monitored_summaries._writer.OrderedEventsWriter", no_events_file)
    with pytest.raises(SummaryDirectoryError, match="No space left"):
        FileWriter(mem_dir)
    assert os.listdir(tmp_path) == []


@pytest.mark.anyio
async def test_a_training_session_writes_summaries_to_a_url(mem_dir: str, scalars: Any) -> None:
    def step(state: TrainState) -> dict[str, Any]:
        state.global_step += 1
        summaries.scalar("loss", 1.0 / state.global_step)
        return {}

    hooks = [StopAtStepHook(last_step=7)]
    async with MonitoredTrainingSession(
        TrainState(), hooks=hooks, summary_dir=mem_dir, save_summaries_steps=3
    ) as sess:
        while not sess.should_stop():
            await sess.run(step)
    [path] = event_files(mem_dir)
    written = scalars(list(summary_iterator(path)))["loss"]
    assert [s for s, _ in written] == [1, 4, 7]
    assert np.isclose(written[-1][1], 1 / 7)


@pytest.mark.anyio
async def test_a_remote_failure_is_raised_from_the_next_step(
    mem_dir: str, monkeypatch: Any
) -> None:
    def step(state: TrainState) -> None:
        state.global_step += 1
        summaries.scalar("x", 1.0)

    writer = FileWriter(mem_dir, flush_secs=0)  # upload after every event
    hook = SummarySaverHook(save_steps=1, summary_writer=writer)

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "Quota exceeded")

    with pytest.raises(SummaryWriteError, match="Quota exceeded") as info:
        async with MonitoredTrainingSession(TrainState(), hooks=[hook]) as s:
            await s.run(step)
            monkeypatch.setattr(fsspec.filesystem("memory"), "open", refuse)
            await s.run(step)
            with anyio.fail_after(60):  # the writer's thread notices; no fixed sleep
                while writer.error is None:  # noqa: ASYNC110 (set by a thread)
                    await anyio.sleep(0.01)
            await s.run(step)
            pytest.fail("the step after the failure ran")
    assert info.value.path == writer.path
