"""Preemption: SIGTERM (or a first SIGINT) finishes the step, saves, runs end, stops."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from monitored import MonitoredSession, Scaffold, StopAtStepHook, TrainState
from monitored_checkpoint import (
    CheckpointSaverHook,
    CheckpointSaverListener,
    latest_checkpoint,
    restore_latest,
)
from monitored_checkpoint import _preemption as preemption
from monitored_checkpoint._preemption import SignalWatcher

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGTERM"), reason="POSIX signals")


class EndRecorder(CheckpointSaverListener):
    def __init__(self) -> None:
        self.ended: list[int] = []

    def end(self, session: Any, global_step_value: int) -> None:
        self.ended.append(global_step_value)


def _init(state: TrainState) -> None:
    state["w"] = np.zeros(4)


async def _train(
    directory: str, step: Any, last_step: int = 100, **hook_args: Any
) -> tuple[TrainState, CheckpointSaverHook, EndRecorder]:
    recorder = EndRecorder()
    hook_args.setdefault("save_steps", 1000)
    hook = CheckpointSaverHook(directory, listeners=[recorder], **hook_args)
    state = TrainState()
    hooks = [hook, StopAtStepHook(last_step=last_step)]
    async with MonitoredSession(state, hooks=hooks, scaffold=Scaffold(init_fn=_init)) as sess:
        while not sess.should_stop():
            await sess.run(step)
    return state, hook, recorder


def _step_signalling(at: int, *signals: signal.Signals) -> Any:
    def step(state: TrainState) -> None:
        if state.global_step == at:
            for sig in signals:
                signal.raise_signal(sig)
        state["w"] += 1
        state.global_step += 1

    return step


@pytest.mark.anyio
async def test_sigterm_finishes_the_step_saves_runs_end_and_stops(ckpt_dir: str) -> None:
    before = signal.getsignal(signal.SIGTERM)
    state, hook, recorder = await _train(ckpt_dir, _step_signalling(3, signal.SIGTERM))
    assert state.global_step == 4, "the step the signal came in was finished"
    assert hook.preempted_by == "SIGTERM"
    assert latest_checkpoint(ckpt_dir) == os.path.join(ckpt_dir, "model.ckpt-4")
    assert recorder.ended == [4]
    restored = TrainState()
    restore_latest(restored, ckpt_dir)
    assert restored.global_step == 4
    assert restored["w"].tolist() == [4.0] * 4
    assert signal.getsignal(signal.SIGTERM) is before, "the previous handler is back"


@pytest.mark.anyio
async def test_first_sigint_also_saves_and_stops(ckpt_dir: str) -> None:
    before = signal.getsignal(signal.SIGINT)
    state, hook, recorder = await _train(ckpt_dir, _step_signalling(2, signal.SIGINT))
    assert state.global_step == 3
    assert hook.preempted_by == "SIGINT"
    assert recorder.ended == [3]
    assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.anyio
async def test_repeated_sigterm_is_ignored(ckpt_dir: str) -> None:
    step = _step_signalling(1, signal.SIGTERM, signal.SIGTERM, signal.SIGTERM)
    state, _, recorder = await _train(ckpt_dir, step)
    assert state.global_step == 2
    assert recorder.ended == [2]


@pytest.mark.anyio
async def test_handlers_are_restored_after_an_error_close(ckpt_dir: str) -> None:
    before = signal.getsignal(signal.SIGTERM)
    hook = CheckpointSaverHook(ckpt_dir, save_steps=10)
    inside: list[object] = []
    with pytest.raises(ZeroDivisionError):
        async with MonitoredSession(TrainState({"w": np.zeros(2)}), hooks=[hook]):
            inside.append(signal.getsignal(signal.SIGTERM))
            raise ZeroDivisionError
    assert inside[0] is not before, "installed during the session"
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.anyio
async def test_handlers_are_restored_after_a_step_fails(ckpt_dir: str) -> None:
    """The close after a failing step cancels the watcher mid-wait: it must still restore."""
    before = signal.getsignal(signal.SIGTERM)
    hook = CheckpointSaverHook(ckpt_dir, save_steps=10)

    def step(state: TrainState) -> None:
        state.global_step += 1
        if state.global_step == 3:
            raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        async with MonitoredSession(TrainState({"w": np.zeros(2)}), hooks=[hook]) as sess:
            await anyio.sleep(0.01)  # the watcher task is waiting now
            while True:
                await sess.run(step)
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.anyio
async def test_handle_signals_false_leaves_handlers_alone(ckpt_dir: str) -> None:
    before = signal.getsignal(signal.SIGTERM)
    seen: list[object] = []

    def step(state: TrainState) -> None:
        seen.append(signal.getsignal(signal.SIGTERM))
        state.global_step += 1

    await _train(ckpt_dir, step, last_step=1, handle_signals=False)
    assert seen == [before]


def test_a_session_in_another_thread_runs_without_signal_handling(
    ckpt_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    before = signal.getsignal(signal.SIGTERM)
    result: list[Any] = []

    def worker() -> None:
        def step(state: TrainState) -> None:
            state.global_step += 1

        result.append(anyio.run(_train, ckpt_dir, step, 3))

    caplog.set_level("INFO", logger="monitored.checkpoint")
    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(30)
    state, hook, _ = result[0]
    assert state.global_step == 3
    assert hook.preempted_by is None
    assert signal.getsignal(signal.SIGTERM) is before
    assert "preemption handling is off" in caplog.text


def test_watcher_second_sigint_raises_keyboard_interrupt() -> None:
    before = signal.getsignal(signal.SIGINT)
    watcher = SignalWatcher()
    assert watcher.install()
    try:
        signal.raise_signal(signal.SIGINT)
        assert watcher.received == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is before, "abort restores the old handler"
    finally:
        watcher.uninstall()


#: A function that the abort must treat as the machinery's: defined in a module
#: named like anyio's. It sends the second SIGINT and then stays in the machinery.
MACHINERY = """
import os, signal, time

