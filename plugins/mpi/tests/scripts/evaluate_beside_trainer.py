"""A sharded evaluator under ``mpiexec`` following a live trainer's checkpoint directory.

``python evaluate_beside_trainer.py MODE CKPT_DIR OUT_DIR``, with the trainer
(``trainer`` mode, one plain process) saving a checkpoint every few milliseconds
into ``CKPT_DIR`` and keeping only its newest two, where every entry of ``w``
equals the global step. The evaluator ranks evaluate sharded batches of ones:

- ``once``: ``evaluate_once(checkpoint_dir=..., sharded=True)`` ``EVALUATIONS``
  times in a row, on a fresh state and on a template state in turn;
- ``repeatedly``: ``evaluate_repeatedly(..., sharded=True)`` until it has
  evaluated the trainer's last checkpoint (step :data:`FINAL_STEP`).

Each rank writes ``OUT_DIR/rank<N>.json``: for each evaluation, the checkpoint
path, global step and the merged mean (equal to the step when the ranks
evaluated the same state). The evaluator touches ``CKPT_DIR/../ready`` once up,
so that the trainer saves while the evaluations run.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import anyio
import numpy as np

import monitored
from monitored import data
from monitored import metrics as m
from monitored.evaluation import evaluate_once, evaluate_repeatedly

MODE, CKPT_DIR = sys.argv[1], sys.argv[2]
READY = os.path.join(os.path.dirname(CKPT_DIR), "ready")
#: The step of the trainer's last checkpoint.
FINAL_STEP = 1_000_000


def trainer(seconds: float) -> None:
    """Save a checkpoint of 1000 entries every step for ``seconds``, then one of FINAL_STEP."""
    from monitored_checkpoint import Saver

    deadline = time.monotonic() + 120
    while not os.path.exists(READY):
        if time.monotonic() > deadline:
            raise TimeoutError("the evaluator never started")
        time.sleep(0.01)
    saver = Saver(max_to_keep=2)
    state = monitored.TrainState({"w": np.zeros(1000)})
    end = time.monotonic() + seconds
    while state.global_step < FINAL_STEP:
        state.global_step = state.global_step + 1 if time.monotonic() < end else FINAL_STEP
        state["w"].fill(state.global_step)
        saver.save(state, os.path.join(CKPT_DIR, "model.ckpt"))


def eval_step(state: monitored.TrainState, batch: np.ndarray, metrics: dict) -> None:
    metrics["w"].update(state["w"][:4] * batch)


async def evaluator(out: Path) -> None:
    import monitored_mpi

    rank = monitored_mpi.rank()
    shard = data.shard([np.ones(4)] * 6, monitored_mpi.size(), rank)
    records: list[list[object]] = []
    if MODE == "once":
        for i in range(int(os.environ.get("EVALUATIONS", "20"))):
            # A fresh state (the chief's restore creates the arrays) or a template.
            state = monitored.TrainState({"w": np.zeros(1000)}) if i % 2 else None
            try:
                result = await evaluate_once(
                    eval_step,
                    {"w": m.Mean()},
                    input=shard,
                    checkpoint_dir=CKPT_DIR,
                    sharded=True,
                    state=state,
                )
            except monitored.evaluation.NoCheckpointError as exc:
                records.append(["none", str(exc)])
                continue
            records.append([result.checkpoint_path, result.global_step, result.metrics["w"]])
    else:
        results = await evaluate_repeatedly(
            CKPT_DIR,
            eval_step,
            {"w": m.Mean()},
            input_fn=lambda: shard,
            eval_interval_secs=0,
            poll_secs=0.01,
            timeout=60,
            until=lambda result: result.global_step == FINAL_STEP,
            sharded=True,
        )
        records = [[r.checkpoint_path, r.global_step, r.metrics["w"]] for r in results]
    (out / f"rank{rank}.json").write_text(json.dumps(records))


if MODE == "trainer":
    trainer(float(sys.argv[3]))
else:
    import monitored_mpi

    if monitored_mpi.rank() == 0:
        Path(READY).touch()
    anyio.run(evaluator, Path(sys.argv[3]))
