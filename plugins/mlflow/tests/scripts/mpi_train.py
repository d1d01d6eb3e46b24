"""Trains a few steps under ``mpiexec`` with ``MLFLOW_TRACKING_URI`` set for every rank.

``python mpi_train.py STEPS OUT_DIR``: writes ``OUT_DIR/rank<N>.json`` with the
rank's role and the plugins its session loaded.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import numpy as np

import monitored
import monitored_mpi

STEPS, OUT = int(sys.argv[1]), Path(sys.argv[2])


def step(state: monitored.TrainState) -> dict[str, object]:
    state.global_step += 1
    return {"loss": np.float32(1.0 / state.global_step)}


async def main() -> None:
    async with monitored.MonitoredTrainingSession(
        monitored.TrainState(),
        hooks=[monitored.StopAtStepHook(last_step=STEPS)],
        plugin_options={"mlflow": {"log_every_n_steps": 1}},
    ) as sess:
        while not sess.should_stop():
            await sess.run(step)
    rank = monitored_mpi.rank()
    (OUT / f"rank{rank}.json").write_text(
        json.dumps({"chief": sess.is_chief, "plugins": [i.name for i in sess.plugins]})
    )


anyio.run(main)
