"""Fixtures shared by the monitored-optuna tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def _only_this_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    """Installed plugins stay off unless a test turns one on."""
    monkeypatch.setenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.delenv("MONITORED_DISABLE_PLUGINS", raising=False)
    monkeypatch.delenv("MONITORED_PLUGIN_OPTIONS", raising=False)
    monkeypatch.delenv("MONITORED_PROGRESS", raising=False)
