"""Supervisor scripts as TF1 wrote them (issue 22, the PTB port): saving with
``sv.saver.save(sess, ..., global_step=sv.global_step)``, validation and test passes
in the managed session, TF1's summary tags, and event files that survive ``kill -9``."""

from __future__ import annotations

import glob
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import monitored
from monitored import Supervisor

ckpt = pytest.importorskip("monitored_checkpoint")
summaries = pytest.importorskip("monitored_summaries")


def new_state() -> monitored.TrainState:
    return monitored.TrainState({"w": np.zeros(3, dtype=np.float32)}, seed=0)


def train_step(state: monitored.TrainState) -> dict[str, Any]:
    state["w"] += 1
    state.global_step += 1
    return {"cost": state["w"].sum()}


def eval_step(state: monitored.TrainState) -> dict[str, Any]:
    """A validation step: reads the model, leaves the global step alone."""
    return {"cost": state["w"].sum() * 2}


def tags(directory: Path) -> dict[str, list[tuple[int, float]]]:
    found: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(directory.glob("events.out.tfevents.*")):
        for event in summaries.summary_iterator(path):
            for value in event.summary.value:
                found.setdefault(value.tag, []).append((event.step, value.simple_value))
    return found


# -- sv.saver.save(session, path, global_step=sv.global_step) -------------------------------------
async def test_sv_saver_save_takes_the_session_as_tf1s_first_argument(tmp_path: Path) -> None:
    sv = Supervisor(new_state(), logdir=tmp_path / "run")
    async with sv.managed_session() as session:
        for _ in range(3):
            await session.run(train_step)
        assert sv.global_step == 3
        path = sv.saver.save(session, str(tmp_path / "model"), global_step=sv.global_step)
    assert path == str(tmp_path / "model-3")
    manifest, arrays = ckpt.read_checkpoint(path)
    assert manifest.step == 3
    np.testing.assert_array_equal(arrays["w"], [3, 3, 3])
    restored = new_state()
    sv.saver.restore(_Session(restored), path)  # TF1's saver.restore(sess, path)
    assert restored.global_step == 3
    np.testing.assert_array_equal(restored["w"], [3, 3, 3])


class _Session:
    """Anything with a ``state`` (a session, a step context), as TF1's ``sess``."""

    def __init__(self, state: monitored.TrainState) -> None:
        self.state = state


