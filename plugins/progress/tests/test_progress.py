"""The progress display: plain lines without a terminal, a live bar under a real pty."""

from __future__ import annotations

import io
import os
import pty
import select
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console

import monitored
from monitored.testing import run_session
from monitored_progress import ProgressConfigError, ProgressHook, progress_enabled

pytestmark = pytest.mark.anyio

#: A child process training 60 slow steps with the installed plugin, logging midway.
CHILD = textwrap.dedent(
    """
    import logging, time, anyio, numpy as np, monitored

    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")

    def step(state):
        time.sleep(0.004)
        state.global_step += 1
        if state.global_step == 30:
            logging.getLogger("train").info("halfway there")
        return {"loss": np.float32(1.0 / state.global_step)}

    async def main():
        state = monitored.TrainState()
        hooks = [monitored.StopAtStepHook(last_step=60)]
        async with monitored.MonitoredSession(state, hooks=hooks, plugin_options=OPTIONS) as sess:
            while not sess.should_stop():
                await sess.run(step)
        print("finished", state.global_step, flush=True)

    anyio.run(main)
    """
)


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONITORED_")}
    env["MONITORED_DISABLE_PLUGINS"] = "nan_guard,early_stopping,checkpoint"
    env.pop("FORCE_COLOR", None)
    env.pop("TTY_COMPATIBLE", None)
    env.update(extra)
    return env


def child_source(options: dict[str, Any]) -> str:
    return f"OPTIONS = {options!r}\n" + CHILD


def run_in_pty(source: str, env: dict[str, str], timeout: float = 60) -> str:
    """Run ``source`` in a child whose stdin, stdout and stderr are a real terminal."""
    controller, terminal = pty.openpty()
    child = subprocess.Popen(
        [sys.executable, "-c", source],
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        env={**env, "TERM": "xterm-256color", "COLUMNS": "160", "LINES": "40"},
        close_fds=True,
    )
    os.close(terminal)
    output = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([controller], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(controller, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                output += chunk
            elif child.poll() is not None:
                break
    finally:
        os.close(controller)
        child.wait(timeout=10)
    assert child.returncode == 0, output.decode(errors="replace")
    return output.decode(errors="replace")


def test_a_real_terminal_gets_a_live_bar_and_log_lines_above_it() -> None:
    options = {"progress": {"show": ["loss"], "refresh_secs": 0.02}}
    text = run_in_pty(child_source(options), child_env())
    assert "\x1b[" in text  # the live display redraws with control sequences
    assert "steps/s" in text
    assert "loss=" in text
    assert "finished 60" in text
    # The log record printed whole, on a line of its own, not inside the bar.
    [line] = [ln for ln in text.splitlines() if "halfway there" in ln]
    assert line.rstrip("\r\x1b[2K").endswith("train: halfway there")
    assert "steps/s" not in line


def test_without_a_terminal_it_writes_plain_lines_without_control_characters() -> None:
    options = {"progress": {"show": ["loss"], "log_every_secs": 0.05}}
    done = subprocess.run(
        [sys.executable, "-c", child_source(options)],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
        check=True,
    )
    lines = [ln for ln in done.stderr.splitlines() if "steps/s" in ln]
    assert lines
    assert lines[-1].startswith("done: step 60/60")
    assert "\x1b" not in done.stderr
    assert "\r" not in done.stderr
    assert "loss=" in lines[-1]
    assert "train: halfway there" in done.stderr


def test_monitored_progress_0_turns_it_off() -> None:
    options = {"progress": {"log_every_secs": 0.01}}
    done = subprocess.run(
        [sys.executable, "-c", child_source(options)],
        capture_output=True,
        text=True,
        env=child_env(MONITORED_PROGRESS="0"),
        timeout=60,
        check=True,
    )
    assert "steps/s" not in done.stderr
    assert not progress_enabled({"MONITORED_PROGRESS": "off"})
    assert progress_enabled({})


def plain_console() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, force_terminal=False, force_jupyter=False), buffer


def step_with_loss(state: monitored.TrainState) -> dict[str, Any]:
    state.global_step += 1
    return {"loss": np.float32(0.5)}


async def test_values_are_fetched_only_on_refresh_steps() -> None:
    fetched: list[bool] = []

    class Spy:
        def after_run(self, run_context: Any, run_values: Any) -> None:
            fetched.append(hook._due)

    console, buffer = plain_console()
    hook = ProgressHook(show=["loss"], every_n_steps=3, mode="plain", console=console)
    await run_session([hook, Spy()], step_with_loss, max_steps=9)
    assert fetched == [False, False, True] * 3
    assert buffer.getvalue().splitlines()[0].startswith("step 3  ")
    assert hook.values == {"loss": np.float32(0.5)}


async def test_eta_comes_from_stop_at_step_and_metrics_can_be_reported() -> None:
    console, buffer = plain_console()
    hook = ProgressHook(every_n_steps=5, mode="plain", console=console)
    hook.report({"val_accuracy": 0.91})
    await run_session([monitored.StopAtStepHook(num_steps=10), hook], step_with_loss)
    first = buffer.getvalue().splitlines()[0]
    assert first.startswith("step 5/10")
    assert "ETA" in first
    assert "val_accuracy=0.91" in first


async def test_evaluation_results_reported_in_the_session_are_shown() -> None:
    console, buffer = plain_console()
    hook = ProgressHook(every_n_steps=2, mode="plain", console=console)

    class Evaluator:
        async def after_run(self, run_context: Any, run_values: Any) -> None:
            step = run_context.session.state.global_step
            if step == 1:
                await run_context.session.report_evaluation(step, {"val_accuracy": 0.875})

    await run_session([Evaluator(), hook], step_with_loss, max_steps=4)
    lines = buffer.getvalue().splitlines()
    assert "val_accuracy=0.875" in lines[0]


async def test_checkpoint_saves_are_shown(tmp_path: Path) -> None:
    from monitored_checkpoint import CheckpointSaverHook

    console, buffer = plain_console()
    saver = CheckpointSaverHook(tmp_path, save_steps=2, asynchronous=False, handle_signals=False)
    hook = ProgressHook(every_n_steps=4, mode="plain", console=console)
    state = monitored.TrainState({"w": np.zeros(2)})
    await run_session([saver, hook], step_with_loss, state=state, max_steps=4)
    assert "checkpoint 4" in buffer.getvalue()


async def test_off_mode_and_short_plain_runs_print_nothing() -> None:
    console, buffer = plain_console()
    await run_session([ProgressHook(mode="off", console=console)], max_steps=3)
    await run_session([ProgressHook(mode="plain", console=console)], max_steps=3)
    assert buffer.getvalue() == ""


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"every_n_steps": -1}, "every_n_steps"),
        ({"mode": "fancy"}, "mode"),
        ({"show": "loss"}, "show"),
        ({"refresh_secs": 0}, "refresh_secs"),
    ],
)
def test_bad_arguments_name_the_hook_and_the_argument(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ProgressConfigError, match=f"ProgressHook: {match}"):
        ProgressHook(**kwargs)


async def test_workers_load_no_display(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD")
    monkeypatch.setenv("MONITORED_DISABLE_PLUGINS", "nan_guard,early_stopping,checkpoint")
    from monitored_progress import _plugin

    state = monitored.TrainState()
    state.initialized = True
    async with monitored.MonitoredSession(state, is_chief=False) as sess:
        assert "progress" not in [info.name for info in sess.plugins]
        assert _plugin.display_of(sess) is None
