"""Against a real ``mlflow server`` (SQLite backend) on 127.0.0.1: logging, and the server going away."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from mlflow import MlflowClient

from monitored import MonitoredSession, StopAtStepHook, TrainState
from monitored_mlflow import MlflowHook

SCRIPT = Path(__file__).parent / "scripts" / "unreachable_train.py"


def step(state: TrainState) -> dict[str, Any]:
    state.global_step += 1
    return {"loss": np.float32(1.0 / state.global_step)}


async def test_a_run_logged_to_a_real_server_reads_back(
    mlflow_server: Callable[[], Any],
) -> None:
    server = mlflow_server()
    hook = MlflowHook(server.uri, experiment="served", log_every_n_steps=5, params={"lr": 0.1})
    async with MonitoredSession(TrainState(), hooks=[hook, StopAtStepHook(last_step=20)]) as sess:
        while not sess.should_stop():
            await sess.run(step)
            await sess.report_evaluation(sess.state.global_step, {"accuracy": 0.5}) if (
                sess.state.global_step == 10
            ) else None
    client = MlflowClient(server.uri)
    run = client.get_run(hook.run_id)  # type: ignore[arg-type]
    assert run.info.status == "FINISHED"
    assert run.data.params["lr"] == "0.1"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [5, 10, 15, 20]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "eval/accuracy")] == [10]


async def test_a_server_stopped_mid_run_leaves_training_unaffected_and_warns(
    mlflow_server: Callable[[], Any], caplog: Any
) -> None:
    caplog.set_level(logging.WARNING, "monitored.mlflow")
    server = mlflow_server()
    hook = MlflowHook(
        server.uri, experiment="down", log_every_n_steps=1, retries=1, backoff_secs=0.05
    )
    step_times: list[float] = []
    async with MonitoredSession(
        TrainState(), hooks=[hook, StopAtStepHook(last_step=400)], stop_grace_period_secs=5
    ) as sess:
        while not sess.should_stop():
            started = time.perf_counter()
            await sess.run(step)
            step_times.append(time.perf_counter() - started)
            if sess.state.global_step == 100:
                # Wait until the run exists and the first points arrived, then stop it.
                for _ in range(2400):
                    if hook.sender is not None and hook.sender.sent > 0:
                        break
                    await anyio.sleep(0.05)
                else:
                    pytest.fail("the first points never reached the server")
                server.stop()
            if sess.state.global_step > 100:
                await anyio.sleep(0.001)  # a training step's worth of time
    assert sess.state.global_step == 400, "training went on to its last step"
    assert hook.sender is not None
    assert hook.sender.dropped > 0, "what could not be sent is counted"
    messages = [r.getMessage() for r in caplog.records if r.name == "monitored.mlflow"]
    assert any("could not log a batch" in m and "dropped" in m for m in messages), messages
    # The step loop never waited for the server: no step after the stop took long.
    assert max(step_times[101:]) < 1.0, max(step_times[101:])


async def test_a_server_that_is_never_there_costs_training_nothing(
    nobody_listening: str, caplog: Any
) -> None:
    caplog.set_level(logging.WARNING, "monitored.mlflow")
    hook = MlflowHook(nobody_listening, log_every_n_steps=1, retries=1, backoff_secs=0.05)
    started = time.perf_counter()
    # The grace period covers the sender process's start (it imports MLflow); a
    # refused connection fails at once, so the close does not wait for it.
    async with MonitoredSession(
        TrainState(), hooks=[hook, StopAtStepHook(last_step=50)], stop_grace_period_secs=30
    ) as sess:
        while not sess.should_stop():
            await sess.run(step)
    assert sess.state.global_step == 50
    assert time.perf_counter() - started < 60
    assert hook.sender is not None
    assert hook.sender.run_id is None
    assert hook.sender.dropped >= 50, "every point, counted"
    messages = [r.getMessage() for r in caplog.records if r.name == "monitored.mlflow"]
    assert any("could not create the MLflow run" in m for m in messages), messages


def test_a_script_logging_to_nobody_warns_early_and_closes_without_the_grace_period(
    nobody_listening: str, tmp_path: Path
) -> None:
    # As a new user runs it: MLflow's HTTP settings left to the plugin, the
    # session's default grace period (120 s).
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_HTTP_")}
    env["MLFLOW_TRACKING_URI"] = nobody_listening
    out = tmp_path / "times.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(out)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    times = json.loads(out.read_text())
    log = done.stderr
    assert times["first_warning"] is not None, log[-3000:]
    assert times["first_warning"] < times["trained"], "warned while training went on"
    assert re.search(
        rf"tracking server {re.escape(nobody_listening)} does not answer .*training goes on", log
    ), log[-3000:]
    assert times["closed"] - times["trained"] <= 15, (times, log[-3000:])
    dropped = re.search(r"never created on \S+: (\d+) items dropped in all", log)
    assert dropped is not None, log[-3000:]
    assert int(dropped.group(1)) >= times["step"], "every point, counted"
    assert "Retrying" not in log, "MLflow's own retries are off unless the user sets them"
