"""Hooks and step functions shared by the core tests."""

from __future__ import annotations

import os
import shutil
import sys
from typing import Any

import pytest

import monitored


class Recorder(monitored.SessionRunHook):
    """Records every event it sees, as ``(name, event)`` tuples, into ``log``."""

    def __init__(self, name: str, log: list[tuple[str, str]], fetches: Any = None) -> None:
        self.name = name
        self.log = log
        self.fetches = fetches
        self.results: list[Any] = []

    def begin(self, session: Any) -> None:
        self.log.append((self.name, "begin"))

    def after_create_session(self, session: Any, coord: Any) -> None:
        self.log.append((self.name, "after_create_session"))

    def before_run(self, run_context: Any) -> Any:
        self.log.append((self.name, "before_run"))
        return monitored.SessionRunArgs(self.fetches) if self.fetches is not None else None

    def after_run(self, run_context: Any, run_values: Any) -> None:
        self.log.append((self.name, "after_run"))
        self.results.append(run_values.results)

    def end(self, session: Any) -> None:
        self.log.append((self.name, "end"))


def counting_step(state: monitored.TrainState, **feeds: Any) -> dict[str, Any]:
    """A step: w += 1, global step + 1; returns loss = sum(w)."""
    state["w"] += 1
    state.global_step += 1
    return {"loss": state["w"].sum(), **{f"feed:{k}": v for k, v in feeds.items()}}


class StandInCluster:
    """A cluster of several processes for tests without MPI, seen from this process.

    Every agreement answers this process's own vote (the others agree), and
    records it in :attr:`votes`; subclasses answer for the other processes.
    """

    is_chief = True

    def __init__(self) -> None:
        self.votes: list[bool] = []

    def agree_to_stop(self, local: bool) -> bool:
        self.votes.append(local)
        return local

    async def share_state(self, session: Any, max_wait_secs: float) -> None:
        return None

    def fail(self, failure: BaseException) -> None:
        return None

    def merge_metrics(self, metrics: Any) -> None:
        return None


def install_cluster(monkeypatch: Any, cluster: Any) -> None:
    """Make every session entered from now on train in ``cluster`` (as a ``cluster``
    plugin would supply it), the sessions ``evaluate_once`` makes included."""

    async def supply(self: Any, available: Any) -> None:
        self._cluster = cluster

    monkeypatch.setattr(monitored.MonitoredSession, "_find_cluster", supply)


def hide_plugins(monkeypatch: Any, *names: str) -> None:
    """Make the installed plugins ``names`` (entry-point names) look uninstalled.

    The core finds a capability's provider among the installed entry points, so
    hiding the entry point is what "not installed" means to it.
    """
    from monitored._core import _plugins

    shown = tuple(ep for ep in _plugins.installed_entry_points() if ep.name not in names)
    monkeypatch.setattr(_plugins, "installed_entry_points", lambda: shown)


def show_installed(monkeypatch: Any, *names: str) -> None:
    """Next to ``fake_plugin``'s fake distributions, show the real installed plugins
    ``names`` (entry-point names): the providers of a capability a test needs."""
    import importlib.metadata

    from monitored._core import _plugins

    fakes = _plugins.installed_entry_points
    real = tuple(
        ep for ep in importlib.metadata.entry_points(group="monitored") if ep.name in names
    )
    monkeypatch.setattr(_plugins, "installed_entry_points", lambda: (*fakes(), *real))


def uv_command() -> list[str]:
    """How to call uv in a test that builds a fresh virtual environment (skip without it)."""
    uv = os.environ.get("UV") or shutil.which("uv")
    if uv:
        return [uv]
    try:
        import uv as uv_module  # noqa: F401
    except ImportError:
        pytest.skip("needs uv (the README's test command installs it)")
    return [sys.executable, "-m", "uv"]
