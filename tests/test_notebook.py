"""``examples/notebook.ipynb`` runs in a real Jupyter kernel and does what it says.

The kernel is ``ipykernel`` on this interpreter (the project's environment), launched
by ``nbclient`` from a kernel spec written for the test, so nothing needs to be
registered with Jupyter beforehand and no other installed kernel can stand in for it.
Cells are executed as a notebook front end does: ``await main(...)`` on the kernel's
running event loop, in its main thread, with its SIGINT handling. The installed
plugins are on (checkpoint, early stopping, progress), as for a user.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, DeadKernelError
from nbformat.v4 import new_code_cell

NOTEBOOK = Path(__file__).parent.parent / "examples" / "notebook.ipynb"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
KERNEL = "monitored-test"
#: The kernel's Interrupt is a SIGINT where there are POSIX signals (a message elsewhere).
posix_signals = pytest.mark.skipif(not hasattr(signal, "SIGTERM"), reason="POSIX signals")


@pytest.fixture
def kernel_manager(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncKernelManager:
    """A kernel manager that starts ``ipykernel`` on ``sys.executable``, isolated from $HOME."""
    spec = tmp_path / "jupyter" / "kernels" / KERNEL
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    kernel = {"argv": argv, "display_name": "monitored (test)", "language": "python"}
    (spec / "kernel.json").write_text(json.dumps(kernel))
    # Jupyter's and IPython's configuration, data and runtime files stay in tmp_path.
    for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "jupyter" / name.lower()))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the notebook's checkpoint directory
    # Installed plugins load in the kernel as they do for a user.
    for name in (
        "MONITORED_DISABLE_PLUGIN_AUTOLOAD",
        "MONITORED_DISABLE_PLUGINS",
        "MONITORED_PLUGIN_OPTIONS",
        "MONITORED_PROGRESS",
    ):
        monkeypatch.delenv(name, raising=False)
    specs = KernelSpecManager(kernel_dirs=[str(spec.parent)])
    return AsyncKernelManager(kernel_name=KERNEL, kernel_spec_manager=specs)


@pytest.fixture
async def notebook(
    kernel_manager: AsyncKernelManager, tmp_path: Path
) -> AsyncIterator[tuple[NotebookClient, nbformat.NotebookNode]]:
    """The example notebook, with a client whose kernel is started (and shut down after)."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(
        nb,
        km=kernel_manager,
        timeout=60,
        allow_errors=False,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    # cleanup_kc: shut the kernel down and close the channels after (nbclient would leave
    # running a kernel whose manager it did not create).
    async with client.async_setup_kernel(cleanup_kc=True):
        yield client, nb


def text_of(cell: nbformat.NotebookNode, name: str = "stdout") -> str:
    return "".join(o["text"] for o in cell.outputs if o.get("name") == name)


