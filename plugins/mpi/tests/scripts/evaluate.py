"""A sharded evaluation under ``mpiexec``: each rank evaluates its own shard.

``python evaluate.py OUT_DIR``: ``NUM_BATCHES`` (default 12) batches sharded over
the ranks with ``monitored.data.shard`` (evenly or not); an
``EvaluationHook(sharded=True)`` inside training and a standalone
``evaluate_once(sharded=True)`` merge the metrics, so every rank reports the
results over the whole set. Writes ``OUT_DIR/rank<N>.json``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
import numpy as np

import monitored
import monitored_mpi
from monitored import data
from monitored import metrics as m
from monitored.evaluation import EvaluationHook, evaluate_once

OUT = Path(sys.argv[1])
RANK, SIZE = monitored_mpi.rank(), monitored_mpi.size()
NUM_BATCHES = int(os.environ.get("NUM_BATCHES", "12"))
BATCHES = [np.arange(4.0) + 4 * i for i in range(NUM_BATCHES)]
# 12 batches: the same number on 2 or 3 ranks; 13: shards of 7 and 6, or 5, 4 and 4.
SHARD = data.shard(BATCHES, SIZE, RANK)


def train_step(state: monitored.TrainState) -> None:
    state["w"] += 1.0
    state.global_step += 1


def eval_step(state: monitored.TrainState, batch: np.ndarray, metrics: dict) -> None:
    metrics["mean"].update(state["w"] * batch)
    metrics["count"].update(np.ones_like(batch), (batch % 2 == 0).astype(float))


def metrics() -> dict[str, m.Metric]:
    return {"mean": m.Mean(), "count": m.TruePositives()}


async def main() -> None:
    state = monitored.TrainState({"w": np.ones(1)})
    hook = EvaluationHook(
        eval_step, metrics(), input_fn=lambda: SHARD, every_n_steps=2, sharded=True
    )
    async with monitored.MonitoredSession(
        state, hooks=[hook, monitored.StopAtStepHook(last_step=3)]
    ) as sess:
        while not sess.should_stop():
            await sess.run(train_step)
    alone = await evaluate_once(eval_step, metrics(), input=SHARD, state=state, sharded=True)
    result = {
        "in_training": [(r.global_step, r.metrics) for r in hook.results],
        "alone": alone.metrics,
        "shard": len(SHARD),
        "steps": alone.steps,
    }
    (OUT / f"rank{RANK}.json").write_text(json.dumps(result))


anyio.run(main)
