"""A training process for the sender-process tests: logs to MLflow until it is stopped.

``python sender_train.py TRACKING_URI OUT_DIR [--fork] [--early]``: trains without end,
logging ``loss`` every 5 steps; once points reached MLflow it writes
``OUT_DIR/ready.json`` (the sender process's pid, the run's id, the step); with
``--early``, as soon as the sender process started. With ``--fork`` it first forks a process that sleeps holding the pipe to the sender
process open (as a data loader's forked workers do). When its session closes
(a Ctrl-C), it writes ``OUT_DIR/closed.json`` with the last step.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import anyio
import numpy as np

from monitored import MonitoredSession, TrainState
from monitored_mlflow import MlflowHook

URI, OUT = sys.argv[1], Path(sys.argv[2])
FORK = "--fork" in sys.argv[3:]
#: Ready as soon as the sender process started (still importing MLflow), not once
#: points reached MLflow.
EARLY = "--early" in sys.argv[3:]


def step(state: TrainState) -> dict[str, object]:
    state.global_step += 1
    return {"loss": np.float32(1.0 / state.global_step)}


def write(name: str, data: dict[str, object]) -> None:
    (OUT / f"{name}.tmp").write_text(json.dumps(data))
    os.replace(OUT / f"{name}.tmp", OUT / f"{name}.json")


def fork_a_sleeper() -> int:
    """A forked process that holds every inherited descriptor open for two minutes."""
    pid = os.fork()
    if pid == 0:
        time.sleep(120)
        os._exit(0)
    return pid


async def main(hook: MlflowHook, session: MonitoredSession) -> None:
    async with session:
        ready = False
        while True:
            await session.run(step)
            await anyio.sleep(0.002)
            sender = hook.sender
            started = sender is not None and sender.pid is not None
            if not ready and started and (EARLY or sender.sent > 0):
                assert sender is not None
                sleeper = fork_a_sleeper() if FORK else None
                write(
                    "ready",
                    {
                        "pid": sender.pid,
                        "run_id": sender.run_id,
                        "step": session.state.global_step,
                        "sleeper": sleeper,
                    },
                )
                ready = True


if __name__ == "__main__":
    # Ctrl-C raises KeyboardInterrupt, as in a script started from a terminal (a shell
    # without job control starts its background jobs with SIGINT ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    hook = MlflowHook(URI, log_every_n_steps=5, flush_secs=0.2)
    session = MonitoredSession(TrainState(), hooks=[hook], stop_grace_period_secs=60)
    try:
        anyio.run(main, hook, session)
    finally:
        write("closed", {"step": session.state.global_step})
