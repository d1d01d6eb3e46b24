"""Several sessions at once in one event loop: one live display, one line each."""

from __future__ import annotations

import io
from typing import Any

import anyio
import numpy as np
import pytest
from rich.console import Console

import monitored
from monitored_progress import ProgressHook, _hook
from monitored_progress._hook import _Display

pytestmark = pytest.mark.anyio


def step(state: monitored.TrainState) -> dict[str, Any]:
    state.global_step += 1
    return {"loss": np.float32(state.global_step)}


async def run_sessions(hooks: list[ProgressHook], steps: list[int], lines: list[int]) -> None:
    """Run one session per hook at once, recording how many lines the display has."""

    async def train(hook: ProgressHook, last: int) -> None:
        session = monitored.MonitoredSession(hooks=[hook, monitored.StopAtStepHook(last_step=last)])
        async with session:
            while not session.should_stop():
                await session.run(step)
                display = hook._display
                lines.append(len(display.progress.tasks) if display is not None else 0)
                await anyio.sleep(0.001)

    async with anyio.create_task_group() as group:
        for hook, last in zip(hooks, steps, strict=True):
            group.start_soon(train, hook, last)


async def test_sessions_on_one_console_share_one_live_display_with_a_line_each() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=160)
    hooks = [
        ProgressHook(show=["loss"], every_n_steps=1, mode="live", console=console) for _ in range(3)
    ]
    lines: list[int] = []
    await run_sessions(hooks, [20, 30, 40], lines)
    assert max(lines) == 3, "one line per running session"
    assert lines[-1] == 1, "a finished session's line is gone; the last one's stays"
    assert not _Display._open, "the last session out stopped the display"
    text = buffer.getvalue()
    assert "loss=20" in text
    assert "loss=30" in text
    assert "loss=40" in text


async def test_hooks_without_a_console_draw_on_the_one_display_of_the_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The process's console is made at first use: not one an earlier test made (a notebook's).
    monkeypatch.setattr(_hook, "_console", None)
    hooks = [ProgressHook(every_n_steps=5, mode="live") for _ in range(2)]
    lines: list[int] = []
    displays: list[Any] = []

    class Seen:
        def after_run(self, run_context: Any, run_values: Any) -> None:
            displays.extend(hook._display for hook in hooks if hook._display is not None)

    async def train(hook: ProgressHook) -> None:
        session = monitored.MonitoredSession(
            hooks=[hook, Seen(), monitored.StopAtStepHook(last_step=20)]
        )
        async with session:
            while not session.should_stop():
                await session.run(step)
                lines.append(1)
                await anyio.sleep(0.001)

    async with anyio.create_task_group() as group:
        for hook in hooks:
            group.start_soon(train, hook)
    assert len({id(d) for d in displays}) == 1
    assert not _Display._open
