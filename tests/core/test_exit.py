"""Interpreter exit: anyio worker threads of a loop a KeyboardInterrupt closed never hold it up."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from monitored._core import _exit

#: A KeyboardInterrupt escapes the loop (a first Ctrl-C), and another escapes while
#: ``anyio.run`` cancels the remaining tasks (a second one landing in a task): the
#: loop is closed before the done callback that stops the idle worker thread runs.
CHILD = textwrap.dedent(
    """
    import asyncio, sys
    import anyio
    if sys.argv[1] == "monitored":
        import monitored

    def first():
        raise KeyboardInterrupt("first")

    async def main():
        await anyio.to_thread.run_sync(lambda: None)  # one idle worker thread
        asyncio.get_running_loop().call_later(0.05, first)
        try:
            await anyio.sleep(30)
        finally:
            raise KeyboardInterrupt("while the runner cancels the tasks")

    anyio.run(main)
    """
)


def _run(tmp_path: Path, imports: str, timeout: float) -> tuple[int | None, float]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    started = time.monotonic()
    child = subprocess.Popen(
        [sys.executable, str(script), imports], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        return None, time.monotonic() - started
    return child.returncode, time.monotonic() - started


@pytest.mark.parametrize("trial", range(3))
def test_a_keyboard_interrupt_during_the_runners_clean_up_does_not_hang_the_exit(
    tmp_path: Path, trial: int
) -> None:
    returncode, took = _run(tmp_path, "monitored", timeout=30)
    assert returncode is not None, "the interpreter waited for anyio's idle worker thread"
    assert returncode != 0
    assert took < 15


def test_without_the_hook_the_same_program_hangs(tmp_path: Path) -> None:
    # What the hook is for: the program above, without monitored, never exits.
    returncode, _ = _run(tmp_path, "anyio-only", timeout=5)
    assert returncode is None


async def test_workers_of_a_running_loop_are_left_alone() -> None:
    await anyio.to_thread.run_sync(lambda: None)
    mine = [t for t in threading.enumerate() if type(t).__name__ == "WorkerThread"]
    assert mine, "anyio started a worker thread"
    assert _exit.stop_orphaned_workers() == 0
    assert await anyio.to_thread.run_sync(lambda: 42) == 42
    assert all(t.is_alive() for t in mine)


def test_workers_of_a_closed_loop_are_stopped() -> None:
    async def orphan_one() -> Any:
        await anyio.to_thread.run_sync(lambda: None)
        worker: Any = next(t for t in threading.enumerate() if type(t).__name__ == "WorkerThread")
        worker.root_task.remove_done_callback(worker.stop)  # as if the loop never ran it
        return worker

    loop = asyncio.new_event_loop()
    try:
        worker = loop.run_until_complete(orphan_one())
    finally:
        loop.close()
    time.sleep(0.1)
    assert worker.is_alive(), "nothing stops it but the hook"
    assert _exit.stop_orphaned_workers() == 1
    worker.join(5)
    assert not worker.is_alive()


def test_install_registers_once() -> None:
    _exit.install()
    _exit.install()
    registered: Any = threading._threading_atexits  # type: ignore[attr-defined]
    hooks = [f for f in registered if getattr(f, "func", f) is _exit.stop_orphaned_workers]
    assert len(hooks) == 1
