"""One owner per capability: an explicit ``EarlyStoppingHook`` and the installed plugin."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

import monitored
from monitored.testing import run_session
from monitored_early_stopping import (
    EarlyStoppingHook,
    stop_if_no_decrease_hook,
    stop_if_no_increase_hook,
)
from monitored_early_stopping._plugin import hook_of

pytestmark = pytest.mark.anyio

#: The installed plugin, told to watch the loss with no patience: it would stop at step 2.
OPTIONS = {"early_stopping": {"monitor": "loss", "patience": 0}}


@pytest.fixture(autouse=True)
def installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD")
    monkeypatch.setenv("MONITORED_DISABLE_PLUGINS", "progress,nan_guard,checkpoint,summaries")


def flat_loss(state: monitored.TrainState) -> dict[str, Any]:
    state.global_step += 1
    return {"loss": np.float32(1.0)}


@pytest.mark.parametrize(
    "make",
    [
        lambda: EarlyStoppingHook("loss", patience=3),
        lambda: stop_if_no_decrease_hook("loss", max_steps_without_decrease=3),
        lambda: stop_if_no_increase_hook("loss", max_steps_without_increase=3),
    ],
    ids=["EarlyStoppingHook", "stop_if_no_decrease_hook", "stop_if_no_increase_hook"],
)
async def test_an_explicit_early_stopping_hook_wins_over_the_configured_plugin(
    make: Any, caplog: Any
) -> None:
    caplog.set_level(logging.DEBUG, "monitored")
    result = await run_session([make()], flat_loss, max_steps=50, plugin_options=OPTIONS)
    assert hook_of(result.session) is None, "the installed plugin made no hook"
    assert result.state.global_step > 2, "the installed plugin's patience=0 did not stop it"
    assert result.state.global_step < 50, "the explicit hook stopped it"
    [line] = [r.getMessage() for r in caplog.records if "steps aside" in r.getMessage()]
    assert "plugin 'early_stopping'" in line
    assert "provides 'early_stopping'" in line


async def test_without_an_explicit_hook_the_configured_plugin_stops() -> None:
    result = await run_session([], flat_loss, max_steps=50, plugin_options=OPTIONS)
    assert hook_of(result.session) is not None
    assert result.state.global_step == 2
