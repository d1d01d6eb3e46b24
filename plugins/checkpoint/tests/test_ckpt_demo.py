"""The digits demo (examples/demo.py), given a checkpoint_dir, resumes when run twice."""

from __future__ import annotations

import importlib.util
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from monitored_checkpoint import latest_checkpoint, read_manifest
from monitored_checkpoint._store import open_store

DEMO = Path(__file__).resolve().parents[3] / "examples" / "demo.py"


def _load_demo() -> Any:
    spec = importlib.util.spec_from_file_location("monitored_demo_for_checkpoints", DEMO)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.anyio
async def test_demo_resumes_from_its_checkpoint_when_run_twice(
    ckpt_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("sklearn")
    demo = _load_demo()
    caplog.set_level(logging.INFO, logger="monitored.checkpoint")
    await demo.train(300, 0, ckpt_dir)
    assert latest_checkpoint(ckpt_dir) == os.path.join(ckpt_dir, "model.ckpt-300")
    assert "No checkpoint in" in caplog.text
    caplog.clear()

    await demo.train(600, 0, ckpt_dir)
    assert f"Restored {os.path.join(ckpt_dir, 'model.ckpt-300')} (step 300)" in caplog.text
    assert latest_checkpoint(ckpt_dir) == os.path.join(ckpt_dir, "model.ckpt-600")
    manifest = read_manifest(open_store(ckpt_dir), "model.ckpt-600")
    assert manifest.step == 600
    rule = manifest.plugins["early_stopping:accuracy"]["state"]["rule"]
    # Held-out evaluations at 100, ..., 600, each in the checkpoint of its step:
    # the early-stopping hook's checks from the first run went through the resume.
    assert rule["index"] == 6
    assert rule["best"] > 0.5


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_the_demo_stopped_by_a_signal_saves_and_exits_as_interrupted(
    tmp_path: Path, signum: signal.Signals
) -> None:
    """Ctrl-C is not "finished": the exit status is 128 + the signal, after the save."""
    pytest.importorskip("sklearn")
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("MONITORED_DISABLE_PLUGIN_AUTOLOAD", None)
    command = [sys.executable, str(DEMO), "--steps", "1000000", "--no-mlflow"]
    child = subprocess.Popen(
        [*command, "--checkpoint-dir", str(run_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while latest_checkpoint(str(run_dir)) in (None, os.path.join(run_dir, "model.ckpt-0")):
            assert child.poll() is None, child.communicate()[0]
            assert time.monotonic() < deadline, "no periodic checkpoint within 120 s"
            time.sleep(0.05)
        child.send_signal(signum)
        out, _ = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 128 + signum, out
    [line] = [x for x in out.splitlines() if x.startswith("demo: stopped by")]
    step = int(line.rsplit(" ", 1)[1])
    assert line == f"demo: stopped by {signum.name} at step {step}"
    assert latest_checkpoint(str(run_dir)) == os.path.join(run_dir, f"model.ckpt-{step}")
