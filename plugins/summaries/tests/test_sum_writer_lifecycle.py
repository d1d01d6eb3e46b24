"""A writer lives as long as what opened it: sessions release theirs, exit never raises.

Issue 25 §6: a session used to leave the directory's shared writer open, so a
test that removed its temporary directory got three tracebacks at exit (the
writer's thread, an error listener stopping a closed session, the at-exit
flush). These tests run real processes and require their stderr to be empty.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import pytest
from tensorboardX.proto.summary_pb2 import Summary

import monitored_summaries as summaries
from monitored import AbortedError, Coordinator, MonitoredSession, StopAtStepHook, TrainState
from monitored_summaries import (
    FileWriter,
    FileWriterCache,
    SummarySaverHook,
    SummaryWriteError,
    summary_iterator,
)
from monitored_summaries import _writer as writer_module
from monitored_summaries._hook import _stop_on_error

TRAIN_THEN_REMOVE = """
import shutil, sys, tempfile
import anyio, numpy as np
import monitored

async def main() -> None:
    directory = tempfile.mkdtemp()
    state = monitored.TrainState({"w": np.ones(4, np.float32)})

    def step(state):
        state.global_step += 1
        return {"loss": np.float32(state.global_step)}

    async with monitored.MonitoredTrainingSession(
        state,
        checkpoint_dir=directory,
        save_summaries_steps=1,
        hooks=[monitored.StopAtStepHook(last_step=STEPS)],
    ) as session:
        while not session.should_stop():
            await session.run(step)
    shutil.rmtree(directory)
    print("trained")

