"""The sender process, with real processes and real signals: killed, stopped, interrupted,
orphaned, or unable to start, training goes on and says what was lost."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from mlflow import MlflowClient

from monitored import MonitoredSession, StopAtStepHook, TrainState
from monitored_mlflow import MlflowHook
from monitored_mlflow._writer import ORPHAN_SECS, PARENT_CHECK_SECS

SCRIPT = Path(__file__).parent / "scripts" / "sender_train.py"


def step(state: TrainState) -> dict[str, Any]:
    state.global_step += 1
    return {"loss": np.float32(1.0 / state.global_step), "lr": 0.1}


def warnings_of(caplog: Any) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "monitored.mlflow" and r.levelno == logging.WARNING
    ]


def gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (a zombie no init reaped counts as exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def wait_gone(pid: int, within: float) -> float:
    """Seconds until ``pid`` exited; fails the test after ``within``."""
    started = time.monotonic()
    while not gone(pid):
        if time.monotonic() - started > within:
            pytest.fail(f"process {pid} still there after {within} s")
        time.sleep(0.05)
    return time.monotonic() - started


async def test_a_killed_sender_process_leaves_training_going_with_one_warning_and_a_count(
    tracking_uri: str, caplog: Any
) -> None:
    caplog.set_level(logging.WARNING, "monitored.mlflow")
    hook = MlflowHook(tracking_uri, log_every_n_steps=1, flush_secs=0.05)
    async with MonitoredSession(
        TrainState(), hooks=[hook, StopAtStepHook(last_step=300)], stop_grace_period_secs=30
    ) as sess:
        while not sess.should_stop():
            await sess.run(step)
            sender = hook.sender
            assert sender is not None
            if sess.state.global_step == 100:
                for _ in range(1200):  # the run exists and the first points are in
                    if sender.sent > 0:
                        break
                    await anyio.sleep(0.05)
                assert sender.pid is not None
                os.kill(sender.pid, signal.SIGKILL)
                wait_gone(sender.pid, 10)
                await anyio.sleep(0.5)  # the reader thread sees the end
    assert sess.state.global_step == 300, "training went on to its last step"
    sender = hook.sender
    assert sender is not None
    assert sender._process is not None
    assert sender._process.returncode == -signal.SIGKILL, "reaped: no zombie left"
    died = [m for m in warnings_of(caplog) if "sender process" in m and "was killed" in m]
    assert len(died) == 1, warnings_of(caplog)
    assert died[0].startswith("monitored-mlflow: the sender process (pid ")
    assert "SIGKILL" in died[0]
    assert "training goes on" in died[0]
    # Steps 101..300 were queued after the death: 2 points each, none sent.
    assert sender.dropped >= 400
    logged = MlflowClient(tracking_uri).get_metric_history(sender.run_id, "loss")  # type: ignore[arg-type]
    assert sender.sent // 2 >= len(logged) > 0, "what was sent before the kill is there"
    assert sender.sent + sender.dropped >= 600, "every point sent or counted as dropped"
    [tally] = [m for m in warnings_of(caplog) if "is not ended" in m]
    assert f"{sender.dropped} items dropped in all" in tally
    run = MlflowClient(tracking_uri).get_run(sender.run_id)  # type: ignore[arg-type]
    assert run.info.status == "RUNNING", "nobody was left to end it"


async def test_a_sender_process_that_does_not_answer_is_stopped_after_the_grace_period(
    tracking_uri: str, caplog: Any
) -> None:
    caplog.set_level(logging.WARNING, "monitored.mlflow")
    hook = MlflowHook(tracking_uri, log_every_n_steps=1, flush_secs=0.05)
    sender = None
    async with MonitoredSession(
        TrainState(), hooks=[hook, StopAtStepHook(last_step=200)], stop_grace_period_secs=1
    ) as sess:
        while not sess.should_stop():
            await sess.run(step)
            sender = hook.sender
            assert sender is not None
            if sess.state.global_step == 50:
                for _ in range(1200):
                    if sender.sent > 0:
                        break
                    await anyio.sleep(0.05)
                assert sender.pid is not None
                os.kill(sender.pid, signal.SIGSTOP)  # alive, but answers nothing
        started = time.monotonic()
    closed_in = time.monotonic() - started
    assert sender is not None
    assert sess.state.global_step == 200
    assert closed_in < 1 + 2 * 2 + 3, "the grace period, then the margin to stop it"
    assert sender.pid is not None
    wait_gone(sender.pid, 10)
    [stopped] = [m for m in warnings_of(caplog) if "did not finish" in m]
    assert "grace period (1s) and was stopped" in stopped
    assert sender.dropped > 0
    assert f"{sender.dropped} items dropped in all" in stopped
    assert not [m for m in warnings_of(caplog) if "before the run was closed" in m], (
        "a process stopped at the close is no surprise death"
    )


async def test_a_sender_process_that_cannot_import_mlflow_warns_naming_the_plugin(
    tracking_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    caplog.set_level(logging.WARNING, "monitored.mlflow")
    broken = tmp_path / "broken" / "mlflow"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('this MLflow is broken')\n")
    # Only the sender process starts with it: this process imported MLflow already.
    monkeypatch.setenv("PYTHONPATH", str(broken.parent))
    hook = MlflowHook(tracking_uri, log_every_n_steps=1, flush_secs=0.05)
    async with MonitoredSession(
        TrainState(), hooks=[hook, StopAtStepHook(last_step=50)], stop_grace_period_secs=30
    ) as sess:
        while not sess.should_stop():
            await sess.run(step)
    assert sess.state.global_step == 50
    messages = warnings_of(caplog)
    [stopped] = [m for m in messages if "could not import MLflow" in m]
    assert stopped.startswith("monitored-mlflow: the sender stopped: ImportError:")
    assert "this MLflow is broken" in stopped
    assert sys.executable in stopped
    sender = hook.sender
    assert sender is not None
    assert sender.run_id is None
    assert sender.dropped >= 100, "every point, counted"
    [tally] = [m for m in messages if "the run was not ended" in m]
    assert f"{sender.dropped} in all" in tally
    assert sender._process is not None
    assert sender._process.returncode == 0, "it exited when the session closed"


async def test_a_sender_process_that_cannot_start_warns_naming_the_plugin(
    tracking_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    caplog.set_level(logging.WARNING, "monitored.mlflow")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-such-python"))
    hook = MlflowHook(tracking_uri, log_every_n_steps=1)
    async with MonitoredSession(
        TrainState(), hooks=[hook, StopAtStepHook(last_step=20)], stop_grace_period_secs=5
    ) as sess:
        while not sess.should_stop():
            await sess.run(step)
    assert sess.state.global_step == 20
    messages = warnings_of(caplog)
    [failed] = [m for m in messages if "could not start the sender process" in m]
    assert failed.startswith("monitored-mlflow: ")
    assert "no-such-python" in failed
    assert "training goes on" in failed
    sender = hook.sender
    assert sender is not None
    assert sender.pid is None
    assert sender.dropped >= 40, "every point, counted"
    [tally] = [m for m in messages if "is not ended" in m]
    assert f"{sender.dropped} items dropped in all" in tally


def start_training(uri: str, out: Path, *extra: str) -> subprocess.Popen[bytes]:
    """The training script in a process group of its own (as a shell job is); its
    output goes to ``out/output.txt``."""
    out.mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONWARNINGS": "ignore::DeprecationWarning"}
    with open(out / "output.txt", "wb") as output:
        return subprocess.Popen(
            [sys.executable, str(SCRIPT), uri, str(out), *extra],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_ready(process: subprocess.Popen[bytes], out: Path) -> dict[str, Any]:
    deadline = time.monotonic() + 240
    while not (out / "ready.json").exists():
        if process.poll() is not None:
            pytest.fail(f"the training exited: {(out / 'output.txt').read_text()[-3000:]}")
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail("the training never got points to MLflow")
        time.sleep(0.05)
    ready: dict[str, Any] = json.loads((out / "ready.json").read_text())
    return ready


@pytest.mark.parametrize("early", [False, True], ids=["sending", "while-it-imports-mlflow"])
def test_ctrl_c_reaching_the_sender_process_too_ends_the_run_killed_with_every_point(
    tracking_uri: str, tmp_path: Path, early: bool
) -> None:
    out = tmp_path / "out"
    process = start_training(tracking_uri, out, *(["--early"] if early else []))
    try:
        ready = wait_ready(process, out)
        time.sleep(0.05 if early else 0.5)
        # A Ctrl-C goes to the terminal's foreground process group (the sender process
        # has a group of its own); a batch system signals every process of a job.
        os.killpg(process.pid, signal.SIGINT)
        os.kill(ready["pid"], signal.SIGINT)
        os.kill(ready["pid"], signal.SIGTERM)
        process.wait(120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = (out / "output.txt").read_text()
    assert process.returncode != 0, output[-3000:]
    assert "KeyboardInterrupt" in output
    closed = json.loads((out / "closed.json").read_text())
    wait_gone(ready["pid"], 10)
    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name("monitored")
    assert experiment is not None, output[-3000:]
    [run] = client.search_runs([experiment.experiment_id])
    if not early:
        assert run.info.run_id == ready["run_id"]
    assert run.info.status == "KILLED", output[-3000:]
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "loss")]
    assert steps == list(range(5, closed["step"] + 1, 5)), "every due step, flushed at the close"
    assert "dropped" not in output, output[-3000:]


@pytest.mark.parametrize("fork", [False, True], ids=["pipe-closes", "pipe-held-by-a-fork"])
def test_a_sigkilled_training_process_leaves_no_sender_process_behind(
    tracking_uri: str, tmp_path: Path, fork: bool
) -> None:
    out = tmp_path / "out"
    process = start_training(tracking_uri, out, *(["--fork"] if fork else []))
    ready: dict[str, Any] = {}
    try:
        ready = wait_ready(process, out)
        time.sleep(0.5)
        process.kill()
        process.wait()
        # The pipe's end (or, while a fork holds it open, the parent's change) is seen
        # within a check; then what is pending gets ORPHAN_SECS at most.
        took = wait_gone(ready["pid"], PARENT_CHECK_SECS + ORPHAN_SECS + 10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if ready.get("sleeper"):
            os.kill(ready["sleeper"], signal.SIGKILL)
    assert not (out / "closed.json").exists(), "killed: no close"
    assert took < PARENT_CHECK_SECS + ORPHAN_SECS + 10
    client = MlflowClient(tracking_uri)
    run = client.get_run(ready["run_id"])
    assert run.info.status == "KILLED", "ended by the orphaned sender process"
    steps = [m.step for m in client.get_metric_history(ready["run_id"], "loss")]
    assert steps[: ready["step"] // 5] == list(range(5, ready["step"] + 1, 5))
    assert steps == list(range(5, steps[-1] + 1, 5)), "what reached it is sent, in order"
