"""A new user's training script with ``MLFLOW_TRACKING_URI`` naming a server that is not there.

``python unreachable_train.py OUT_FILE``: trains with the installed plugin (the
session's default grace period) until the plugin's first warning has come and
one more second, then closes; ``OUT_FILE`` gets the times (``time.monotonic``)
of the first warning, the end of training and the end of the close, and the
step. The plugin's log lines go to stderr.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import anyio
import numpy as np

from monitored import MonitoredTrainingSession, TrainState

OUT = sys.argv[1]
#: Training gives up waiting for the first warning after this many seconds.
MAX_SECS = 60.0


class FirstWarning(logging.Handler):
    """Keeps the time of the first warning it sees."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.at: float | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.at is None:
            self.at = time.monotonic()


def step(state: TrainState) -> dict[str, object]:
    state.global_step += 1
    return {"loss": np.float32(1.0 / state.global_step)}


async def main() -> dict[str, object]:
    first = FirstWarning()
    logging.getLogger("monitored.mlflow").addHandler(first)
    started = time.monotonic()
    session = MonitoredTrainingSession(
        TrainState(), plugin_options={"mlflow": {"log_every_n_steps": 1}}
    )
    async with session:
        while first.at is None or time.monotonic() < first.at + 1:
            if time.monotonic() - started > MAX_SECS:
                break
            await session.run(step)
            await anyio.sleep(0.01)
        trained = time.monotonic()
    closed = time.monotonic()
    return {
        "first_warning": first.at,
        "trained": trained,
        "closed": closed,
        "step": session.state.global_step,
    }


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    Path(OUT).write_text(json.dumps(anyio.run(main)))