def second_sigint_inside(seconds, done):
    os.kill(os.getpid(), signal.SIGINT)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pass
    done.append(True)

def blocked_inside(seconds, done):
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(seconds)
    done.append(True)
"""


def _machinery() -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "anyio._machinery_under_test"}
    exec(compile(MACHINERY, "<anyio machinery>", "exec"), namespace)
    return namespace


@pytest.mark.skipif(not hasattr(signal, "SIGURG"), reason="needs SIGURG")
def test_a_second_sigint_inside_the_machinery_is_raised_once_out_of_it() -> None:
    machinery, done = _machinery(), []
    watcher = SignalWatcher()
    assert watcher.install()
    urg_before = signal.getsignal(signal.SIGURG)
    try:
        signal.raise_signal(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt) as caught:
            machinery["second_sigint_inside"](0.2, done)
            done.append("back in the user's code")
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:  # the interrupt comes here, within milliseconds
                time.sleep(0.001)
    finally:
        watcher.uninstall()
    assert done[0] is True, "never raised inside the machinery"
    handler, raised_in = caught.traceback[-1], caught.traceback[-2]
    assert handler.frame.code.name == "_handle"
    assert raised_in.frame.code.name == (
        "test_a_second_sigint_inside_the_machinery_is_raised_once_out_of_it"
    )
    assert signal.getsignal(signal.SIGURG) is urg_before, "the kick signal's handler is back"


@pytest.mark.skipif(not hasattr(signal, "SIGURG"), reason="needs SIGURG")
def test_a_second_sigint_held_inside_the_machinery_is_raised_there_after_a_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(preemption, "ABORT_WITHIN_SECS", 0.2)
    machinery, done = _machinery(), []
    watcher = SignalWatcher()
    assert watcher.install()
    started = time.monotonic()
    try:
        signal.raise_signal(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            machinery["blocked_inside"](30.0, done)  # blocked: only the bound ends it
    finally:
        watcher.uninstall()
    assert done == []
    assert 0.2 <= time.monotonic() - started < 5


#: An installed package's code (tensorboardX, say) that the machinery calls: it
#: sends the second SIGINT while running.
PACKAGE = """
import os, signal, time

def busy_after_sigint(seconds, done):
    os.kill(os.getpid(), signal.SIGINT)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pass
    done.append("package")
"""

CALLER = """
def calls(fn, *args):
    fn(*args)
    args[-1].append("machinery")
