"""A preemption signal while the step loop waits for a loader thread blocked in I/O.

Real processes and real signals: ``scripts/blocked_loader.py`` trains three
steps, then its loader thread blocks in ``open(2)`` or ``read(2)`` on a FIFO.
SIGTERM (or a first SIGINT) must end it with the checkpoint of step 3 and a
normal exit, the loader abandoned and named in a warning, no thread holding
the process up, whatever the session's grace period (600 s there).
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import numpy as np
import pytest

import monitored
import monitored_checkpoint as checkpoint
from monitored import data

SCRIPT = Path(__file__).with_name("scripts") / "blocked_loader.py"
#: Generous: the child imports NumPy and the library on a loaded machine.
START_TIMEOUT = 120.0
EXIT_TIMEOUT = 60.0
#: For the tests in this process: what hung before fails instead.
WAIT_TIMEOUT = 30.0


class Child:
    """The training process, its stdout read line by line in a thread."""

    def __init__(self, fifo: Path, directory: Path, consume: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(SCRIPT), str(fifo), str(directory), consume],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_for(self, *wanted: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        missing = set(wanted)
        while missing:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                seen, stderr = self.close()
                pytest.fail(f"the child never printed {sorted(missing)}: {seen}\n{stderr}")
            self.seen.append(line)
            missing.discard(line)

    def finish(self) -> tuple[int, list[str], str]:
        returncode = self.process.wait(EXIT_TIMEOUT)
        return returncode, *self.close()

    def close(self) -> tuple[list[str], str]:
        """Kill the child if it still runs; its output, pipes closed."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        assert self.process.stdout is not None
        assert self.process.stderr is not None
        stderr = self.process.stderr.read()
        self.reader.join(EXIT_TIMEOUT)
        self.process.stdout.close()
        self.process.stderr.close()
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        return self.seen, stderr


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "input.fifo"
    os.mkfifo(path)
    return path


@pytest.fixture
def writer_that_never_writes(fifo: Path) -> Iterator[int]:
    """A writer end held open (``O_RDWR`` does not wait for a reader on Linux):
    the loader's ``open`` returns and its ``read`` blocks."""
    fd = os.open(fifo, os.O_RDWR)
    yield fd
    os.close(fd)


def run_and_signal(
    fifo: Path, directory: Path, consume: str, sig: signal.Signals
) -> tuple[float, list[str], str]:
    child = Child(fifo, directory, consume)
    try:
        child.wait_for("step 3", "loading 3")
        time.sleep(0.3)  # the loop is now waiting for batch 3
        sent = time.monotonic()
        child.process.send_signal(sig)
        returncode, lines, stderr = child.finish()
        elapsed = time.monotonic() - sent
    finally:
        if child.process.returncode is None:
            child.close()
    assert returncode == 0, stderr
    assert f"closed, stopped by {sig.name}" in lines, (lines, stderr)
    return elapsed, lines, stderr


def check_outcome(directory: Path, lines: list[str], stderr: str, sig: signal.Signals) -> None:
    # The checkpoint of the last finished step, with the input's position after it.
    state = monitored.TrainState({"w": np.zeros(2, np.float32)})
    manifest = checkpoint.restore_latest(state, directory)
    assert manifest is not None
    assert manifest.step == 3
    assert manifest.plugins["input:fifo"]["state"]["next"] == 3
    np.testing.assert_array_equal(state["w"], [3.0, 3.0])  # batches 0 + 1 + 2
    # The loader is abandoned, by name, and no thread keeps the process alive.
    assert "monitored.data fifo worker 0 (making batch 3)" in stderr
    assert f"the session stopped on {sig.name}" in stderr
    assert "non-daemon threads: []" in lines
    assert "Traceback" not in stderr


