"""A training whose loader thread blocks in I/O on a FIFO, for the signal tests.

``python blocked_loader.py FIFO CHECKPOINT_DIR feed|async-for``: batches 0-2
come from memory; batch 3 opens ``FIFO`` and reads 8 bytes from it, which
blocks in ``open(2)`` while nobody has the FIFO open for writing and in
``read(2)`` while a writer writes nothing. The session's grace period is long
(600 s): an exit soon after a signal shows that closing did not wait for the
blocked loader. Prints ``step N`` after each step, ``loading N`` before each
blocking call, and, once the event loop has ended, the non-daemon threads
still alive a few seconds later.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import anyio
import numpy as np

import monitored
import monitored_checkpoint as checkpoint
from monitored import data

FIFO, CHECKPOINT_DIR, CONSUME = sys.argv[1:4]


def say(line: str) -> None:
    """One line in one write (``print`` writes the newline apart: threads interleave)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def load(index: int) -> np.ndarray:
    if index < 3:
        return np.full(2, index, np.float32)
    say(f"loading {index}")
    with open(FIFO, "rb") as fifo:
        return np.frombuffer(fifo.read(8), np.float32)


def step(state: monitored.TrainState, batch: np.ndarray) -> dict[str, Any]:
    state["w"] = state["w"] + batch
    state.global_step += 1
    return {}


async def main() -> None:
    state = monitored.TrainState({"w": np.zeros(2, np.float32)})
    pipeline = data.prefetch(load, name="fifo", feed="batch" if CONSUME == "feed" else False)
    saver = checkpoint.CheckpointSaverHook(CHECKPOINT_DIR, save_steps=1000)
    async with monitored.MonitoredSession(
        state, hooks=[pipeline, saver], stop_grace_period_secs=600
    ) as sess:
        if CONSUME == "feed":
            while not sess.should_stop():
                await sess.run(step)
                say(f"step {sess.state.global_step}")
        else:
            async for batch in pipeline:
                await sess.run(step, batch)
                say(f"step {sess.state.global_step}")
    say(f"closed, stopped by {sess.stopped_by_signal}")


anyio.run(main)
for thread in threading.enumerate():
    if not thread.daemon and thread is not threading.main_thread():
        thread.join(5)  # anyio's idle workers end once told, which the loop's end does
alive = [t.name for t in threading.enumerate() if t.is_alive() and not t.daemon]
say(f"non-daemon threads: {[n for n in alive if n != 'MainThread']}")
