"""One owner per capability: an explicit checkpoint hook and the installed ``checkpoint``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from monitored import MonitoredTrainingSession, StopAtStepHook, TrainState
from monitored_checkpoint import CheckpointRestoreHook, CheckpointSaverHook, Saver

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def only_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.setenv("MONITORED_DISABLE_PLUGINS", "progress,nan_guard,early_stopping,summaries")


class Saves:
    """Records every checkpoint the session announces (the ``after_save`` hook)."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def after_save(self, step: int) -> None:
        self.steps.append(step)


def step(state: TrainState) -> dict[str, Any]:
    state["w"] += 1
    state.global_step += 1
    return {}


async def train(directory: Path, hooks: list[object], last_step: int = 6) -> Any:
    async with MonitoredTrainingSession(
        TrainState({"w": np.zeros(2, np.float32)}),
        checkpoint_dir=str(directory),
        save_checkpoint_steps=2,
        hooks=[*hooks, StopAtStepHook(last_step=last_step)],
    ) as sess:
        while not sess.should_stop():
            await sess.run(step)
    return sess


async def test_an_explicit_checkpoint_saver_hook_is_the_only_saver(
    tmp_path: Path, caplog: Any
) -> None:
    caplog.set_level(logging.DEBUG, "monitored")
    saves = Saves()
    mine = CheckpointSaverHook(
        tmp_path, save_steps=3, saver=Saver(max_to_keep=None), handle_signals=False
    )
    sess = await train(tmp_path, [mine, saves])
    savers = [i.plugin for i in sess.plugins if isinstance(i.plugin, CheckpointSaverHook)]
    assert savers == [mine], "no second saver from the installed plugin"
    assert saves.steps == [0, 3, 6], "the user's schedule (3), each checkpoint once"
    [line] = [r.getMessage() for r in caplog.records if "steps aside" in r.getMessage()]
    assert "plugin 'checkpoint' (monitored-checkpoint " in line
    assert "CheckpointSaverHook" in line


async def test_an_explicit_restore_hook_takes_checkpoints_over_too(tmp_path: Path) -> None:
    await train(tmp_path / "pretrained", [], last_step=4)
    saves = Saves()
    sess = await train(tmp_path / "run", [CheckpointRestoreHook(tmp_path / "pretrained"), saves])
    assert sess.restored_from is not None
    assert str(tmp_path / "pretrained") in str(sess.restored_from)
    assert saves.steps == [], "restore only: the installed saver stepped aside"
    assert not (tmp_path / "run").exists()


async def test_without_an_explicit_hook_the_installed_plugin_saves(tmp_path: Path) -> None:
    saves = Saves()
    sess = await train(tmp_path, [saves])
    assert sess.stepped_aside == ()
    assert saves.steps == [0, 2, 4, 6]
