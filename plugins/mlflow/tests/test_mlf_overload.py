"""A store slower than the training: the run exists from the start and gets the whole curve.

A real SQLite store and a real sender process; the queue is made small
(``max_pending``) so that a few thousand steps with ten scalars each outpace
what the store takes, as 200 000 steps do with the default.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
from mlflow import MlflowClient

from monitored import MonitoredSession, StopAtStepHook, TrainState
from monitored_mlflow import MlflowHook

pytestmark = pytest.mark.anyio

STEPS = 4000
KEYS = [f"m{i}" for i in range(9)]


def step(state: TrainState) -> dict[str, Any]:
    state.global_step += 1
    outputs: dict[str, Any] = {"loss": np.float32(1.0 / state.global_step)}
    outputs.update({key: np.float32(i) for i, key in enumerate(KEYS)})
    return outputs


async def test_an_overloaded_store_gets_a_thinned_curve_of_the_whole_run_said_and_counted(
    tracking_uri: str, caplog: Any
) -> None:
    caplog.set_level(logging.WARNING, "monitored.mlflow")
    hook = MlflowHook(tracking_uri, log_every_n_steps=1, max_pending=200, flush_secs=0.05)
    client = MlflowClient(tracking_uri)
    async with MonitoredSession(
        TrainState(), hooks=[hook, StopAtStepHook(last_step=STEPS)], stop_grace_period_secs=60
    ) as sess:
        # The run exists before the first step.
        assert hook.run_id is not None
        assert client.get_run(hook.run_id).info.status == "RUNNING"
        while not sess.should_stop():
            await sess.run(step)
    sender = hook.sender
    assert sender is not None
    run = client.get_run(hook.run_id)
    assert run.info.status == "FINISHED", "ended, not left RUNNING"
    history = client.get_metric_history(hook.run_id, "loss")
    steps = sorted(m.step for m in history)
    stored = sum(len(client.get_metric_history(hook.run_id, k)) for k in ["loss", *KEYS])
    # Every point is either in the store or counted as dropped; some were dropped.
    assert sender.sent == stored
    assert sender.sent + sender.dropped == STEPS * (1 + len(KEYS))
    assert sender.dropped > 0
    # Never everything, never a gap: the curve covers each tenth of the run, and the
    # last step is there.
    assert steps[-1] == STEPS
    for tenth in range(10):
        low, high = tenth * STEPS // 10, (tenth + 1) * STEPS // 10
        assert any(low < s <= high for s in steps), (tenth, steps[:50])
    said = [r.getMessage() for r in caplog.records if "takes fewer points" in r.getMessage()]
    assert said, "the thinning is warned about"
    assert "max_pending=200" in said[0]
    messages = [r.getMessage() for r in caplog.records if r.name == "monitored.mlflow"]
    assert any(f"{sender.dropped} items" in m for m in messages), (sender.dropped, messages)