def code_cells(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [cell for cell in nb.cells if cell.cell_type == "code"]


def bar_html(cell: nbformat.NotebookNode) -> str:
    """The HTML of the cell's one live display (updated in place by its display id)."""
    shown = [o for o in cell.outputs if o["output_type"] == "display_data"]
    assert len(shown) == 1, f"one live display per run, got {cell.outputs}"
    assert WIDGET_VIEW not in shown[0]["data"], "no widget: its comm traffic hung nbconvert"
    return str(shown[0]["data"]["text/html"])


async def run_cells(client: NotebookClient, nb: nbformat.NotebookNode) -> None:
    for index, cell in enumerate(nb.cells):
        await client.async_execute_cell(cell, index)


async def test_the_notebook_trains_resumes_and_stops_early_with_a_live_display(
    notebook: tuple[NotebookClient, nbformat.NotebookNode],
) -> None:
    client, nb = notebook
    # What the kernel is, and what the runs left behind.
    nb.cells.insert(0, new_code_cell("import threading\nbefore = set(threading.enumerate())"))
    nb.cells.append(
        new_code_cell(
            "import signal, sys\n"
            "print(sys.executable)\n"
            "print(sorted(t.name for t in set(threading.enumerate()) - before))\n"
            "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
        )
    )
    await run_cells(client, nb)
    _, _, first, resumed, early, check = code_cells(nb)

    assert re.fullmatch(r"starting at step 0\nstopped at step 300, loss 0\.0\d+\n", text_of(first))
    assert text_of(resumed).startswith("starting at step 300\nstopped at step 600, loss ")
    lines = text_of(early).splitlines()
    assert lines[0] == "starting at step 600"
    stopped = int(re.fullmatch(r"stopped at step (\d+), loss [\d.]+", lines[1])[1])  # type: ignore[index]
    assert 600 < stopped < 5000
    assert lines[2].startswith(f"early stop at step {stopped}: best loss ")

    # The progress plugin drew one live bar per run, in place, as styled HTML.
    for cell, step in ((first, 300), (resumed, 600), (early, stopped)):
        html = bar_html(cell)
        assert f"step {step}</span>" in html
        assert f"checkpoint {step}" in html
        assert "steps/s" in html
        assert "\x1b[" not in html
        assert "<pre" in html
        # Nothing else displayed (no blank output from rich), no plain progress lines,
        # no warning from rich, nothing on stderr.
        assert [o["output_type"] for o in cell.outputs if o["output_type"] != "stream"] == [
            "display_data"
        ]
        assert text_of(cell, "stderr") == ""
        assert "done: step" not in text_of(cell)

    executable, threads, restored = text_of(check).splitlines()
    assert executable == sys.executable
    assert threads == "[]", "the checkpoint writer and other threads end with their session"
    assert restored == "True", "the checkpoint plugin put the kernel's SIGINT handler back"


async def interrupted(
    client: NotebookClient, nb: nbformat.NotebookNode, source: str, times: int = 1
) -> nbformat.NotebookNode:
    """Run ``source`` in a new cell, interrupt the kernel ``times`` once it trains, return it.

    A second interrupt follows the first after half a second. The cell's error, if
    any, is left to the caller as nbclient's ``CellExecutionError``.
    """
    cell = new_code_cell(source)
    nb.cells.append(cell)
    task = asyncio.ensure_future(client.async_execute_cell(cell, len(nb.cells) - 1))
    while "starting at step" not in text_of(cell):
        assert not task.done(), cell.outputs
        await asyncio.sleep(0.05)
    for i in range(times):
        if i:
            await asyncio.sleep(0.5)
        await client.km.interrupt_kernel()
    try:
        await asyncio.wait_for(task, 60)
    except DeadKernelError:  # also what nbclient makes of the timeout's cancellation
        pytest.fail(f"the kernel died or hung after the interrupt: {cell.outputs}")
    return cell


@posix_signals
async def test_interrupting_the_kernel_saves_a_checkpoint_and_the_next_run_resumes(
    notebook: tuple[NotebookClient, nbformat.NotebookNode], tmp_path: Path
) -> None:
    # The kernel's Interrupt button is a SIGINT to the kernel, as Ctrl-C is in a terminal.
    client, nb = notebook
    setup = code_cells(nb)[0]
    await client.async_execute_cell(setup, nb.cells.index(setup))
    checkpoints = str(tmp_path / "interrupted")
    run = await interrupted(client, nb, f"state = await main(10**9, {checkpoints!r})")
    stopped = int(re.search(r"stopped at step (\d+)", text_of(run))[1])  # type: ignore[index]
    assert stopped >= 1
    assert f"SIGINT: saving a checkpoint of step {stopped} and stopping" in text_of(run, "stderr")
    again = await interrupted(client, nb, f"state = await main(10**9 + 1, {checkpoints!r})")
    assert text_of(again).startswith(f"starting at step {stopped}\n")


@posix_signals
async def test_a_second_interrupt_stops_the_cell_at_once_and_the_kernel_lives_on(
    notebook: tuple[NotebookClient, nbformat.NotebookNode], tmp_path: Path
) -> None:
    client, nb = notebook
    setup = code_cells(nb)[0]
    await client.async_execute_cell(setup, nb.cells.index(setup))

    # Without a checkpoint saver nothing watches SIGINT: the first one is the kernel's,
    # and it cancels the cell.
    with pytest.raises(CellExecutionError) as raised:
        await interrupted(client, nb, "state = await main(10**9, None)")
    assert raised.value.ename == "CancelledError"

    # With one, the first asks for a save at the end of the step, which is a minute
    # away; the second is the kernel's again. The main thread waits in the kernel's
    # event loop, where a KeyboardInterrupt would kill the kernel.
    slow = (
        "import anyio\n"
        "\n"
        "async def train_step(state):\n"
        "    for _ in range(1200):\n"
        "        await anyio.sleep(0.05)\n"
        "\n"
        f"state = await main(10, {str(tmp_path / 'slow')!r})"
    )
    with pytest.raises(CellExecutionError) as raised:
        await interrupted(client, nb, slow, times=2)
    assert raised.value.ename == "CancelledError", "the kernel's own way to stop a cell"
    alive = new_code_cell("print('alive')")
    nb.cells.append(alive)
    await client.async_execute_cell(alive, len(nb.cells) - 1)
    assert text_of(alive) == "alive\n"


def test_the_example_notebook_is_stored_without_outputs() -> None:
    nb: Any = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    for cell in code_cells(nb):
        assert cell.outputs == []
        assert cell.execution_count is None


def test_nbconvert_executes_the_notebook_headless_without_hanging(tmp_path: Path) -> None:
    """``jupyter nbconvert --execute`` (CI's way, no front end) runs it through, every time.

    With the bar in an ``ipywidgets.Output`` about one run in three hung under load:
    ``nbclient`` answers each redraw of a widget with a ``comm_msg``, and one arriving
    as the kernel sent the cell's reply stranded that reply (ipykernel 7), so nbconvert
    waited for ever. Several real runs, each with a timeout, catch that race.
    """
    jupyter = Path(sys.executable).parent / "jupyter"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONITORED_")}
    for run in range(4):
        out = tmp_path / f"run{run}"
        out.mkdir()
        env.update(
            JUPYTER_CONFIG_DIR=str(out / "config"),
            JUPYTER_DATA_DIR=str(out / "data"),
            JUPYTER_RUNTIME_DIR=str(out / "runtime"),
            IPYTHONDIR=str(out / "ipython"),
            TMPDIR=str(out),
        )
        argv = [str(jupyter), "nbconvert", "--to", "notebook", "--execute", str(NOTEBOOK)]
        argv += ["--output-dir", str(out), "--output", "executed"]
        try:
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=90)
        except subprocess.TimeoutExpired:
            pytest.fail(f"nbconvert --execute hung (run {run + 1})")
        assert done.returncode == 0, done.stderr
        nb = nbformat.read(out / "executed.ipynb", as_version=4)
        _, first, resumed, early = code_cells(nb)
        assert "stopped at step 300" in text_of(first)
        assert "starting at step 300" in text_of(resumed)
        assert "early stop at step" in text_of(early)
        for cell in (first, resumed, early):
            assert "steps/s" in bar_html(cell)


