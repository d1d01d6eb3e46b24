"""Paths are fixed when a session starts: an ``os.chdir`` during training changes nothing."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from monitored import MonitoredTrainingSession, StopAtStepHook, TrainState
from monitored_checkpoint import latest_checkpoint

pytestmark = pytest.mark.anyio


def _step(state: TrainState) -> None:
    state["w"] += 1.0
    state.global_step += 1


async def test_a_relative_checkpoint_dir_survives_a_chdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    state = TrainState({"w": np.zeros(2)})
    async with MonitoredTrainingSession(
        state,
        checkpoint_dir="rel/ck",
        save_checkpoint_steps=1,
        save_summaries_steps=1,
        hooks=[StopAtStepHook(last_step=4)],
        log_step_count_steps=None,
    ) as sess:
        await sess.run(_step)
        os.chdir(elsewhere)  # a notebook, or a library that changes directory
        while not sess.should_stop():
            await sess.run(_step)
    run = tmp_path / "rel" / "ck"
    assert latest_checkpoint(str(run)) == str(run / "model.ckpt-4")
    assert any("tfevents" in p.name for p in run.iterdir())
    assert list(elsewhere.iterdir()) == []
    # Resumed from another working directory with the absolute path: the same run.
    state = TrainState({"w": np.zeros(2)})
    async with MonitoredTrainingSession(
        state, checkpoint_dir=run, hooks=[StopAtStepHook(last_step=5)], log_step_count_steps=None
    ) as sess:
        assert state.global_step == 4
        while not sess.should_stop():
            await sess.run(_step)
    np.testing.assert_array_equal(state["w"], np.full(2, 5.0))
