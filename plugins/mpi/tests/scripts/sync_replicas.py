"""TF's ``mnist_replica.py`` shape under ``mpiexec``: ``SyncReplicasOptimizer`` and its hook.

``python sync_replicas.py REPLICAS OUT_DIR``: each rank descends a linear
model on its own shard with ``SyncReplicasOptimizer(opt,
replicas_to_aggregate=REPLICAS)`` and ``opt.make_session_run_hook(is_chief)``
among the session's hooks, as TF's script did, and writes its final weights
(or the error it got) to ``OUT_DIR/rank<N>.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import numpy as np

import monitored
import monitored_mpi

REPLICAS, OUT = int(sys.argv[1]), Path(sys.argv[2])
RANK = monitored_mpi.rank()


async def main() -> dict[str, object]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 3))
    y = x @ np.array([1.0, -2.0, 0.5])
    shard = slice(RANK * 32, (RANK + 1) * 32)
    opt = monitored_mpi.SyncReplicasOptimizer(
        monitored.GradientDescentOptimizer(0.1), replicas_to_aggregate=REPLICAS
    )
    state = monitored.TrainState({"w": np.zeros(3)})

    def step(state: monitored.TrainState) -> None:
        error = x[shard] @ state["w"] - y[shard]
        opt.apply_gradients(state, {"w": x[shard].T @ error / 32})

    async with monitored.MonitoredTrainingSession(
        state,
        is_chief=RANK == 0,
        hooks=[opt.make_session_run_hook(RANK == 0), monitored.StopAtStepHook(last_step=20)],
    ) as sess:
        while not sess.should_stop():
            await sess.run(step)
    # What a single process descending the whole set (the average of both shards) gives.
    w = np.zeros(3)
    for _ in range(20):
        w -= 0.1 * sum(x[s].T @ (x[s] @ w - y[s]) / 32 for s in (slice(0, 32), slice(32, 64))) / 2
    return {"w": state["w"].tolist(), "step": state.global_step, "whole": w.tolist()}


try:
    result = anyio.run(main)
except monitored.UnsupportedArgumentError as exc:
    result = {"error": str(exc)}
(OUT / f"rank{RANK}.json").write_text(json.dumps(result))
