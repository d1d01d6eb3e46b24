"""Crash and restart: a Supervisor's training process killed with SIGKILL resumes.

A child process trains under a ``Supervisor`` that checkpoints often; once it
has written a few checkpoints it is killed with SIGKILL mid-run. A restart (a
new ``Supervisor`` over a fresh state) then resumes from the newest checkpoint,
does not run ``init_fn`` again, and finishes with exactly the state an
uninterrupted run has.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import monitored
from monitored import Supervisor
from monitored_checkpoint import latest_checkpoint, read_checkpoint

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="POSIX signals")

MODEL = textwrap.dedent(
    """
    import numpy as np

    def init(state):
        state["w"] = np.random.default_rng(3).random(64)
        state["marker"] = np.ones(1)

    def step(state):
        state["w"] += state.rng.standard_normal(64) * 0.01
        state.global_step += 1
        return {"loss": float((state["w"] ** 2).sum())}
    """
)

CHILD = MODEL + textwrap.dedent(
    """
    import sys
    import anyio
    from monitored import Supervisor, TrainState

    async def main():
        state = TrainState(seed=11)
        sv = Supervisor(state, logdir=sys.argv[1], init_fn=init, save_model_secs=0.005)
        async with sv.managed_session() as sess:
            print("started", state.global_step, flush=True)
            while not sv.should_stop():
                await sess.run(step)
                await anyio.sleep(0.001)

    anyio.run(main)
    """
)


def _model() -> dict[str, object]:
    namespace: dict[str, object] = {}
    exec(MODEL, namespace)
    return namespace


def test_a_killed_supervisor_run_resumes_from_its_newest_checkpoint(tmp_path: Path) -> None:
    logdir = tmp_path / "run"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    child = subprocess.Popen(
        [sys.executable, "-u", str(script), str(logdir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        started = child.stdout.readline()
        assert started == "started 0\n", child.communicate()[1]
        deadline = time.monotonic() + 120  # a hang guard, not a measurement
        while (path := latest_checkpoint(logdir)) is None or int(path.rsplit("-", 1)[1]) < 30:
            assert child.poll() is None, child.communicate()[1]
            assert time.monotonic() < deadline, "the child wrote no checkpoint past step 30"
            time.sleep(0.01)
    finally:
        child.send_signal(signal.SIGKILL)
        child.communicate()
    assert child.returncode == -signal.SIGKILL

    newest = latest_checkpoint(logdir)
    assert newest is not None
    manifest, saved = read_checkpoint(newest)
    assert manifest.step >= 30

    model = _model()
    init_calls: list[int] = []

    def init(state: monitored.TrainState) -> None:
        init_calls.append(1)
        model["init"](state)  # type: ignore[operator]

    import anyio

    async def restart() -> monitored.TrainState:
        state = monitored.TrainState(seed=11)
        sv = Supervisor(state, logdir=logdir, init_fn=init, save_model_secs=600)
        async with sv.managed_session() as sess:
            assert sess.restored_from == newest
            assert state.global_step == manifest.step
            np.testing.assert_array_equal(state["w"], saved["w"])
            while state.global_step < manifest.step + 10:
                await sess.run(model["step"])
        return state

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the kill left no damaged checkpoint behind
        # ... and a claim on the run directory, taken over, saying so (one writer per run).
        with pytest.warns(monitored.RunTakenOverWarning, match=f"process {child.pid} is gone"):
            resumed = anyio.run(restart)
    assert init_calls == [], "a restored run does not initialize from scratch"

    uninterrupted = monitored.TrainState(seed=11)
    model["init"](uninterrupted)  # type: ignore[operator]
    while uninterrupted.global_step < manifest.step + 10:
        model["step"](uninterrupted)  # type: ignore[operator]
    assert resumed.global_step == uninterrupted.global_step
    assert resumed["w"].tobytes() == uninterrupted["w"].tobytes(), "resumed bit for bit"
    assert resumed.rng_state == uninterrupted.rng_state