def test_saver_save_refuses_what_is_neither_a_state_nor_a_session(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"Saver.save: the first argument is the monitored.Tra"):
        ckpt.Saver().save({"w": np.zeros(1)}, str(tmp_path / "model"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"sv.saver.save\(sess, path, global_step=sv.global_step"):
        ckpt.Saver().save(object(), str(tmp_path / "model"))  # type: ignore[arg-type]
    assert not list(tmp_path.iterdir()), "nothing written"


def test_sv_global_step_is_the_states_global_step() -> None:
    state = new_state()
    sv = Supervisor(state)
    assert sv.global_step == 0
    state.global_step = 41
    assert sv.global_step == 41


# -- validation and test passes ---------------------------------------------------------------
async def test_validation_and_test_passes_in_the_managed_session_are_not_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sv = Supervisor(new_state(), logdir=tmp_path, save_summaries_secs=0)
    with caplog.at_level(logging.WARNING, logger="monitored"):
        async with sv.managed_session() as session:
            for _ in range(3):  # epochs: train, then a validation pass of 25 steps
                for _ in range(20):
                    await session.run(train_step)
                for _ in range(25):
                    await session.run(eval_step)
            for _ in range(25):  # the test pass
                await session.run(eval_step)
    assert "has not been increased" not in caplog.text


# -- summary tags ---------------------------------------------------------------------------------
async def test_summary_tags_are_cleaned_with_tf1s_rules(tmp_path: Path) -> None:
    def recording_step(state: monitored.TrainState) -> dict[str, Any]:
        summaries.scalar("Train/Training Loss", state["w"][0])
        return train_step(state)

    sv = Supervisor(
        new_state(),
        logdir=tmp_path,
        save_summaries_secs=60,
        global_step=None,
        summary_op=lambda state: {"Train/Learning Rate": 0.5},
    )
    async with sv.managed_session() as session:
        await session.run(recording_step)
        sv.summary_computed(session, {"/Valid/Validation Loss (ppl)": 3.0})
    found = tags(tmp_path)
    assert set(found) == {
        "Train/Training_Loss",
        "Train/Learning_Rate",
        "Valid/Validation_Loss__ppl_",
    }


# -- the PTB pattern: validation cost as a summary ----------------------------------------------
async def test_validation_cost_is_written_with_summary_computed_at_the_training_step(
    tmp_path: Path,
) -> None:
    def recording_step(state: monitored.TrainState) -> dict[str, Any]:
        outputs = train_step(state)
        summaries.scalar("Train/Training Loss", outputs["cost"])
        return outputs

    sv = Supervisor(new_state(), logdir=tmp_path, save_summaries_secs=3600)
    async with sv.managed_session() as session:
        for _ in range(2):
            for _ in range(5):
                await session.run(recording_step)
            costs = [float((await session.run(eval_step))["cost"]) for _ in range(4)]
            sv.summary_computed(session, {"Valid/Validation Loss": float(np.mean(costs))})
    found = tags(tmp_path)
    assert found["Valid/Validation_Loss"] == [(5, 30.0), (10, 60.0)]
    # The validation steps, run while the training summary was not due, wrote nothing.
    assert found["Train/Training_Loss"] == [(1, 3.0)]


async def test_a_validation_step_on_the_due_slot_does_not_delay_the_training_summary(
    tmp_path: Path,
) -> None:
    def recording_step(state: monitored.TrainState) -> dict[str, Any]:
        outputs = train_step(state)
        summaries.scalar("Train/Training Loss", outputs["cost"])
        return outputs

    sv = Supervisor(new_state(), logdir=tmp_path, save_summaries_secs=3600)
    async with sv.managed_session() as session:
        await session.run(eval_step)  # the first step is due; it records nothing
        await session.run(eval_step)
        await session.run(recording_step)
    assert tags(tmp_path)["Train/Training_Loss"] == [(1, 3.0)]


# -- event files after kill -9 --------------------------------------------------------------------
async def test_the_event_file_header_is_on_disk_when_the_file_is_made(tmp_path: Path) -> None:
    sv = Supervisor(new_state(), logdir=tmp_path, save_summaries_secs=3600)
    async with sv.managed_session():
        [(path, size)] = event_files(tmp_path)
        assert size > 0, "written at creation, before any flush"
        [header, *_] = list(summaries.summary_iterator(path))
        assert header.file_version == "brain.Event:2"


def event_files(directory: Path) -> list[tuple[str, int]]:
    """The event files of ``directory`` and their sizes on disk."""
    paths = sorted(glob.glob(os.path.join(directory, "events.out.tfevents.*")))
    return [(path, os.path.getsize(path)) for path in paths]


CHILD = textwrap.dedent(
    """
    import sys
    import anyio
    import numpy as np
    import monitored_summaries as summaries
    from monitored import Supervisor, TrainState

    def step(state):
        summaries.scalar("Train/Training Loss", float(state.global_step))
        state.global_step += 1
        return {}

    async def main():
        logdir, flush_secs = sys.argv[1], float(sys.argv[2])
        state = TrainState({"w": np.zeros(1)})
        writer = summaries.FileWriter(logdir, flush_secs=flush_secs) if flush_secs else None
        kwargs = {"summary_writer": writer} if writer is not None else {}
        sv = Supervisor(state, logdir=logdir, save_summaries_secs=0.01, save_model_secs=0,
                        **kwargs)
        async with sv.managed_session() as sess:
            print("started", flush=True)
            while True:
                await sess.run(step)
                if state.global_step == 20:
                    print("stepped", flush=True)
                await anyio.sleep(0.005)

    anyio.run(main)
    """
)


def _train_then_kill(tmp_path: Path, flush_secs: float, wait_for_summaries: bool) -> Path:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    logdir = tmp_path / "run"
    child = subprocess.Popen(
        [sys.executable, "-u", str(script), str(logdir), str(flush_secs)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "started\n", child.communicate()[1]
        assert child.stdout.readline() == "stepped\n", child.communicate()[1]
        deadline = time.monotonic() + 60  # a hang guard, not a measurement
        while wait_for_summaries and not _has_summaries(logdir):
            assert time.monotonic() < deadline, "nothing was flushed past the header"
            time.sleep(0.01)
    finally:
        child.send_signal(signal.SIGKILL)
        child.communicate()
    assert child.returncode == -signal.SIGKILL
    [path] = logdir.glob("events.out.tfevents.*")
    return path


def _has_summaries(logdir: Path) -> bool:
    """Whether an event file of ``logdir`` holds a summary on disk (more than its header)."""
    return any(
        event.summary.value
        for path in logdir.glob("events.out.tfevents.*")
        for event in summaries.summary_iterator(path)
    )


def test_a_killed_supervisor_run_leaves_an_event_file_with_its_header(tmp_path: Path) -> None:
    # Default flush_secs=120: nothing was flushed, yet the file is a readable event file.
    path = _train_then_kill(tmp_path, 0, wait_for_summaries=False)
    events = list(summaries.summary_iterator(path))
    assert events[0].file_version == "brain.Event:2"


def test_a_summary_writer_with_a_short_flush_secs_keeps_the_summaries_of_a_killed_run(
    tmp_path: Path,
) -> None:
    # Killed once the writer has flushed (every 0.05 s): what it flushed survives.
    path = _train_then_kill(tmp_path, 0.05, wait_for_summaries=True)
    steps = [
        event.step
        for event in summaries.summary_iterator(path)
        for value in event.summary.value
        if value.tag == "Train/Training_Loss"
    ]
    assert steps, "summaries flushed every 0.05 s are on disk after kill -9"