"""


@pytest.mark.skipif(not hasattr(signal, "SIGURG"), reason="needs SIGURG")
def test_a_second_sigint_in_a_package_the_machinery_called_is_raised_once_out_of_both() -> None:
    package: dict[str, Any] = {"__name__": "somepackage.io"}
    filename = os.path.join(os.sep, "venv", "lib", "site-packages", "somepackage", "io.py")
    exec(compile(PACKAGE, filename, "exec"), package)
    caller: dict[str, Any] = {"__name__": "monitored_summaries._under_test"}
    exec(compile(CALLER, "<monitored_summaries>", "exec"), caller)
    done: list[str] = []
    watcher = SignalWatcher()
    assert watcher.install()
    try:
        signal.raise_signal(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt) as caught:
            caller["calls"](package["busy_after_sigint"], 0.2, done)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                time.sleep(0.001)
    finally:
        watcher.uninstall()
    assert done == ["package", "machinery"], "raised inside the package or its caller"
    assert caught.traceback[-2].frame.code.name == (
        "test_a_second_sigint_in_a_package_the_machinery_called_is_raised_once_out_of_both"
    )


def test_one_signal_is_one_notice_however_many_sessions_listen(
    capfd: pytest.CaptureFixture[str],
) -> None:
    # A sweep: four trials, each with a training and an evaluation session.
    watchers = [SignalWatcher() for _ in range(8)]
    for watcher in watchers:
        assert watcher.install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert {watcher.received for watcher in watchers} == {signal.SIGTERM}
        os.kill(os.getpid(), signal.SIGTERM)  # a repeated SIGTERM: nothing more to say
        late = SignalWatcher()  # a session that started since: it stops too, unannounced
        assert late.install()
        os.kill(os.getpid(), signal.SIGTERM)
        assert late.received == signal.SIGTERM
        late.uninstall()
    finally:
        for watcher in watchers:
            watcher.uninstall()
    notices = [line for line in capfd.readouterr().err.splitlines() if "received" in line]
    assert notices == [
        "monitored-checkpoint: SIGTERM received; finishing the current step, saving a "
        "checkpoint and stopping (Ctrl-C again to abort)"
    ]


def test_a_second_sigint_aborts_even_when_a_session_started_since_the_first() -> None:
    before = signal.getsignal(signal.SIGINT)
    first, late = SignalWatcher(), SignalWatcher()
    assert first.install()
    try:
        signal.raise_signal(signal.SIGINT)
        assert late.install()  # an evaluation session, say, begun after the first Ctrl-C
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    finally:
        first.uninstall()
        late.uninstall()
    assert signal.getsignal(signal.SIGINT) is before


def test_watcher_second_sigint_goes_to_the_handler_that_was_there_before() -> None:
    # Jupyter's kernel cancels the running cell from its own SIGINT handler; a
    # KeyboardInterrupt raised inside the kernel's event loop would hang it instead.
    calls: list[int] = []

    def kernel_handler(signum: int, frame: Any) -> None:
        calls.append(signum)

    before = signal.signal(signal.SIGINT, kernel_handler)
    watcher = SignalWatcher()
    try:
        assert watcher.install()
        signal.raise_signal(signal.SIGINT)
        assert watcher.received == signal.SIGINT
        assert calls == [], "the first Ctrl-C is the watcher's"
        signal.raise_signal(signal.SIGINT)  # no KeyboardInterrupt
        assert calls == [signal.SIGINT]
        assert not watcher.installed
        assert signal.getsignal(signal.SIGINT) is kernel_handler
    finally:
        watcher.uninstall()
        signal.signal(signal.SIGINT, before)


class _MainTask:
    """Stands for ``asyncio.run``'s main task: records whether the runner cancelled it."""

    def __init__(self) -> None:
        self.cancelled = False

    def done(self) -> bool:
        return False

    def cancel(self) -> None:
        self.cancelled = True


def test_watcher_second_sigint_raises_over_an_asyncio_runners_handler() -> None:
    # asyncio.run's handler only cancels the main task: a synchronous step would run on.
    task = _MainTask()
    with asyncio.Runner() as runner:
        runners_handler = functools.partial(runner._on_sigint, main_task=task)
        before = signal.signal(signal.SIGINT, runners_handler)
        watcher = SignalWatcher()
        try:
            assert watcher.install()
            signal.raise_signal(signal.SIGINT)
            with pytest.raises(KeyboardInterrupt):
                signal.raise_signal(signal.SIGINT)
            assert not task.cancelled, "the runner's handler was not called"
            assert signal.getsignal(signal.SIGINT) is runners_handler, "and is back"
        finally:
            watcher.uninstall()
            signal.signal(signal.SIGINT, before)


