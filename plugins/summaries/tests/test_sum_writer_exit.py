"""At exit: a writer's thread never holds the interpreter up, and what was queued is written.

The writer's thread is a daemon thread; queued events are flushed at exit, and a
wait for a thread that has stopped making progress (a hung file system) ends
``EXIT_STALL_SECS`` after the interpreter started to exit, with an error that
says what was not written. A writer that is making progress is never cut off.
These tests run real processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from monitored_summaries import FileWriter, summary_iterator
from monitored_summaries import _writer as writer_module

#: A writer with three events on disk, then its thread stuck in the fourth write.
STALLED = """
import sys, threading
from tensorboardX.proto.summary_pb2 import Summary
from monitored_summaries import FileWriter

def summary(step):
    return Summary(value=[Summary.Value(tag="x", simple_value=float(step))])

writer = FileWriter(sys.argv[1], max_queue=100, flush_secs=1000)
for step in (1, 2, 3):
    writer.add_summary(summary(step), step)
writer.flush()
writer._events.write_event = lambda event: threading.Event().wait()  # a hung disk
for step in (4, 5, 6):
    writer.add_summary(summary(step), step)
print(writer.path, flush=True)
HOW
"""

#: How the program ends: main returns (the at-exit flush waits), or a non-daemon
#: thread (as anyio's worker thread, which the interpreter joins) closes the writer.
ENDINGS = {
    "main returns": "",
    "a worker thread closes it": "threading.Thread(target=writer.close).start()",
}


def run_python(source: str, *args: str, timeout: float = 60) -> tuple[Any, float]:
    started = time.monotonic()
    environment = dict(os.environ)
    environment.pop("MONITORED_DISABLE_PLUGIN_AUTOLOAD", None)
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(source), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environment,
        check=False,
    )
    return result, time.monotonic() - started


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_a_stalled_writer_thread_does_not_hang_the_exit(tmp_path: Path, ending: str) -> None:
    source = STALLED.replace("HOW", ENDINGS[ending])
    result, took = run_python(source, str(tmp_path / "logs"))
    assert took < 30, "the exit waited for the stalled thread"
    path = result.stdout.strip()
    assert "at exit: gave up after its writer's thread wrote nothing for" in result.stderr
    assert path in result.stderr, "the error names the event file"
    # What was flushed before the stall is on disk, whole.
    assert [e.step for e in summary_iterator(path)] == [0, 1, 2, 3]


def test_a_slow_writer_is_never_cut_off_at_exit(tmp_path: Path) -> None:
    # Each write takes longer than a tenth of the bound, all of them longer than it.
    source = """
    import sys, time
    from tensorboardX.proto.summary_pb2 import Summary
    from monitored_summaries import FileWriter, _writer

    _writer.EXIT_STALL_SECS = 0.4
    writer = FileWriter(sys.argv[1], max_queue=100, flush_secs=1000)
    write = writer._events.write_event
    def slow(event):
        time.sleep(0.1)
        write(event)
    writer._events.write_event = slow
    for step in range(1, 13):
        writer.add_summary(Summary(value=[Summary.Value(tag="x", simple_value=1.0)]), step)
    print(writer.path, flush=True)
    """
    result, _ = run_python(source, str(tmp_path / "logs"))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert [e.step for e in summary_iterator(result.stdout.strip())] == list(range(13))


def _writer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("summary-writer")]


@pytest.mark.parametrize("started", [True, False], ids=["after", "before"])
def test_a_keyboard_interrupt_while_the_thread_starts_leaves_no_writer_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, started: bool
) -> None:
    before = set(_writer_threads())
    start = threading.Thread.start

    def interrupted(thread: threading.Thread) -> None:
        if thread.name.startswith("summary-writer") and started:
            start(thread)
        if thread.name.startswith("summary-writer"):
            raise KeyboardInterrupt
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", interrupted)
    with pytest.raises(KeyboardInterrupt):
        FileWriter(tmp_path / "logs")
    monkeypatch.undo()
    deadline = time.monotonic() + 10
    while set(_writer_threads()) - before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not set(_writer_threads()) - before, "the writer's thread was left running"
    assert not [w for w in writer_module._LIVE if w.get_logdir() == str(tmp_path / "logs")]
    (event_file,) = (tmp_path / "logs").iterdir()
    assert [e.step for e in summary_iterator(str(event_file))] == [0], "a readable file"
