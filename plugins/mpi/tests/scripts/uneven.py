"""Input that ends on one rank first, launched by the tests under ``mpiexec``.

``python uneven.py HOW OUT_DIR``: 20 batches sharded over 3 ranks with
``monitored.data.shard`` (7, 7 and 6 batches), read through
``monitored.data.prefetch`` (``HOW`` is ``feed``: the pipeline feeds the step;
or ``iterate``: ``async for`` over it); every step averages gradients with
``DistributedOptimizer``, a collective. Rank 2's input ends first; every rank
must stop after step 6, none may wait in a step rank 2 never runs. Writes
``OUT_DIR/rank<N>.json``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import anyio
import numpy as np

import monitored
import monitored_mpi
from monitored import data

HOW, OUT = sys.argv[1], Path(sys.argv[2])
logging.basicConfig(level=logging.INFO)  # the test reads who asked for the stop
RANK, SIZE = monitored_mpi.rank(), monitored_mpi.size()
NUM_BATCHES = int(os.environ.get("NUM_BATCHES", "20"))  # 2 on 3 ranks: rank 2 has none
BATCHES = data.shard([np.full(3, float(i)) for i in range(NUM_BATCHES)], SIZE, RANK)
opt = monitored_mpi.DistributedOptimizer(monitored.GradientDescentOptimizer(0.1))


def step(state: monitored.TrainState, batch: np.ndarray) -> None:
    opt.apply_gradients(state, {"w": state["w"] - batch})


async def main() -> None:
    state = monitored.TrainState({"w": np.zeros(3)})
    pipeline = data.prefetch(BATCHES, feed="batch" if HOW == "feed" else False)
    async with monitored.MonitoredSession(state, hooks=[pipeline]) as sess:
        if HOW == "feed":
            while not sess.should_stop():
                await sess.run(step)
        else:
            async for batch in pipeline:
                await sess.run(step, batch)
    # (An empty shard ends the session at the first run: OutOfRangeError, a normal end.)
    position = pipeline.plugin_state()["next"]
    result = {"step": state.global_step, "w": state["w"].tolist(), "next": position}
    (OUT / f"rank{RANK}.json").write_text(json.dumps(result))


anyio.run(main)
