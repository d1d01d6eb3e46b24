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


@pytest.mark.parametrize(
    "basename", ["model\nckpt", "model\x1b[2Jckpt", "model\udcffckpt", "m\x85", "m\u200bx"]
)
def test_a_basename_that_is_not_printable_is_refused_before_anything_is_written(
    tmp_path: Path, basename: str
) -> None:
    """A checkpoint named with a line break is never found again: a resume would start afresh."""
    from monitored_checkpoint import CheckpointSaverHook, Saver

    with pytest.raises(
        ValueError, match=r"CheckpointSaverHook: checkpoint basename .* not printable"
    ):
        CheckpointSaverHook(str(tmp_path), save_steps=1, checkpoint_basename=basename)
    with pytest.raises(ValueError, match=r"Saver: checkpoint basename .* not printable") as info:
        Saver().save(TrainState({"w": np.zeros(2)}), os.path.join(tmp_path, basename), 1)
    assert not {"\n", "\x1b", "\x85"} & set(str(info.value))
    assert os.listdir(tmp_path) == []


def test_a_printable_basename_with_spaces_and_letters_of_any_script_is_kept(tmp_path: Path) -> None:
    from monitored_checkpoint import Saver

    path = Saver().save(TrainState({"w": np.zeros(2)}), str(tmp_path / "modèle ckpt\u3000a"), 3)
    assert path == str(tmp_path / "modèle ckpt\u3000a-3")
    assert latest_checkpoint(str(tmp_path)) == path
