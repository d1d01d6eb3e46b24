"""The progress display in Jupyter, without Jupyter installed.

rich decides it runs in a notebook from ``get_ipython()`` (a ``ZMQInteractiveShell``)
and draws through ``IPython.display.display`` into an ``ipywidgets.Output``. These
tests stand in for those three names with recording fakes, so the display's
notebook path runs for real in rich, and what the notebook would show is read back.
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


class Notebook:
    """Records what rich shows: widgets made and displayed, the text put in them."""

    def __init__(self) -> None:
        self.widgets: list[Output] = []
        self.displayed: list[Any] = []
        self.loose: list[str] = []  # text displayed outside any widget
        self.active: Output | None = None

    def display(self, obj: Any) -> None:
        if isinstance(obj, Output):
            self.displayed.append(obj)
            return
        text = str(getattr(obj, "html", obj))  # rich's JupyterRenderable: HTML for the page
        if self.active is not None:
            self.active.shown.append(text)
        else:
            self.loose.append(text)


class Output:
    """``ipywidgets.Output``: a context manager capturing displays, cleared on redraw."""

    notebook: Notebook

    def __init__(self) -> None:
        self.shown: list[str] = []
        self.clears = 0
        self.notebook.widgets.append(self)

    def __enter__(self) -> Output:
        self.notebook.active = self
        return self

    def __exit__(self, *exc: object) -> None:
        self.notebook.active = None

    def clear_output(self, wait: bool = False) -> None:
        self.clears += 1
        self.shown.clear()


@pytest.fixture
def notebook(monkeypatch: pytest.MonkeyPatch) -> Notebook:
    """A fake notebook kernel: ``get_ipython``, ``ipykernel``, ``IPython.display``, ``ipywidgets``."""
    book = Notebook()
    Output.notebook = book
    ipython = types.ModuleType("IPython")
    display = types.ModuleType("IPython.display")
    display.display = book.display  # type: ignore[attr-defined]
    ipython.display = display  # type: ignore[attr-defined]
    widgets = types.ModuleType("ipywidgets")
    widgets.Output = Output  # type: ignore[attr-defined]
    for name, module in (
        ("IPython", ipython),
        ("IPython.display", display),
        ("ipywidgets", widgets),
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


async def test_a_notebook_gets_a_live_bar_redrawn_in_one_widget(notebook: Notebook) -> None:
    hook = ProgressHook(show=["loss"], every_n_steps=5)  # auto: detects the notebook
    await run_session([monitored.StopAtStepHook(num_steps=20), hook], step_with_loss)
    assert hook._console is not None
    assert hook._console.is_jupyter
    [widget] = notebook.widgets
    assert notebook.displayed == [widget], "one widget, displayed once"
    assert widget.clears >= 4, "each refresh redraws in place"
    [final] = widget.shown
    assert "step 20" in final
    assert "loss=0.05" in final
    assert "<span style=" in final, "styled HTML, not terminal control sequences"
    assert "\x1b[" not in final
    # Nothing below it: no copy of the bar, not even the empty <pre> rich shows at its stop.
    assert notebook.loose == []
    assert not hook._console.quiet, "the console speaks again after the display"


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
    shown = "".join(notebook.loose) + "".join(t for w in notebook.widgets for t in w.shown)
    assert "halfway there" in shown


async def test_a_notebook_without_ipywidgets_gets_plain_lines(
    notebook: Notebook, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # import fails, as when missing
    buffer = io.StringIO()
    console = Console(file=buffer, force_jupyter=True)
    hook = ProgressHook(every_n_steps=5, console=console)
    await run_session([monitored.StopAtStepHook(num_steps=10), hook], step_with_loss)
    assert notebook.widgets == []
    lines = buffer.getvalue().splitlines()
    assert lines[0].startswith("step 5/10")
    assert lines[-1].startswith("done: step 10/10")
    assert "\x1b" not in buffer.getvalue()


async def test_live_mode_in_a_notebook_without_ipywidgets_is_plain_too(
    notebook: Notebook, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ipywidgets", None)
    buffer = io.StringIO()
    hook = ProgressHook(every_n_steps=5, mode="live", console=Console(file=buffer))
    await run_session([monitored.StopAtStepHook(num_steps=10), hook], step_with_loss)
    assert notebook.widgets == []
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