def test_programs_own_handler_is_neither_the_default_nor_a_runners() -> None:
    def own(signum: int, frame: Any) -> None:
        pass

    with asyncio.Runner() as runner:
        runners = functools.partial(runner._on_sigint, main_task=_MainTask())
        assert preemption._programs_own(runners) is None
    assert preemption._programs_own(signal.default_int_handler) is None
    assert preemption._programs_own(signal.SIG_IGN) is None
    assert preemption._programs_own(signal.SIG_DFL) is None
    assert preemption._programs_own(None) is None
    assert preemption._programs_own(own) is own
    wrapped = functools.partial(own, 2)
    assert preemption._programs_own(wrapped) is wrapped


def test_watcher_leaves_a_handler_set_by_someone_else() -> None:
    watcher = SignalWatcher([signal.SIGUSR1])
    before = signal.getsignal(signal.SIGUSR1)
    assert watcher.install()

    def other(signum: int, frame: Any) -> None:
        """Someone else's handler, installed after ours."""

    signal.signal(signal.SIGUSR1, other)
    try:
        watcher.uninstall()
        assert signal.getsignal(signal.SIGUSR1) is other
    finally:
        signal.signal(signal.SIGUSR1, before)


# -- real processes -----------------------------------------------------------------------------
CHILD = textwrap.dedent(
    """
    import sys, time
    import anyio, numpy as np
    from monitored import MonitoredSession, TrainState
    from monitored_checkpoint import CheckpointSaverHook, CheckpointSaverListener

    directory, marker, pause = sys.argv[1], sys.argv[2], float(sys.argv[3])

    class End(CheckpointSaverListener):
        def end(self, session, step):
            with open(marker, "w") as f:
                f.write(str(step))

    def step(state):
        state["w"] += 1.0
        state.global_step += 1
        print("step", state.global_step, flush=True)
        time.sleep(pause)

    async def main():
        state = TrainState({"w": np.zeros(4)})
        hook = CheckpointSaverHook(directory, save_steps=1000, listeners=[End()])
        async with MonitoredSession(state, hooks=[hook]) as sess:
            while not sess.should_stop():
                await sess.run(step)
        print("stopped by", hook.preempted_by, "at", state.global_step, flush=True)

    anyio.run(main)
    """
)


