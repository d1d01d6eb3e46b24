"""One owner per capability: an explicit ``NanTensorHook`` and the installed ``nan_guard``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import monitored
from monitored.testing import run_session
from monitored_nan_guard import NanTensorHook, Rollback

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The installed ``nan_guard`` plugin is loaded (its default: raise)."""
    monkeypatch.delenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD")
    monkeypatch.setenv("MONITORED_DISABLE_PLUGINS", "progress,early_stopping,checkpoint")


def nan_at(step: int) -> Any:
    def run(state: monitored.TrainState) -> dict[str, Any]:
        state.global_step += 1
        return {"loss": np.float32(np.nan if state.global_step == step else 1.0)}

    return run


def steps_aside(caplog: Any) -> list[str]:
    return [r.getMessage() for r in caplog.records if "steps aside" in r.getMessage()]


async def test_explicit_nan_tensor_hook_without_failing_wins_over_the_installed_guard(
    caplog: Any,
) -> None:
    """TF1's warn-and-stop: no NanLossDuringTrainingError from the installed guard."""
    caplog.set_level(logging.DEBUG, "monitored")
    result = await run_session(
        [NanTensorHook("loss", fail_on_nan_loss=False)], nan_at(4), max_steps=10
    )
    assert result.state.global_step == 4, "stopped after the NaN step, as TF1"
    assert caplog.text.count("Model diverged with loss = NaN.") == 1, "one guard saw it"
    assert "nan_guard" not in [info.name for info in result.session.plugins]
    [line] = steps_aside(caplog)
    assert "plugin 'nan_guard' (monitored-nan-guard " in line
    assert "NanTensorHook" in line
    assert "provides 'nan_guard'" in line
    [aside] = result.session.stepped_aside
    assert (aside.plugin.name, aside.capability) == ("nan_guard", "nan_guard")


async def test_the_step_aside_line_in_docs_plugins_md_is_the_one_printed(caplog: Any) -> None:
    docs = Path(__file__).parents[3] / "docs" / "plugins.md"
    [documented] = [
        line for line in docs.read_text().splitlines() if line.startswith("DEBUG:monitored:plugin")
    ]
    caplog.set_level(logging.DEBUG, "monitored")
    async with monitored.MonitoredSession(
        monitored.TrainState(), hooks=[NanTensorHook("loss")]
    ) as sess:
        await sess.run(nan_at(0))
    [record] = [r for r in caplog.records if "steps aside" in r.getMessage()]
    assert record.levelno == logging.DEBUG  # the plugin's own hook: a takeover asked for
    assert f"DEBUG:monitored:{record.getMessage()}" == documented


async def test_explicit_rollback_guard_is_not_followed_by_the_installed_guard_raising(
    tmp_path: Any, caplog: Any
) -> None:
    from monitored_checkpoint import CheckpointSaverHook

    caplog.set_level(logging.DEBUG, "monitored")
    seen: list[Rollback] = []
    hook = NanTensorHook("loss", on_nan="rollback", on_rollback=seen.append)
    saver = CheckpointSaverHook(tmp_path, save_steps=5, asynchronous=False, handle_signals=False)
    poisoned = {12}

    def step(state: monitored.TrainState) -> dict[str, Any]:
        state["w"] += 1
        state.global_step += 1
        if state.global_step in poisoned:
            poisoned.discard(state.global_step)
            return {"loss": np.float32(np.nan)}
        return {"loss": state["w"].sum()}

    state = monitored.TrainState({"w": np.zeros(2, np.float32)})
    result = await run_session(
        [hook, saver, monitored.StopAtStepHook(last_step=15)], step, state=state, max_steps=50
    )
    assert result.state.global_step == 15
    [rollback] = seen
    assert (rollback.failed_step, rollback.restored_step) == (12, 10)
    assert len(steps_aside(caplog)) == 1


async def test_the_installed_guard_still_acts_without_an_explicit_one() -> None:
    from monitored_nan_guard import NanLossDuringTrainingError

    with pytest.raises(NanLossDuringTrainingError):
        await run_session([], nan_at(3), max_steps=10)


async def test_after_a_rollback_the_log_says_the_guard_keeps_its_count(
    tmp_path: Any, caplog: Any
) -> None:
    """The restored checkpoint holds no nan_guard state; its rollback count carries on."""
    from monitored_checkpoint import CheckpointSaverHook
    from monitored_nan_guard._plugin import guard_of

    caplog.set_level(logging.DEBUG, "monitored")
    saver = CheckpointSaverHook(tmp_path, save_steps=2, asynchronous=False, handle_signals=False)
    poisoned = {5, 9}

    def step(state: monitored.TrainState) -> dict[str, Any]:
        state.global_step += 1
        if state.global_step in poisoned:
            poisoned.discard(state.global_step)
            return {"loss": np.float32(np.nan)}
        return {"loss": np.float32(1.0)}

    result = await run_session(
        [saver, monitored.StopAtStepHook(last_step=12)],
        step,
        max_steps=50,
        plugin_options={"nan_guard": {"on_nan": "rollback"}},
    )
    guard = guard_of(result.session)
    assert guard is not None
    assert [r.number for r in guard.rollbacks] == [1, 2], "the count carried on"
    said = [
        r.getMessage()
        for r in caplog.records
        if "No saved state for plugin 'nan_guard'" in r.getMessage()
    ]
    assert said, "the second rollback restores a checkpoint without nan_guard state"
    assert all("it keeps the state it has" in line for line in said), said
    assert "starts fresh" not in " ".join(said)