async def test_a_session_kept_open_across_cells_then_a_new_one_resumes(
    kernel_manager: AsyncKernelManager, tmp_path: Path
) -> None:
    """Opened in one cell, run in the next, closed in a third (each cell a task of its
    own), as TF1 users kept a ``tf.Session`` open; then a new session resumes from the
    checkpoint the close saved."""
    setup = (
        "import threading, tempfile\n"
        "import numpy as np\n"
        "import monitored\n"
        "before = set(threading.enumerate())\n"
        "checkpoint_dir = tempfile.mkdtemp(prefix='monitored-cells-')\n"
        "def step(state):\n"
        "    state['w'] += 1\n"
        "    state.global_step += 1\n"
        "    return {'loss': float(state['w'].sum())}\n"
        "def new_session():\n"
        "    state = monitored.TrainState({'w': np.zeros(3, np.float32)})\n"
        "    return monitored.MonitoredTrainingSession(\n"
        "        state, checkpoint_dir=checkpoint_dir, save_checkpoint_steps=1000,\n"
        "        save_summaries_steps=None, log_step_count_steps=None,\n"
        "        disable_plugins=['progress'],\n"
        "    )\n"
    )
    sources = [
        setup,
        "sess = new_session()\nawait sess.open()\nprint('opened at', sess.state.global_step)",
        "for _ in range(5):\n    await sess.run(step)\nprint('ran to', sess.state.global_step)",
        "await sess.close()\nprint('closed at', sess.state.global_step)",
        "again = new_session()\nawait again.open()\nprint('resumed at', again.state.global_step)\n"
        "await again.run(step)\nawait again.close()\nprint('closed at', again.state.global_step)",
        "print(sorted(t.name for t in set(threading.enumerate()) - before))",
    ]
    nb = nbformat.v4.new_notebook(cells=[new_code_cell(source) for source in sources])
    client = NotebookClient(
        nb, km=kernel_manager, timeout=60, resources={"metadata": {"path": str(tmp_path)}}
    )
    async with client.async_setup_kernel(cleanup_kc=True):
        await run_cells(client, nb)
    _, opened, ran, closed, resumed, threads = nb.cells
    assert text_of(opened) == "opened at 0\n"
    assert text_of(ran) == "ran to 5\n"
    assert text_of(closed) == "closed at 5\n"
    assert text_of(resumed) == "resumed at 5\nclosed at 6\n", "the close saved step 5"
    assert text_of(threads) == "[]\n", "nothing of either session is left running"
    for cell in nb.cells:
        assert text_of(cell, "stderr") == "", cell.outputs