def _start(
    tmp_path: Path, ckpt_dir: str, pause: float, script: Path | None = None
) -> subprocess.Popen[str]:
    if script is None:
        script = tmp_path / "child.py"
        script.write_text(CHILD)
    return subprocess.Popen(
        [sys.executable, "-u", str(script), ckpt_dir, str(tmp_path / "ended"), str(pause)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_step(child: subprocess.Popen[str], step: int) -> None:
    assert child.stdout is not None
    for line in child.stdout:
        if line.strip() == f"step {step}":
            return
    raise AssertionError(
        f"the child ended before step {step}: {child.stderr.read() if child.stderr else ''}"
    )


def test_sigterm_to_a_real_process_exits_cleanly(tmp_path: Path, ckpt_dir: str) -> None:
    child = _start(tmp_path, ckpt_dir, pause=0.05)
    try:
        _wait_for_step(child, 3)
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 0, err
    stopped_at = int(out.split("stopped by SIGTERM at ")[1].split()[0])
    assert stopped_at >= 3
    assert latest_checkpoint(ckpt_dir) == os.path.join(ckpt_dir, f"model.ckpt-{stopped_at}")
    assert (tmp_path / "ended").read_text() == str(stopped_at), "end ran"
    restored = TrainState()
    restore_latest(restored, ckpt_dir)
    assert restored["w"].tolist() == [float(stopped_at)] * 4


def test_second_sigint_aborts_a_real_process_without_half_written_files(
    tmp_path: Path, ckpt_dir: str
) -> None:
    child = _start(tmp_path, ckpt_dir, pause=2.0)
    try:
        _wait_for_step(child, 1)
        child.send_signal(signal.SIGINT)
        assert child.stderr is not None
        for line in child.stderr:  # the second Ctrl-C only once the first was seen
            if "SIGINT received" in line:
                break
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode != 0
    assert "KeyboardInterrupt" in err
    assert not (tmp_path / "ended").exists(), "an abort does not run end"
    assert not [n for n in os.listdir(ckpt_dir) if ".tmp-" in n]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        restored = TrainState()
        manifest = restore_latest(restored, ckpt_dir)
    assert manifest is not None
    assert manifest.step == 0


@pytest.mark.parametrize("runner", ["anyio.run(main)", "asyncio.run(main())"])
def test_under_anyio_or_asyncio_run_a_second_sigint_aborts_a_long_synchronous_step_at_once(
    tmp_path: Path, ckpt_dir: str, runner: str
) -> None:
    # The runner's own SIGINT handler would only cancel the main task, which takes
    # effect at the step's end, 60 s away: the abort is raised in the step instead.
    script = tmp_path / "child.py"
    script.write_text(CHILD.replace("anyio.run(main)", f"import asyncio\n{runner}"))
    child = _start(tmp_path, ckpt_dir, pause=60.0, script=script)
    try:
        _wait_for_step(child, 1)
        child.send_signal(signal.SIGINT)
        assert child.stderr is not None
        for line in child.stderr:
            if "SIGINT received" in line:
                break
        started = time.monotonic()
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=20)
        took = time.monotonic() - started
    finally:
        child.kill()
    assert child.returncode != 0
    assert "KeyboardInterrupt" in err
    assert took < 10, f"the second Ctrl-C took {took:.1f}s, not at once"
    assert not (tmp_path / "ended").exists(), "an abort does not run end"
    assert not [n for n in os.listdir(ckpt_dir) if ".tmp-" in n]


#: CHILD, with a task whose clean-up never ends (shielded from cancellation): the
#: abort's KeyboardInterrupt alone would leave the process waiting for it forever.
STUCK_CLEAN_UP = CHILD.replace(
    "async def main():\n",
    textwrap.dedent(
        """
        import monitored_checkpoint._preemption as preemption
        preemption.ABORT_REPEAT_SECS = float(sys.argv[4])

        async def stuck():
            try:
                await anyio.sleep_forever()
            finally:
                with anyio.CancelScope(shield=True):
                    await anyio.sleep(3600)

        async def train():
        """
    ).lstrip(),
).replace(
    "anyio.run(main)",
    textwrap.dedent(
        """
        async def main():
            async with anyio.create_task_group() as group:
                group.start_soon(stuck)
                await train()

        anyio.run(main)
        """
    ),
)


def test_a_clean_up_that_never_ends_is_interrupted_again_until_the_process_ends(
    tmp_path: Path, ckpt_dir: str
) -> None:
    assert "async def stuck" in STUCK_CLEAN_UP
    assert "await train()" in STUCK_CLEAN_UP
    script = tmp_path / "child.py"
    script.write_text(STUCK_CLEAN_UP)
    child = subprocess.Popen(
        [sys.executable, "-u", str(script), ckpt_dir, str(tmp_path / "ended"), "60", "1.0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for_step(child, 1)
        child.send_signal(signal.SIGINT)
        assert child.stderr is not None
        for line in child.stderr:
            if "SIGINT received" in line:
                break
        started = time.monotonic()
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=30)
        took = time.monotonic() - started
    finally:
        child.kill()
    assert child.returncode != 0
    assert "still not ended: interrupting again" in err
    assert "KeyboardInterrupt" in err
    assert 1.0 <= took < 20


def test_an_abort_outside_an_event_loop_watches_nothing() -> None:
    assert preemption._running_loop(sys._getframe()) is None


def test_overlapping_sessions_all_get_the_signal_and_the_original_handler_returns() -> None:
    from monitored_checkpoint._preemption import SignalWatcher

    before = signal.getsignal(signal.SIGTERM)
    first, second = SignalWatcher(), SignalWatcher()
    assert first.install()
    assert second.install()
    os.kill(os.getpid(), signal.SIGTERM)
    assert first.received == second.received == signal.SIGTERM
    first.uninstall()  # closing in the order they opened
    assert signal.getsignal(signal.SIGTERM) is not before, "the second still listens"
    second.uninstall()
    assert signal.getsignal(signal.SIGTERM) is before
