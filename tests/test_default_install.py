"""Which installed plugins a step of a default install calls (its cost floor, docs/performance.md).

A traced step records every hook call the session makes: an idle plugin makes
none, and a plugin keeping a hook object per session has that object's methods
called directly (``MonitoredSession.delegate_step_hooks``), once per event.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import monitored


class Tracer:
    """Asks for a trace of every step and keeps each step's trace."""

    plugin_name = "tracer"

    def __init__(self) -> None:
        self.traces: list[Any] = []

    def before_run(self, run_context: monitored.SessionRunContext) -> monitored.SessionRunArgs:
        return monitored.SessionRunArgs(options=monitored.RunOptions(trace=True))

    def after_run(self, run_context: monitored.SessionRunContext, run_values: Any) -> None:
        self.traces.append(run_values.run_metadata)  # read once the step is done


def step(state: monitored.TrainState) -> dict[str, Any]:
    state.global_step += 1
    return {"loss": np.float32(1.0)}


async def traced_calls(**session: Any) -> list[str]:
    tracer = Tracer()
    async with monitored.MonitoredSession(hooks=[tracer], **session) as sess:
        for _ in range(3):
            await sess.run(step)
    # the last step's calls of installed plugins (the tracer, step and fetch left out)
    names = [event["name"] for event in tracer.traces[-1].events]
    return [name for name in names if not name.startswith(("tracer.", "step.", "session."))]


@pytest.fixture(autouse=True)
def _default_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD")
    monkeypatch.delenv("MONITORED_PROGRESS", raising=False)


async def test_a_default_step_calls_the_nan_guard_and_progress_once_per_event() -> None:
    calls = await traced_calls(plugin_options={"progress": {"mode": "plain"}})
    assert sorted(calls) == [
        "nan_guard.after_run",
        "nan_guard.before_run",
        "progress.after_run",
        "progress.before_run",
    ]


async def test_early_stopping_is_called_once_it_has_a_monitor() -> None:
    calls = await traced_calls(
        plugin_options={
            "progress": {"mode": "plain"},
            "early_stopping": {"monitor": "loss", "patience": 10},
        }
    )
    assert {"early_stopping.before_run", "early_stopping.after_run"} <= set(calls)


async def test_progress_turned_off_is_called_at_no_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MONITORED_PROGRESS", "0")
    assert sorted(await traced_calls()) == ["nan_guard.after_run", "nan_guard.before_run"]
