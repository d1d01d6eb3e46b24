"""``train_and_evaluate`` with checkpoints under ``mpiexec``: every rank evaluates.

``python train_and_evaluate.py MODEL_DIR OUT_DIR``: 6 steps, a checkpoint and an
evaluation every 2 steps. Only the chief writes checkpoints, so the evaluations
cannot follow them on the workers: every rank evaluates every 2 global steps.
Writes the evaluated steps and metrics of each rank to ``OUT_DIR/rank<N>.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import numpy as np

import monitored
import monitored_mpi
from monitored import metrics as m
from monitored.evaluation import EvalSpec, TrainSpec, train_and_evaluate

MODEL_DIR, OUT = sys.argv[1], Path(sys.argv[2])
RANK = monitored_mpi.rank()


class Heard:
    def __init__(self) -> None:
        self.evaluations: list[tuple[int, dict[str, float]]] = []

    def after_evaluate(self, session: object, step: int, metrics: dict[str, float]) -> None:
        self.evaluations.append((step, dict(metrics)))


def train_step(state: monitored.TrainState) -> None:
    state["w"] += 1.0
    state.global_step += 1


def eval_step(state: monitored.TrainState, batch: np.ndarray, metrics: dict) -> None:
    metrics["mean"].update(state["w"] * batch)


async def main() -> None:
    heard = Heard()
    state = monitored.TrainState({"w": np.ones(1)})
    result = await train_and_evaluate(
        TrainSpec(train_step, max_steps=6, hooks=[heard]),
        EvalSpec(eval_step, {"mean": m.Mean()}, input_fn=lambda: [np.ones(2)] * 3, throttle_secs=0),
        model_dir=MODEL_DIR,
        state=state,
        min_eval_frequency=2,
        save_checkpoint_steps=2,
    )
    out = {"heard": heard.evaluations, "final": [result.global_step, result.metrics]}
    (OUT / f"rank{RANK}.json").write_text(json.dumps(out))


anyio.run(main)