@pytest.mark.parametrize(
    ("sig", "consume", "blocked_in"),
    [
        (signal.SIGTERM, "feed", "read"),
        (signal.SIGTERM, "async-for", "open"),
        (signal.SIGINT, "feed", "open"),
        (signal.SIGINT, "async-for", "read"),
    ],
)
def test_a_signal_while_the_loader_blocks_in_io_saves_the_last_step_and_exits(
    tmp_path: Path,
    fifo: Path,
    request: pytest.FixtureRequest,
    sig: signal.Signals,
    consume: str,
    blocked_in: str,
) -> None:
    if blocked_in == "read":
        request.getfixturevalue("writer_that_never_writes")
    directory = tmp_path / "run"
    elapsed, lines, stderr = run_and_signal(fifo, directory, consume, sig)
    check_outcome(directory, lines, stderr, sig)
    print(f"exit {elapsed:.2f}s after {sig.name} ({consume}, blocked in {blocked_in})")


@pytest.mark.parametrize("trial", range(3))
def test_sigterm_with_a_blocked_loader_is_the_same_every_time(
    tmp_path: Path, fifo: Path, writer_that_never_writes: int, trial: int
) -> None:
    directory = tmp_path / "run"
    elapsed, lines, stderr = run_and_signal(fifo, directory, "feed", signal.SIGTERM)
    check_outcome(directory, lines, stderr, signal.SIGTERM)
    print(f"trial {trial}: exit {elapsed:.2f}s after SIGTERM")


async def test_a_background_failure_while_the_loop_waits_for_a_batch_is_raised() -> None:
    """A coordinator's stop wakes a step loop waiting for its input: a background
    task's exception is raised at once, not after the loader returns."""
    release = threading.Event()

    def load(index: int) -> np.ndarray:
        if index >= 2:
            release.wait()  # a loader thread that does not return until the test ends
        return np.full(2, index, np.float32)

    def step(state: monitored.TrainState, batch: np.ndarray) -> dict[str, np.ndarray]:
        state.global_step += 1
        return {}

    async def fail_soon() -> None:
        await anyio.sleep(0.2)
        raise ValueError("the background task failed")

    state = monitored.TrainState({"w": np.zeros(2, np.float32)})
    pipeline = data.prefetch(load, name="slow", feed="batch", stop_grace_period_secs=0.5)
    try:
        with anyio.fail_after(WAIT_TIMEOUT), pytest.raises(ValueError, match="task failed"):
            async with monitored.MonitoredSession(state, hooks=[pipeline]) as sess:
                while not sess.should_stop():
                    await sess.run(step)
                    if sess.state.global_step == 2:
                        sess.coord.start_soon(fail_soon)
    finally:
        release.set()
    assert state.global_step == 2


async def test_a_stop_requested_while_the_loop_waits_ends_the_input_and_the_session_normally() -> (
    None
):
    """``coord.request_stop()`` from another thread while the step waits for a
    batch no loader will make soon: the input ends (``OutOfRangeError``, a
    normal end as in TF1), ``end`` runs, and the loader is joined once released."""
    release = threading.Event()
    ended: list[int] = []

    def load(index: int) -> np.ndarray:
        if index >= 1:
            release.wait()
        return np.full(2, index, np.float32)

    def step(state: monitored.TrainState, batch: np.ndarray) -> dict[str, np.ndarray]:
        state.global_step += 1
        return {}

    class EndHook:
        def end(self, session: monitored.MonitoredSession) -> None:
            ended.append(session.state.global_step)
            release.set()  # the loader returns: closing joins it

    state = monitored.TrainState({"w": np.zeros(2, np.float32)})
    pipeline = data.prefetch(load, name="slow", feed="batch")
    try:
        with anyio.fail_after(WAIT_TIMEOUT):
            async with monitored.MonitoredSession(state, hooks=[pipeline, EndHook()]) as sess:
                await sess.run(step)
                threading.Timer(0.2, sess.coord.request_stop).start()
                with pytest.raises(monitored.OutOfRangeError, match="batch 1 is still being made"):
                    await sess.run(step)
    finally:
        release.set()
    assert ended == [1]
