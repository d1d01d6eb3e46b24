"""The ``list_checkpoints`` and ``save_checkpoint`` capability hooks, and who serves them."""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np
import pytest

import monitored
from monitored import TrainState
from monitored_checkpoint import CheckpointRestoreHook, CheckpointSaverHook, Saver, _plugin

pytestmark = pytest.mark.anyio


def test_list_checkpoints_lists_every_checkpoint_on_disk_oldest_first(
    ckpt_dir: str, state: TrainState
) -> None:
    """Not only those the state file keeps: max_to_keep=0 lists the newest alone there."""
    saver = Saver(max_to_keep=0)
    for step in (30, 4, 12):
        states = {"counts": {"version": 1, "state": {"at": step}}}
        saver.save(state, os.path.join(ckpt_dir, "model.ckpt"), step, plugin_states=states)
    listed = _plugin.list_checkpoints(ckpt_dir)
    assert [(os.path.basename(path), step) for path, step, _ in listed] == [
        ("model.ckpt-4", 4),
        ("model.ckpt-12", 12),
        ("model.ckpt-30", 30),
    ]
    assert [plugins["counts"]["state"]["at"] for _, _, plugins in listed] == [4, 12, 30]
    restored = TrainState({name: np.zeros_like(array) for name, array in state.items()})
    assert _plugin.restore_checkpoint(restored, listed[0][0]) == listed[0][0]
    assert restored.global_step == 4


def test_list_checkpoints_leaves_out_a_damaged_one_with_a_warning(
    ckpt_dir: str, state: TrainState, caplog: pytest.LogCaptureFixture
) -> None:
    saver = Saver()
    for step in (1, 2):
        saver.save(state, os.path.join(ckpt_dir, "model.ckpt"), step)
    with open(os.path.join(ckpt_dir, "model.ckpt-2.json"), "w") as f:
        f.write("{not json")
    assert [step for _, step, _ in _plugin.list_checkpoints(ckpt_dir)] == [1]
    [warned] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned.startswith(f"leaving out {os.path.join(ckpt_dir, 'model.ckpt-2')}: ")


def test_list_checkpoints_of_an_empty_or_missing_directory_is_empty(tmp_path: Any) -> None:
    assert _plugin.list_checkpoints(str(tmp_path)) == []
    assert _plugin.list_checkpoints(str(tmp_path / "nothing")) == []


def test_save_checkpoint_keeps_the_newest_max_to_keep_across_calls(
    ckpt_dir: str, state: TrainState
) -> None:
    states = {"counts": {"version": 1, "state": {"n": 1}}}
    paths = [_plugin.save_checkpoint(state, ckpt_dir, "best", s, states, 1) for s in (3, 5)]
    assert paths == [os.path.join(ckpt_dir, "best-3"), os.path.join(ckpt_dir, "best-5")]
    assert [(step, plugins) for _, step, plugins in _plugin.list_checkpoints(ckpt_dir)] == [
        (5, states)
    ]
    _plugin.save_checkpoint(state, ckpt_dir, "all", 1, {}, 0)
    _plugin.save_checkpoint(state, ckpt_dir, "all", 2, {}, 0)
    assert sum(name.startswith("all-") for name in os.listdir(ckpt_dir)) == 4  # 0: all kept


def test_save_checkpoint_refuses_a_basename_that_is_not_a_plain_name(
    ckpt_dir: str, state: TrainState
) -> None:
    with pytest.raises(ValueError, match="basename 'sub/best' must be a plain name"):
        _plugin.save_checkpoint(state, ckpt_dir, "sub/best", 1, {}, 1)


@pytest.mark.parametrize("hook", [CheckpointSaverHook, CheckpointRestoreHook])
async def test_an_explicit_checkpoint_hook_serves_the_capability_in_its_session(
    ckpt_dir: str, tmp_path: Any, hook: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It owns "checkpoint" there, so it serves ``monitored.provider(..., session=)``,
    even with the installed plugin disabled."""
    monkeypatch.setenv("MONITORED_DISABLE_PLUGINS", "checkpoint")
    with pytest.raises(monitored.MissingPluginError, match="'checkpoint' plugin, which provides"):
        monitored.provider("checkpoint", "the test lists checkpoints")
    made = hook(ckpt_dir) if hook is CheckpointRestoreHook else hook(ckpt_dir, save_steps=1)
    state = TrainState({"w": np.zeros(2, np.float32)})
    elsewhere = str(tmp_path / "elsewhere")  # not the directory the hook itself saves to
    async with monitored.MonitoredSession(state, hooks=[made]) as sess:
        checkpoints = monitored.provider("checkpoint", session=sess)
        assert checkpoints.info.plugin is made
        checkpoints.require("latest_checkpoint", "list_checkpoints", "save_checkpoint")
        path = checkpoints.call(
            "save_checkpoint",
            state=state,
            checkpoint_dir=elsewhere,
            basename="model.ckpt",
            step=7,
            plugin_states={},
            max_to_keep=2,
        )
        assert checkpoints.call("latest_checkpoint", checkpoint_dir=elsewhere) == path
        assert checkpoints.call("restore_checkpoint", state=state, path=path) == path
