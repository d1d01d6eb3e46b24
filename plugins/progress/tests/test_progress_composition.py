"""One owner per capability: an explicit ``ProgressHook`` and the installed ``progress``."""

from __future__ import annotations

import io
import logging
from typing import Any

import pytest
from rich.console import Console

from monitored.testing import run_session
from monitored_progress import ProgressHook
from monitored_progress._plugin import display_of

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD")
    monkeypatch.setenv("MONITORED_DISABLE_PLUGINS", "nan_guard,early_stopping,checkpoint")


async def test_an_explicit_progress_hook_is_the_only_display(caplog: Any) -> None:
    caplog.set_level(logging.DEBUG, "monitored")
    mine = ProgressHook(mode="plain", console=Console(file=io.StringIO()))
    result = await run_session([mine], max_steps=3)
    assert display_of(result.session) is None, "the installed plugin drew nothing"
    assert [i.plugin for i in result.session.plugins if isinstance(i.plugin, ProgressHook)] == [
        mine
    ]
    [line] = [r.getMessage() for r in caplog.records if "steps aside" in r.getMessage()]
    assert "plugin 'progress'" in line
    assert "ProgressHook" in line


async def test_without_an_explicit_hook_the_installed_display_runs() -> None:
    result = await run_session([], max_steps=3, plugin_options={"progress": {"mode": "plain"}})
    assert display_of(result.session) is not None
