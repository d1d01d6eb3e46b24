"""FileWriter: TF1's API on tensorboardX, one file per directory, errors that surface."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from tensorboardX.proto.event_pb2 import Event, SessionLog
from tensorboardX.proto.summary_pb2 import Summary

import monitored_summaries as summaries
from monitored import MonitoredSession, StopAtStepHook, TrainState
from monitored_summaries import (
    FileWriter,
    FileWriterCache,
    SummaryDirectoryError,
    SummarySaverHook,
    SummaryWriteError,
    SummaryWriter,
    summary_iterator,
)


def test_add_summary_session_log_event_flush_close_read_back(logdir: str) -> None:
    writer = SummaryWriter(logdir, max_queue=2, flush_secs=120)
    assert writer.get_logdir() == logdir
    writer.add_summary(Summary(value=[Summary.Value(tag="a", simple_value=1.5)]), 3)
    writer.add_summary(
        Summary(value=[Summary.Value(tag="b", simple_value=2.0)]).SerializeToString(), 4
    )
    writer.add_session_log(SessionLog(status=SessionLog.START), 5)
    writer.add_event(Event(step=6, file_version="x"))
    writer.flush()
    events = list(summary_iterator(writer.path))
    assert [e.step for e in events] == [0, 3, 4, 5, 6]
    assert events[1].summary.value[0].simple_value == 1.5
    writer.add_summary(Summary(value=[Summary.Value(tag="c", simple_value=3.0)]), 7)
    writer.close()  # close flushes
    assert [e.step for e in summary_iterator(writer.path)][-1] == 7
    writer.close()  # twice is fine
    with pytest.raises(SummaryWriteError, match="is closed"):
        writer.add_summary(Summary(), 8)


def test_file_writer_cache_shares_one_file_per_directory(logdir: str) -> None:
    first = FileWriterCache.get(logdir)
    assert FileWriterCache.get(logdir + "/") is first
    assert FileWriterCache.get(os.path.join(logdir, ".")) is first
    first.close()
    assert FileWriterCache.get(logdir) is not first, "a closed writer is replaced"


async def test_two_hooks_of_one_directory_append_to_one_file(logdir: str) -> None:
    def step(state: TrainState) -> None:
        state.global_step += 1
        summaries.scalar("x", 1.0)

    hooks = [
        StopAtStepHook(last_step=2),
        SummarySaverHook(save_steps=1, output_dir=logdir),
        SummarySaverHook(save_steps=2, output_dir=logdir),
    ]
    async with MonitoredSession(TrainState(), hooks=hooks) as s:
        while not s.should_stop():
            await s.run(step)
    assert len([n for n in os.listdir(logdir) if n.startswith("events.out.tfevents.")]) == 1


def test_files_of_runs_started_in_one_second_sort_in_order(logdir: str) -> None:
    paths = [FileWriter(logdir).path for _ in range(5)]
    assert sorted(paths) == paths


def test_log_directory_that_is_a_file(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("")
    with pytest.raises(SummaryDirectoryError, match=f"{path}.* is a file, not a directory"):
        FileWriter(str(path))


def test_log_directory_that_cannot_be_made(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(SummaryDirectoryError, match="cannot create summary log directory"):
        FileWriter(str(tmp_path / "file" / "sub"))


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores permissions")
def test_log_directory_not_writable(tmp_path: Path) -> None:
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(SummaryDirectoryError, match="is not writable"):
            FileWriter(str(tmp_path))
    finally:
        tmp_path.chmod(0o700)


def test_not_writable_is_checked_with_access(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(os, "access", lambda *a, **k: False)
    with pytest.raises(SummaryDirectoryError, match=f"{tmp_path}.* is not writable"):
        FileWriter(str(tmp_path))


def test_removed_directory_is_raised_with_path_and_cause(logdir: str) -> None:
    writer = FileWriter(logdir)
    shutil.rmtree(logdir)
    writer.add_summary(Summary(value=[Summary.Value(tag="a", simple_value=1.0)]), 1)
    with pytest.raises(SummaryWriteError, match="removed while being written") as info:
        writer.flush()
    assert info.value.path == writer.path
    assert isinstance(info.value.__cause__, FileNotFoundError)
    with pytest.raises(SummaryWriteError):  # and from every later call
        writer.add_summary(Summary(), 2)


def test_disk_full_is_raised_from_the_next_call(logdir: str) -> None:
    writer = FileWriter(logdir)

    def full(*args: Any) -> None:
        raise OSError(28, "No space left on device")

    writer._events._py_recordio_writer.write = full  # type: ignore[method-assign]
    writer.add_summary(Summary(value=[Summary.Value(tag="a", simple_value=1.0)]), 1)
    with pytest.raises(SummaryWriteError, match=f"writing summaries to {writer.path}.*No space"):
        writer.flush()


@pytest.mark.anyio
async def test_a_write_failure_is_raised_from_the_next_step(logdir: str) -> None:
    def step(state: TrainState) -> None:
        state.global_step += 1
        summaries.scalar("x", 1.0)

    writer = FileWriter(logdir, flush_secs=0)  # flush after every event
    hook = SummarySaverHook(save_steps=1, summary_writer=writer)
    with pytest.raises(SummaryWriteError, match="removed while being written") as info:
        async with MonitoredSession(TrainState(), hooks=[hook]) as s:
            await s.run(step)
            shutil.rmtree(logdir)
            await s.run(step)
            with anyio.fail_after(60):  # the writer's thread notices; no fixed sleep
                while writer.error is None:  # noqa: ASYNC110 (set by a thread)
                    await anyio.sleep(0.01)
            await s.run(step)
            pytest.fail("the step after the failure ran")
    assert info.value.path == writer.path


@pytest.mark.anyio
async def test_a_crashed_session_leaves_every_event_readable(logdir: str, scalars: Any) -> None:
    def step(state: TrainState) -> None:
        state.global_step += 1
        summaries.scalar("x", float(state.global_step))
        if state.global_step == 4:
            raise RuntimeError("boom")

    kept = FileWriterCache.get(logdir)  # held beyond the session: released, not closed
    hook = SummarySaverHook(save_steps=1, output_dir=logdir)
    with pytest.raises(RuntimeError, match="boom"):
        async with MonitoredSession(TrainState(), hooks=[hook]) as s:
            while True:
                await s.run(step)
    # Read without closing the writer: what was written before the crash is on disk.
    assert hook.writer is kept
    assert not kept.closed
    events = list(summary_iterator(kept.path))
    assert scalars(events)["x"] == [(1, 1.0), (2, 2.0), (3, 3.0)]


def test_histogram_values_move_to_host_once_and_are_copied(logdir: str) -> None:
    writer = FileWriter(logdir)
    values = np.arange(5.0)
    writer.add_records(1, [("histogram", "h", values, {})], [values.copy()])
    values[:] = 100  # a later change never reaches the file
    writer.flush()
    [event] = [e for e in summary_iterator(writer.path) if e.step == 1]
    assert event.summary.value[0].histo.max == 4.0


def test_close_after_a_failed_final_flush_raises_and_returns(logdir: str) -> None:
    writer = FileWriter(logdir)
    writer.add_summary(Summary(value=[Summary.Value(tag="a", simple_value=1.0)]), 1)
    shutil.rmtree(logdir)
    with pytest.raises(SummaryWriteError, match="removed while being written"):
        writer.close()  # the failure of close's own flush; the thread still ends
    assert writer.closed
    assert not writer._thread.is_alive()


def test_the_writers_thread_takes_events_max_queue_at_a_time(logdir: str) -> None:
    writer = FileWriter(logdir, max_queue=10, flush_secs=1000)
    taken: list[int] = []
    get = writer._queue.get

    def counting_get(timeout: float | None) -> list[Any]:
        items = get(timeout)
        if items:
            taken.append(len(items))
        return items

    writer._queue.get = counting_get  # type: ignore[method-assign]
    writer.flush()  # the thread, woken, calls the counting get from now on
    taken.clear()
    for step in range(1, 26):
        writer.add_summary(Summary(value=[Summary.Value(tag="a", simple_value=step)]), step)
    writer.flush()
    # 25 events and a flush: woken at the 10th, the 20th, and by the flush (not 26 times).
    assert len(taken) <= 4
    assert sum(taken) == 26
    steps = [e.step for e in summary_iterator(writer.path) if e.summary.value]
    assert steps == list(range(1, 26)), "in order"
    writer.close()


def test_fewer_than_max_queue_events_still_reach_the_file_within_flush_secs(
    logdir: str,
) -> None:
    writer = FileWriter(logdir, max_queue=100, flush_secs=1.0)  # the least that batches
    writer.add_summary(Summary(value=[Summary.Value(tag="a", simple_value=1.0)]), 1)
    deadline = time.monotonic() + 60  # generous: a loaded machine
    steps: list[int] = []
    while time.monotonic() < deadline:
        steps = [e.step for e in summary_iterator(writer.path) if e.summary.value]
        if steps:
            break
        time.sleep(0.05)
    assert steps == [1], "written and flushed with no flush() call"
    writer.close()
