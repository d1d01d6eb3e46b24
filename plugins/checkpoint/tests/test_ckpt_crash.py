"""Crash safety: SIGKILL a real training process mid-save, again and again.

Each round starts a child that resumes from the directory and saves a 16 MB
state at every step (so it is nearly always in the middle of a write), lets it
train a few steps (counted from its output, so a slow machine only makes the
test slower), kills it with SIGKILL after a random delay, then checks that the
newest surviving checkpoint restores without a warning and holds exactly the
state an uninterrupted run has at that step.
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
from pathlib import Path
from typing import Any

import pytest

from monitored import TrainState
from monitored_checkpoint import latest_checkpoint, restore_latest

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="POSIX signals")

ROUNDS = 20
N = 4 << 20  # float32 elements: a 16 MB state entry

MODEL = textwrap.dedent(
    f"""
    import numpy as np

    N = {N}

    def init(state):
        state["big"] = np.random.default_rng(0).random(N, dtype=np.float32)
        state["small"] = np.zeros(16)

    def step(state):
        i = (state.global_step * 4099) % (N - 1024)
        state["big"][i : i + 1024] += state.rng.standard_normal(1024, dtype=np.float32)
        state["small"] += state.rng.random(16)
        state.global_step += 1
    """
)

CHILD = MODEL + textwrap.dedent(
    """
    import sys
    import anyio
    from monitored import MonitoredSession, Scaffold, TrainState
    from monitored_checkpoint import CheckpointSaverHook, Saver

    async def main():
        state = TrainState(seed=7)
        hook = CheckpointSaverHook(
            sys.argv[1], save_steps=1, saver=Saver(max_to_keep=2), handle_signals=False
        )
        async with MonitoredSession(state, hooks=[hook], scaffold=Scaffold(init_fn=init)) as s:
            print("started", state.global_step, flush=True)
            while True:
                await s.run(step)
                print("step", state.global_step, flush=True)

    anyio.run(main)
    """
)


class Replay:
    """The uninterrupted run, advanced step by step to compare with."""

    def __init__(self) -> None:
        namespace: dict[str, Any] = {}
        exec(MODEL, namespace)
        self._step = namespace["step"]
        self.state = TrainState(seed=7)
        namespace["init"](self.state)

    def advance_to(self, step: int) -> TrainState:
        assert step >= self.state.global_step
        while self.state.global_step < step:
            self._step(self.state)
        return self.state


def test_sigkill_mid_save_never_loses_the_newest_checkpoint(tmp_path: Path) -> None:
    directory = str(tmp_path / "ckpt")
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    replay = Replay()
    rng = random.Random(1234)
    newest = -1
    killed_mid_write = 0
    for _ in range(ROUNDS):
        child = subprocess.Popen(
            [sys.executable, "-u", str(script), directory],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None
            started = child.stdout.readline()
            assert started.startswith("started"), child.communicate()[1]
            first = int(started.split()[1])
            assert first == max(newest, 0), "resumed from the newest"
            # A step's save waits for the previous write: once step s is reported,
            # checkpoint s - 1 is durable, so every round moves the newest on by >= 2.
            target = first + rng.randint(3, 6)
            for line in child.stdout:
                if int(line.split()[1]) >= target:
                    break
            time.sleep(rng.uniform(0.0, 0.05))
        finally:
            child.send_signal(signal.SIGKILL)
            child.communicate()
        assert child.returncode == -signal.SIGKILL
        killed_mid_write += any(".tmp-" in name for name in os.listdir(directory))

        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a crash must not leave a damaged checkpoint
            restored = TrainState(seed=99)
            manifest = restore_latest(restored, directory)
        if manifest is None:
            assert newest == -1, "only a kill before the very first save leaves nothing"
            continue
        assert manifest.step >= newest, "the newest checkpoint survived"
        assert latest_checkpoint(directory) == manifest.path
        newest = manifest.step
        expected = replay.advance_to(newest)
        assert restored.global_step == newest
        for name in expected:
            assert restored[name].tobytes() == expected[name].tobytes(), (name, newest)
        assert restored.rng_state == expected.rng_state
    print(f"{ROUNDS} kills, {killed_mid_write} in the middle of a write, last step {newest}")
    assert newest >= 2 * ROUNDS, "training made progress across the kills"
    assert killed_mid_write >= ROUNDS // 4, f"only {killed_mid_write} kills hit a write"
