"""A second Ctrl-C during the preemption save always ends the process, promptly.

Real processes, real signals: each trial starts a child that trains a 16 MB
state with checkpoints, sends it SIGINT (the preemption save starts) and a
second SIGINT a random few milliseconds later, and requires the child to exit
within a few seconds, with the newest checkpoint restoring to exactly the
state of its step. Trials run several at a time beside busy processes, so the
second signal lands everywhere: in a step, in the event loop, in anyio's
worker-thread hand-off, in the library's own code.

The in-suite run takes about ``MONITORED_DOUBLE_SIGINT_SECS`` seconds (20 by
default); set it higher for a long run (``-s`` prints the counts and times).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from monitored import TrainState
from monitored_checkpoint import restore_latest

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGINT"), reason="POSIX signals")

#: How long the in-suite run lasts (seconds); the long run sets more.
SECONDS = float(os.environ.get("MONITORED_DOUBLE_SIGINT_SECS", "20"))
#: How long a child may take to exit after the second SIGINT.
EXIT_WITHIN_SECS = 10.0
#: The second SIGINT comes 0 to this many seconds after the first: while the
#: preemption save (snapshot and write of 16 MB) runs, or just before or after.
MAX_OFFSET_SECS = 0.03
PARALLEL = 4
BUSY = 2
N = 4 << 20  # float32 elements: a 16 MB state entry, so a save takes a while

CHILD = textwrap.dedent(
    f"""
    import sys, time
    import anyio, numpy as np
    from monitored import MonitoredSession, TrainState
    from monitored_checkpoint import CheckpointSaverHook

    def step(state):
        state["w"][:1024] += 1.0
        state["small"] += 1.0
        state.global_step += 1
        if state.global_step == 3:
            print("ready", flush=True)
        time.sleep(0.001)

    async def main():
        state = TrainState({{"w": np.zeros({N}, np.float32), "small": np.zeros(4)}})
        hook = CheckpointSaverHook(sys.argv[1], save_steps=5)
        async with MonitoredSession(state, hooks=[hook]) as sess:
            while not sess.should_stop():
                await sess.run(step)

    anyio.run(main)
    """
)


def _check_newest(directory: Path) -> int:
    """The newest checkpoint's step, after checking it holds exactly that step's state."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        state = TrainState()
        manifest = restore_latest(state, str(directory))
    assert manifest is not None, f"no checkpoint in {directory}"
    step = manifest.step
    assert state.global_step == step
    assert np.all(state["small"] == step), (step, state["small"])
    assert np.all(state["w"][:1024] == step)
    assert not state["w"][1024:].any()
    return step


def _trial(script: Path, directory: Path, seed: int) -> tuple[float, float, int]:
    """One child, two SIGINTs; (offset between them, exit time after the second, status)."""
    rng = random.Random(seed)
    child = subprocess.Popen(
        [sys.executable, "-u", str(script), str(directory)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.strip() == "ready", child.communicate()[1]
        time.sleep(rng.uniform(0, 0.02))
        child.send_signal(signal.SIGINT)
        offset = rng.uniform(0, MAX_OFFSET_SECS)
        time.sleep(offset)
        child.send_signal(signal.SIGINT)
        sent = time.monotonic()
        try:
            _, err = child.communicate(timeout=EXIT_WITHIN_SECS)
        except subprocess.TimeoutExpired:
            child.kill()
            _, err = child.communicate()
            raise AssertionError(
                f"trial {seed}: the child did not exit within {EXIT_WITHIN_SECS}s of a "
                f"second SIGINT sent {offset * 1000:.1f} ms after the first:\n{err}"
            ) from None
        took = time.monotonic() - sent
    finally:
        child.kill()
        child.wait()
    assert child.returncode in (0, 1, -signal.SIGINT), (
        f"trial {seed}: exit status {child.returncode}\n{err}"
    )
    if child.returncode != 0:
        assert "KeyboardInterrupt" in err, err
    _check_newest(directory)
    return offset, took, child.returncode


@pytest.mark.timeout(SECONDS + 300)
def test_second_ctrl_c_always_ends_the_process(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(BUSY)]
    trials: list[tuple[float, float, int]] = []
    deadline = time.monotonic() + SECONDS
    try:
        with ThreadPoolExecutor(PARALLEL) as pool:
            while time.monotonic() < deadline:
                seeds = range(len(trials), len(trials) + PARALLEL)
                runs = [pool.submit(_trial, script, tmp_path / f"run{i}", i) for i in seeds]
                trials += [run.result() for run in runs]
    finally:
        for process in busy:
            process.kill()
            process.wait()
    exits = sorted(t for _, t, _ in trials)
    aborted = sum(1 for *_, rc in trials if rc != 0)
    print(
        f"\n{len(trials)} trials, {aborted} aborted by the second SIGINT, "
        f"{len(trials) - aborted} stopped cleanly before it; exit after the second SIGINT: "
        f"median {exits[len(exits) // 2] * 1000:.0f} ms, max {exits[-1] * 1000:.0f} ms"
    )
    assert len(trials) >= PARALLEL
