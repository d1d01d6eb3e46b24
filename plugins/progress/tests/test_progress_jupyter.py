"""The progress display in Jupyter, without Jupyter installed.

rich decides it runs in a notebook from ``get_ipython()`` (a ``ZMQInteractiveShell``);
the display then draws through ``IPython.display.display`` with a display id and
redraws with the handle's ``update``. These tests stand in for those names with a
recording fake, so what the notebook would show is read back. No widget is involved
(a widget's comm traffic could hang a headless run: ``tests/test_notebook.py``).
"""

from __future__ import annotations

import builtins
import io
import sys
import types
from typing import Any

import numpy as np
import pytest
from rich.console import Console

import monitored
from monitored.testing import run_session
from monitored_progress import ProgressHook

pytestmark = pytest.mark.anyio


class ZMQInteractiveShell:
    """What ``get_ipython()`` returns in a notebook kernel (rich checks the class name)."""


class Handle:
    """A ``DisplayHandle``: the output it names shows the data of its last update."""

    def __init__(self, notebook: Notebook, data: dict[str, str]) -> None:
        self.notebook = notebook
        self.shown = data
        self.updates = 0

    def update(self, data: dict[str, str], raw: bool = False) -> None:
        assert raw
        self.updates += 1
        self.shown = data


class Notebook:
    """Records what is displayed: outputs with a display id, and loose text."""

    def __init__(self) -> None:
        self.handles: list[Handle] = []
        self.loose: list[str] = []  # text displayed without a display id

    def display(self, obj: Any, raw: bool = False, display_id: Any = None) -> Handle | None:
        if display_id is not None:
            assert raw
            assert display_id is True
            handle = Handle(self, obj)
            self.handles.append(handle)
            return handle
        self.loose.append(str(getattr(obj, "html", obj)))  # rich's JupyterRenderable
        return None


@pytest.fixture
def notebook(monkeypatch: pytest.MonkeyPatch) -> Notebook:
    """A fake notebook kernel: ``get_ipython``, ``ipykernel``, ``IPython.display``."""
    book = Notebook()
    ipython = types.ModuleType("IPython")
    display = types.ModuleType("IPython.display")
    display.display = book.display  # type: ignore[attr-defined]
    ipython.display = display  # type: ignore[attr-defined]
    for name, module in (
        ("IPython", ipython),
        ("IPython.display", display),
        ("ipykernel", types.ModuleType("ipykernel")),
    ):
        module.__spec__ = types.SimpleNamespace(name=name)  # type: ignore[assignment]
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(builtins, "get_ipython", ZMQInteractiveShell, raising=False)
    monkeypatch.setenv("JUPYTER_COLUMNS", "160")
    return book


def step_with_loss(state: monitored.TrainState) -> dict[str, Any]:
    state.global_step += 1
    return {"loss": np.float32(1.0 / state.global_step)}


async def test_a_notebook_gets_a_live_bar_redrawn_in_one_output(notebook: Notebook) -> None:
    hook = ProgressHook(show=["loss"], every_n_steps=5)  # auto: detects the notebook
    await run_session([monitored.StopAtStepHook(num_steps=20), hook], step_with_loss)
    assert hook._console is not None
    assert hook._console.is_jupyter
    [handle] = notebook.handles
    assert handle.updates >= 3, "each refresh redraws in place"
    html, text = handle.shown["text/html"], handle.shown["text/plain"]
    assert "step 20" in html
    assert "loss=0.05" in html
    assert "<span style=" in html, "styled HTML, not terminal control sequences"
    assert html.startswith("<pre")
    assert "\x1b[" not in html
    assert text.startswith("step 20 ")
    assert "\x1b" not in text
    # Nothing below it: no copy of the bar, nothing rich shows at a stop.
    assert notebook.loose == []
    assert not hook._console.quiet


async def test_log_records_show_in_the_notebook_not_through_the_bar(notebook: Notebook) -> None:
    import logging

    handler = logging.StreamHandler(sys.stderr)
    logger = logging.getLogger("monitored")
    logger.addHandler(handler)
    try:

        def step(state: monitored.TrainState) -> None:
            state.global_step += 1
            if state.global_step == 3:
                logging.getLogger("monitored.train").warning("halfway there")

        hook = ProgressHook(every_n_steps=2)
        await run_session([monitored.StopAtStepHook(num_steps=6), hook], step)
    finally:
        logger.removeHandler(handler)
    assert handler.stream is sys.stderr, "logging gets its stream back"
    shown = "".join(notebook.loose) + "".join(h.shown["text/html"] for h in notebook.handles)
    assert "halfway there" in shown


async def test_a_notebook_without_ipython_display_gets_plain_lines(
    notebook: Notebook, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "IPython.display", None)  # import fails, as when missing
    buffer = io.StringIO()
    console = Console(file=buffer, force_jupyter=True)
    hook = ProgressHook(every_n_steps=5, console=console)
    await run_session([monitored.StopAtStepHook(num_steps=10), hook], step_with_loss)
    assert notebook.handles == []
    lines = buffer.getvalue().splitlines()
    assert lines[0].startswith("step 5/10")
    assert lines[-1].startswith("done: step 10/10")
    assert "\x1b" not in buffer.getvalue()


async def test_live_mode_in_a_notebook_without_ipython_display_is_plain_too(
    notebook: Notebook, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "IPython.display", None)
    buffer = io.StringIO()
    hook = ProgressHook(every_n_steps=5, mode="live", console=Console(file=buffer))
    await run_session([monitored.StopAtStepHook(num_steps=10), hook], step_with_loss)
    assert notebook.handles == []
    assert "done: step 10/10" in buffer.getvalue()


async def test_an_ipython_terminal_is_not_a_notebook(monkeypatch: pytest.MonkeyPatch) -> None:
    class TerminalInteractiveShell:
        pass

    monkeypatch.setattr(builtins, "get_ipython", TerminalInteractiveShell, raising=False)
    buffer = io.StringIO()
    hook = ProgressHook(every_n_steps=5, console=Console(file=buffer, force_terminal=False))
    await run_session([monitored.StopAtStepHook(num_steps=10), hook], step_with_loss)
    assert not hook._live
    assert "done: step 10/10" in buffer.getvalue()