anyio.run(main)
"""


def run_python(source: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(source))
    environment = {**os.environ, **env}
    environment.pop("MONITORED_DISABLE_PLUGIN_AUTOLOAD", None)
    return subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env=environment,
        cwd=tmp_path,
        check=False,
    )


@pytest.mark.parametrize("steps", [3, 250])
def test_a_session_flushes_and_releases_what_it_opened_when_it_ends(
    tmp_path: Path, steps: int
) -> None:
    """Train with checkpoint_dir=d, end normally, remove d: the process exits cleanly."""
    result = run_python(TRAIN_THEN_REMOVE.replace("STEPS", str(steps)), tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "trained\n"
    assert result.stderr == "", result.stderr


def test_nothing_at_exit_raises_over_a_directory_the_user_removed(tmp_path: Path) -> None:
    """Writers the user holds (one of their own, one of the cache) with events still
    queued, their directories removed before the process exits."""
    source = """
    import shutil, tempfile
    from tensorboardX.proto.summary_pb2 import Summary
    from monitored_summaries import FileWriter, FileWriterCache

    own, cached = tempfile.mkdtemp(), tempfile.mkdtemp()
    writers = [FileWriter(own, max_queue=1000), FileWriterCache.get(cached)]
    for writer in writers:
        for step in range(100):
            writer.add_summary(Summary(value=[Summary.Value(tag="x", simple_value=1.0)]), step)
    shutil.rmtree(own)
    shutil.rmtree(cached)
    print("removed")
    """
    result = run_python(source, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "removed\n"
    assert result.stderr == "", result.stderr


def test_at_exit_a_writer_whose_directory_is_still_there_is_flushed(tmp_path: Path) -> None:
    source = f"""
    from tensorboardX.proto.summary_pb2 import Summary
    from monitored_summaries import FileWriter

    writer = FileWriter({str(tmp_path / "logs")!r}, max_queue=1000, flush_secs=1000)
    writer.add_summary(Summary(value=[Summary.Value(tag="x", simple_value=2.0)]), 7)
    print(writer.path)
    """
    result = run_python(source, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    events = list(summary_iterator(result.stdout.strip()))
    assert [e.step for e in events] == [0, 7]


def test_shared_writers_are_released_by_reference_count(tmp_path: Path) -> None:
    logdir = str(tmp_path / "logs")
    first = FileWriterCache.acquire(logdir)
    second = FileWriterCache.acquire(logdir + "/")
    assert first is second
    first.add_summary(Summary(value=[Summary.Value(tag="x", simple_value=1.0)]), 1)
    FileWriterCache.release(first)
    assert not first.closed, "another session still holds it"
    assert [e.step for e in summary_iterator(first.path)] == [0, 1], "a release flushes"
    FileWriterCache.release(second)
    assert first.closed, "the last release closes it"
    FileWriterCache.release(first)  # closed: nothing more to do
    stranger = FileWriter(logdir)
    with pytest.raises(ValueError, match="was not acquired"):
        FileWriterCache.release(stranger)
    stranger.close()
    held = FileWriterCache.acquire(logdir)
    FileWriterCache.clear()
    FileWriterCache.release(held)  # cleared under a session: its release is a no-op
    fresh = FileWriterCache.acquire(logdir)
    assert fresh is not first
    pinned = FileWriterCache.get(logdir)
    assert pinned is fresh
    FileWriterCache.release(fresh)
    assert not fresh.closed, "a writer handed out by get stays open (TF1's cache)"


@pytest.mark.anyio
async def test_sessions_in_a_loop_leave_no_writer_open(tmp_path: Path) -> None:
    def step(state: TrainState) -> None:
        state.global_step += 1
        summaries.scalar("x", 1.0)

    before = len(writer_module._LIVE)
    for i in range(20):
        hook = SummarySaverHook(save_steps=1, output_dir=str(tmp_path / f"run{i}"))
        async with MonitoredSession(TrainState(), hooks=[hook, StopAtStepHook(3)]) as session:
            while not session.should_stop():
                await session.run(step)
        assert hook.writer is not None
        assert hook.writer.closed
        assert [e.step for e in summary_iterator(hook.writer.path)][-1] == 3
    assert len(writer_module._LIVE) == before


@pytest.mark.anyio
async def test_two_sessions_share_one_writer_until_the_last_ends(tmp_path: Path) -> None:
    logdir = str(tmp_path / "logs")

    def step(state: TrainState) -> None:
        state.global_step += 1
        summaries.scalar("x", float(state.global_step))

    first, second = (SummarySaverHook(save_steps=1, output_dir=logdir) for _ in range(2))
    async with MonitoredSession(TrainState(), hooks=[first]) as a:
        async with MonitoredSession(TrainState(), hooks=[second]) as b:
            await a.run(step)
            await b.run(step)
        assert first.writer is second.writer
        assert first.writer is not None
        assert not first.writer.closed
        await a.run(step)
    assert first.writer.closed
    assert len(list(tmp_path.joinpath("logs").iterdir())) == 1, "one event file"
    async with MonitoredSession(TrainState(), hooks=[first]) as a:
        await a.run(step)
    assert len(list(tmp_path.joinpath("logs").iterdir())) == 2, "a later session: a new file"


@pytest.mark.anyio
async def test_a_failed_session_releases_its_writer(tmp_path: Path) -> None:
    def step(state: TrainState) -> None:
        state.global_step += 1
        summaries.scalar("x", float(state.global_step))
        if state.global_step == 3:
            raise RuntimeError("boom")

    hook = SummarySaverHook(save_steps=1, output_dir=str(tmp_path / "logs"))
    with pytest.raises(RuntimeError, match="boom"):
        async with MonitoredSession(TrainState(), hooks=[hook]) as session:
            while True:
                await session.run(step)
    assert hook.writer is not None
    assert hook.writer.closed
    assert [e.step for e in summary_iterator(hook.writer.path)] == [0, 1, 1, 2]


@pytest.mark.anyio
async def test_a_session_stopped_by_a_background_failure_releases_its_writer(
    tmp_path: Path,
) -> None:
    def step(state: TrainState) -> None:
        state.global_step += 1
        summaries.scalar("x", float(state.global_step))

    hook = SummarySaverHook(save_steps=1, output_dir=str(tmp_path / "logs"))
    with pytest.raises(RuntimeError, match="background task failed"):
        async with MonitoredSession(TrainState(), hooks=[hook]) as session:
            await session.run(step)
            session.coord.request_stop(RuntimeError("background task failed"))
            with anyio.fail_after(60):  # the hook's task wakes on the stop
                while hook.writer is not None and not hook.writer.closed:  # noqa: ASYNC110
                    await anyio.sleep(0.01)
    assert hook.writer is not None
    assert hook.writer.closed
    assert [e.step for e in summary_iterator(hook.writer.path)] == [0, 1, 1]


@pytest.mark.anyio
@pytest.mark.parametrize("how", ["raised by the step", "reported to the coordinator"])
async def test_a_recreated_session_keeps_its_writer(tmp_path: Path, how: str) -> None:
    aborted = []

    def step(state: TrainState) -> None:
        if how == "raised by the step" and state.global_step == 2 and not aborted:
            aborted.append(True)
            raise AbortedError("preempted")
        state.global_step += 1
        summaries.scalar("x", float(state.global_step))

    hook = SummarySaverHook(save_steps=1, output_dir=str(tmp_path / "logs"))
    async with MonitoredSession(TrainState(), hooks=[hook, StopAtStepHook(4)]) as session:
        writer = hook.writer
        while not session.should_stop():
            await session.run(step)
            if how == "reported to the coordinator" and not aborted:
                aborted.append(True)
                session.coord.request_stop(AbortedError("a peer was lost"))
                await anyio.sleep(0.3)  # the hook's task sees the stop meanwhile
            assert hook.writer is writer
            assert writer is not None
            assert not writer.closed
    assert aborted
    assert writer is not None
    assert writer.closed
    steps = [e.step for e in summary_iterator(writer.path) if e.summary.value]
    assert steps == [1, 2, 3, 4]


@pytest.mark.anyio
async def test_a_writer_given_to_the_hook_is_flushed_but_never_closed(tmp_path: Path) -> None:
    writer = FileWriter(str(tmp_path / "logs"))
    hook = SummarySaverHook(save_steps=1, summary_writer=writer)
    async with MonitoredSession(TrainState(), hooks=[hook, StopAtStepHook(2)]) as session:
        while not session.should_stop():
            await session.run(lambda state: setattr(state, "global_step", state.global_step + 1))
    assert not writer.closed
    writer.close()


def test_the_error_listener_never_raises_into_a_closed_session() -> None:
    async def joined() -> Coordinator:
        coord = Coordinator()
        coord.request_stop()
        await coord.join()
        return coord

    coord = anyio.run(joined)
    error = SummaryWriteError("disk full", path="x")
    _stop_on_error(coord)(error)  # a joined coordinator would raise it here
    live = Coordinator()
    _stop_on_error(live)(error)
    assert live.should_stop()
    with pytest.raises(SummaryWriteError, match="disk full"):
        live.raise_requested_exception()
