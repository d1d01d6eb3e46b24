"""CheckpointSaverHook in real sessions: TF1 timing, exact resume, async writes, errors."""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

import monitored
from monitored import (
    AbortedError,
    MonitoredSession,
    MonitoredTrainingSession,
    Scaffold,
    StopAtStepHook,
    TrainState,
)
from monitored._core import _plugins as plugins_module
from monitored_checkpoint import (
    CheckpointDirectoryError,
    CheckpointRestoreHook,
    CheckpointSaverHook,
    CheckpointSaverListener,
    CheckpointWriteError,
    CorruptCheckpointWarning,
    ForeignCheckpointError,
    Saver,
    latest_checkpoint,
)
from monitored_checkpoint import _hook as hook_module
from monitored_checkpoint import _plugin as plugin_module

pytestmark = pytest.mark.anyio


def new_state(seed: int = 0) -> TrainState:
    """Parameters and an optimizer slot, filled by the scaffold on a fresh start."""
    return TrainState(seed=seed)


def init(state: TrainState) -> None:
    rng = np.random.default_rng(1234)
    state["w"] = rng.standard_normal((16, 4)).astype(np.float32)
    state["m"] = np.zeros((16, 4), np.float32)


def noisy_step(state: TrainState) -> dict[str, Any]:
    """A step whose result depends on the RNG: resume must restore it exactly."""
    noise = state.rng.standard_normal(state["w"].shape).astype(np.float32)
    state["m"][...] = 0.9 * state["m"] + noise
    state["w"] -= 0.01 * state["m"]
    state.global_step += 1
    return {"loss": np.float32(np.square(state["w"]).mean())}


class Counter:
    """A hook with plugin state: how many steps it has seen (must survive a resume)."""

    def __init__(self) -> None:
        self.seen = 0

    def after_run(self, run_context: Any, run_values: Any) -> None:
        self.seen += 1

    def plugin_state(self, session: Any) -> dict[str, int]:
        return {"seen": self.seen}

    def load_plugin_state(self, session: Any, state: dict[str, int]) -> None:
        self.seen = state["seen"]


class Recorder(CheckpointSaverListener):
    """Records every listener call."""

    def __init__(self, stop_after: int | None = None) -> None:
        self.events: list[tuple[str, int | None]] = []
        self.stop_after = stop_after

    def begin(self) -> None:
        self.events.append(("begin", None))

    def before_save(self, session: Any, global_step_value: int) -> None:
        self.events.append(("before_save", global_step_value))

    def after_save(self, session: Any, global_step_value: int) -> bool:
        self.events.append(("after_save", global_step_value))
        return global_step_value == self.stop_after

    def end(self, session: Any, global_step_value: int) -> None:
        self.events.append(("end", global_step_value))


async def train(
    directory: str,
    last_step: int,
    *,
    state: TrainState | None = None,
    hooks: list[object] | None = None,
    step: Callable[[TrainState], Any] = noisy_step,
    **hook_args: Any,
) -> TrainState:
    state = state if state is not None else new_state()
    hook_args.setdefault("save_steps", 2)
    saver_hook = CheckpointSaverHook(directory, **hook_args)
    all_hooks = [*(hooks or []), saver_hook, StopAtStepHook(last_step=last_step)]
    async with MonitoredSession(state, hooks=all_hooks, scaffold=Scaffold(init_fn=init)) as sess:
        while not sess.should_stop():
            await sess.run(step)
    return state


def steps_on_disk(directory: str) -> list[int]:
    return sorted(
        int(n[len("model.ckpt-") : -5]) for n in os.listdir(directory) if n.endswith(".json")
    )


# -- TF1 timing -----------------------------------------------------------------------------------
async def test_tf1_timing_save_steps_2_last_step_5_then_resume_to_7(ckpt_dir: str) -> None:
    await train(ckpt_dir, 5)
    assert steps_on_disk(ckpt_dir) == [0, 2, 4, 5]
    resumed = await train(ckpt_dir, 7)
    assert resumed.global_step == 7
    assert steps_on_disk(ckpt_dir) == [0, 2, 4, 5, 7]
    assert latest_checkpoint(ckpt_dir) == os.path.join(ckpt_dir, "model.ckpt-7")


async def test_save_secs_saves_at_creation_and_end(ckpt_dir: str) -> None:
    await train(ckpt_dir, 6, save_steps=None, save_secs=3600)
    assert steps_on_disk(ckpt_dir) == [0, 6]


async def test_save_secs_saves_when_the_time_has_come(ckpt_dir: str) -> None:
    def slow_step(state: TrainState) -> None:
        time.sleep(0.03)
        noisy_step(state)

    await train(ckpt_dir, 6, save_steps=None, save_secs=0.05, step=slow_step)
    saved = steps_on_disk(ckpt_dir)
    assert saved[0] == 0
    assert saved[-1] == 6
    assert len(saved) >= 3, saved


async def test_max_to_keep_through_the_hook(ckpt_dir: str) -> None:
    await train(ckpt_dir, 10, save_steps=1, saver=Saver(max_to_keep=3))
    assert steps_on_disk(ckpt_dir) == [8, 9, 10]


async def test_no_save_at_end_when_the_last_step_was_saved(ckpt_dir: str) -> None:
    recorder = Recorder()
    await train(ckpt_dir, 4, listeners=[recorder])
    assert [s for e, s in recorder.events if e == "before_save"] == [0, 2, 4]


# -- exact resume ---------------------------------------------------------------------------------
async def test_resume_is_bitwise_identical_to_an_uninterrupted_run(tmp_path: Path) -> None:
    straight_counter = Counter()
    straight = await train(str(tmp_path / "a"), 10, hooks=[straight_counter])

    first_counter = Counter()
    await train(str(tmp_path / "b"), 4, hooks=[first_counter], save_steps=3)
    resumed_counter = Counter()
    resumed = await train(
        str(tmp_path / "b"), 10, state=new_state(seed=999), hooks=[resumed_counter], save_steps=3
    )

    assert resumed.global_step == straight.global_step == 10
    for name in straight:
        assert resumed[name].tobytes() == straight[name].tobytes(), name
    assert resumed.rng_state == straight.rng_state
    assert resumed_counter.seen == straight_counter.seen == 10


async def test_resume_in_a_plain_session_through_restore_state(ckpt_dir: str) -> None:
    await train(ckpt_dir, 3)
    state = new_state()
    hook = CheckpointSaverHook(ckpt_dir, save_steps=100)
    async with MonitoredSession(state, hooks=[hook]) as sess:
        assert sess.restored_from == os.path.join(ckpt_dir, "model.ckpt-3")
        assert state.global_step == 3


async def _enter_over_a_damaged_newest(ckpt_dir: str, ignored: str) -> tuple[list[Any], int]:
    """Enter a session that restores from ``ckpt_dir`` (step 3 damaged), with
    ``CorruptCheckpointWarning`` ignored in module ``ignored``: the warnings
    recorded, and the line of the ``async with``."""
    await train(ckpt_dir, 3, save_steps=1)
    await anyio.Path(ckpt_dir, "model.ckpt-3.safetensors").write_bytes(b"damaged")
    hook = CheckpointSaverHook(ckpt_dir, save_steps=100)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=CorruptCheckpointWarning, module=ignored)
        line = sys._getframe().f_lineno + 1
        async with MonitoredSession(new_state(), hooks=[hook]) as sess:
            assert sess.state.global_step == 2
    return [w for w in caught if issubclass(w.category, CorruptCheckpointWarning)], line


@pytest.mark.parametrize("thread", [True, False], ids=["worker-thread", "cupy-in-loop"])
async def test_a_skipped_checkpoint_is_reported_at_the_users_async_with(
    ckpt_dir: str, monkeypatch: pytest.MonkeyPatch, thread: bool
) -> None:
    # The restore runs in a worker thread (or, with CuPy, on the loop): either
    # way the warning points at the user's line that entered the session, so
    # that -W filters by module and the location shown are the user's.
    monkeypatch.setattr(hook_module, "_uses_cupy", lambda: not thread)
    caught, line = await _enter_over_a_damaged_newest(ckpt_dir, ignored="monitored_checkpoint")
    [warning] = caught
    assert "model.ckpt-3" in str(warning.message)
    assert (warning.filename, warning.lineno) == (__file__, line)


async def test_a_skipped_checkpoint_warning_is_filtered_by_the_users_module(
    ckpt_dir: str,
) -> None:
    caught, _ = await _enter_over_a_damaged_newest(ckpt_dir, ignored=__name__)
    assert caught == []


async def test_restore_false_starts_afresh(ckpt_dir: str) -> None:
    await train(ckpt_dir, 3)
    state = await train(ckpt_dir, 1, restore=False)
    assert state.global_step == 1


async def test_restore_hook_only_restores(ckpt_dir: str) -> None:
    await train(ckpt_dir, 3)
    state = new_state()
    async with MonitoredSession(state, hooks=[CheckpointRestoreHook(ckpt_dir)]) as sess:
        assert state.global_step == 3
        await sess.run(noisy_step)
    assert steps_on_disk(ckpt_dir) == [0, 2, 3]


async def test_recovery_restores_the_latest_checkpoint_and_stays_exact(tmp_path: Path) -> None:
    straight = await train(str(tmp_path / "a"), 8)
    failed = []

    def flaky_step(state: TrainState) -> Any:
        if state.global_step == 5 and not failed:
            failed.append(state.global_step)
            noisy_step(state)  # half a step's damage before the failure
            raise AbortedError("lost a worker")
        return noisy_step(state)

    recovered = await train(str(tmp_path / "b"), 8, step=flaky_step)
    assert failed == [5]
    for name in straight:
        assert recovered[name].tobytes() == straight[name].tobytes(), name


# -- listeners and save hookspecs ---------------------------------------------------------------
async def test_listeners_are_called_like_tf1(ckpt_dir: str) -> None:
    recorder = Recorder()
    await train(ckpt_dir, 5, listeners=[recorder])
    events = recorder.events
    assert events[0] == ("begin", None)
    assert events[-1] == ("end", 5)
    assert [s for e, s in events if e == "before_save"] == [0, 2, 4, 5]
    assert [s for e, s in events if e == "after_save"] == [0, 2, 4, 5]
    for saved in (0, 2, 4, 5):
        assert events.index(("before_save", saved)) < events.index(("after_save", saved))


async def test_async_listener_methods_are_awaited(ckpt_dir: str) -> None:
    seen: list[int] = []

    class AsyncListener:
        async def after_save(self, session: Any, global_step_value: int) -> None:
            seen.append(global_step_value)

    await train(ckpt_dir, 2, listeners=[AsyncListener()])
    assert seen == [0, 2]


@pytest.mark.parametrize("asynchronous", [False, True])
async def test_after_save_returning_true_stops_training(ckpt_dir: str, asynchronous: bool) -> None:
    recorder = Recorder(stop_after=4)
    state = await train(ckpt_dir, 100, listeners=[recorder], asynchronous=asynchronous)
    assert state.global_step == 4  # at once, also when writes are asynchronous
    assert recorder.events[-1] == ("end", 4)
    assert latest_checkpoint(ckpt_dir) == os.path.join(ckpt_dir, "model.ckpt-4")


async def test_save_hookspecs_reach_other_plugins(ckpt_dir: str) -> None:
    calls: list[tuple[str, int, str | None]] = []

    class Plugin:
        # Hears of each save before the next step, so its stop is at the saved step.
        synchronous_after_save = True

        def before_save(self, session: Any, step: int) -> None:
            calls.append(("before_save", step, None))

        def after_save(self, session: Any, step: int, path: str) -> bool:
            calls.append(("after_save", step, path))
            return step == 2

    state = await train(ckpt_dir, 100, hooks=[Plugin()])
    assert state.global_step == 2
    assert ("after_save", 2, os.path.join(ckpt_dir, "model.ckpt-2")) in calls
    assert ("before_save", 0, None) in calls


async def _written(hook: CheckpointSaverHook) -> None:
    write = hook.last_write
    assert write is not None
    assert await anyio.to_thread.run_sync(write.done.wait, 10)


class SaveAnnouncements:
    """An ``after_save`` hookspec implementation that does not ask to be synchronous."""

    def __init__(self, stop_at: int | None = None) -> None:
        self.heard: list[tuple[int, int]] = []  # (checkpoint step, step when heard)
        self.stop_at = stop_at

    def after_save(self, session: Any, step: int, path: str) -> bool:
        assert os.path.exists(path + ".json"), "heard of a checkpoint not complete on disk"
        self.heard.append((step, session.state.global_step))
        return step == self.stop_at


async def test_an_after_save_hookspec_does_not_make_saves_wait_for_the_write(
    ckpt_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes = GatedWrites(monkeypatch)
    listener = SaveAnnouncements()
    state = new_state()
    hook = CheckpointSaverHook(ckpt_dir, save_steps=2)
    plugins = [listener, hook]
    async with MonitoredSession(state, hooks=plugins, scaffold=Scaffold(init_fn=init)) as sess:
        await _written(hook)  # the save at creation
        writes.gate.clear()
        await sess.run(noisy_step)
        await sess.run(noisy_step)  # saves step 2: returns while the write waits
        await sess.run(noisy_step)
        assert hook.last_write is not None
        assert hook.last_write.step == 2
        assert not hook.last_write.done.is_set()
        assert [s for s, _ in listener.heard] == [0]
        writes.gate.set()
        assert hook.last_write.done.wait(10)
        for _ in range(3):
            await sess.run(noisy_step)
    heard = dict(listener.heard)
    assert sorted(heard) == [0, 2, 4, 6], "every save is announced once"
    assert all(when > step for step, when in listener.heard if step < 6), listener.heard
    assert heard[6] == 6, "the last save is announced at end"


async def test_an_after_save_hookspec_stop_takes_effect_at_the_next_step_boundary(
    ckpt_dir: str,
) -> None:
    listener = SaveAnnouncements(stop_at=4)
    state = await train(ckpt_dir, 100, hooks=[listener])
    [(_, heard_at)] = [(s, w) for s, w in listener.heard if s == 4]
    assert heard_at > 4
    assert state.global_step == heard_at, "training stopped where the save was announced"
    assert latest_checkpoint(ckpt_dir) == os.path.join(ckpt_dir, f"model.ckpt-{heard_at}")


async def test_a_listener_may_opt_out_of_tf1_timing(
    ckpt_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes = GatedWrites(monkeypatch)

    class Later(Recorder):
        synchronous_after_save = False

    recorder = Later()
    state = new_state()
    hook = CheckpointSaverHook(ckpt_dir, save_steps=2, listeners=[recorder])
    async with MonitoredSession(state, hooks=[hook], scaffold=Scaffold(init_fn=init)) as sess:
        await _written(hook)
        writes.gate.clear()
        await sess.run(noisy_step)
        await sess.run(noisy_step)  # the save of step 2 does not wait for its write
        assert hook.last_write is not None
        assert not hook.last_write.done.is_set()
        writes.gate.set()
    assert [s for e, s in recorder.events if e == "after_save"] == [0, 2]


async def test_a_listener_that_only_overrides_before_save_keeps_saves_asynchronous(
    ckpt_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes = GatedWrites(monkeypatch)

    class BeforeOnly(CheckpointSaverListener):
        def before_save(self, session: Any, global_step_value: int) -> None:
            pass

    state = new_state()
    hook = CheckpointSaverHook(ckpt_dir, save_steps=2, listeners=[BeforeOnly()])
    async with MonitoredSession(state, hooks=[hook], scaffold=Scaffold(init_fn=init)) as sess:
        await _written(hook)
        writes.gate.clear()
        await sess.run(noisy_step)
        await sess.run(noisy_step)
        assert hook.last_write is not None
        assert not hook.last_write.done.is_set()
        writes.gate.set()


async def test_the_default_install_saves_asynchronously(
    ckpt_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Summaries (and MLflow) implement after_save; saves still do not wait for the disk."""
    writes = GatedWrites(monkeypatch)
    state = new_state()
    async with monitored.MonitoredTrainingSession(
        state=state,
        checkpoint_dir=ckpt_dir,
        save_checkpoint_steps=2,
        save_checkpoint_secs=None,
        scaffold=Scaffold(init_fn=init),
    ) as sess:
        assert sess.implements("after_save")
        saving = [i.plugin for i in sess.plugins if isinstance(i.plugin, CheckpointSaverHook)]
        [hook] = saving
        await _written(hook)
        writes.gate.clear()
        await sess.run(noisy_step)
        await sess.run(noisy_step)
        assert hook.last_write is not None
        assert hook.last_write.step == 2
        assert not hook.last_write.done.is_set()
        writes.gate.set()
    assert steps_on_disk(ckpt_dir) == [0, 2]


async def test_a_resumed_session_prepares_its_snapshot_buffers(ckpt_dir: str) -> None:
    await train(ckpt_dir, 2)
    state = new_state()
    hook = CheckpointSaverHook(ckpt_dir, save_steps=2)
    async with MonitoredSession(state, hooks=[hook], scaffold=Scaffold(init_fn=init)):
        assert hook.last_write is None, "no save at creation: the checkpoint of step 2 exists"
        buffers = hook._buffers
        buffers._join()
        assert buffers.nbytes == sum(a.nbytes for a in state.values())


async def test_the_writer_thread_is_started_at_begin_not_in_the_first_saves_step(
    ckpt_dir: str,
) -> None:
    await train(ckpt_dir, 2)
    state = new_state()
    hook = CheckpointSaverHook(ckpt_dir, save_steps=2)
    name = f"checkpoint-writer {hook.save_path}"
    async with MonitoredSession(state, hooks=[hook], scaffold=Scaffold(init_fn=init)) as sess:
        assert hook.last_write is None, "no save at creation: the checkpoint of step 2 exists"
        [thread] = [t for t in threading.enumerate() if t.name == name]
        await sess.run(lambda s: setattr(s, "global_step", s.global_step + 1))
        await sess.run(lambda s: setattr(s, "global_step", s.global_step + 1))
        assert hook.last_write is not None
        assert hook.last_write.step == 4
        assert [t for t in threading.enumerate() if t.name == name] == [thread], "the same one"
    thread.join(5)
    assert not thread.is_alive(), "ended with the session"
    assert steps_on_disk(ckpt_dir) == [0, 2, 4]


async def test_plugin_state_is_the_one_of_the_saved_step(ckpt_dir: str) -> None:
    counter = Counter()
    await train(ckpt_dir, 5, hooks=[counter])
    from monitored_checkpoint import read_manifest
    from monitored_checkpoint._store import open_store

    manifest = read_manifest(open_store(ckpt_dir), "model.ckpt-2")
    assert manifest.plugins == {"hooks[0]:Counter": {"version": 1, "state": {"seen": 2}}}


@pytest.mark.parametrize("counter_first", [True, False], ids=["before-saver", "after-saver"])
async def test_plugin_state_is_taken_after_every_hooks_after_run(
    ckpt_dir: str, counter_first: bool
) -> None:
    """Regression: a hook called after the saver used to be saved one step old."""
    from monitored_checkpoint import read_manifest
    from monitored_checkpoint._store import open_store

    counter = Counter()
    saver_hook = CheckpointSaverHook(ckpt_dir, save_steps=2)
    hooks: list[object] = [counter, saver_hook] if counter_first else [saver_hook, counter]
    state = new_state()
    async with MonitoredSession(
        state, hooks=[*hooks, StopAtStepHook(last_step=5)], scaffold=Scaffold(init_fn=init)
    ) as sess:
        while not sess.should_stop():
            await sess.run(noisy_step)
    name = next(info.name for info in sess.plugins if info.plugin is counter)
    store = open_store(ckpt_dir)
    for step in (0, 2, 4, 5):
        manifest = read_manifest(store, f"model.ckpt-{step}")
        assert manifest.plugins[name]["state"] == {"seen": step}, step


async def test_creation_save_holds_states_set_in_after_create_session(ckpt_dir: str) -> None:
    """The step-0 checkpoint is taken after every hook's after_create_session."""
    from monitored_checkpoint import read_manifest
    from monitored_checkpoint._store import open_store

    class Armed(Counter):
        def after_create_session(self, session: Any, coord: Any) -> None:
            self.seen = 100

    hooks = [CheckpointSaverHook(ckpt_dir, save_steps=50), Armed(), StopAtStepHook(last_step=1)]
    async with MonitoredSession(new_state(), hooks=hooks, scaffold=Scaffold(init_fn=init)) as sess:
        await sess.run(noisy_step)
    manifest = read_manifest(open_store(ckpt_dir), "model.ckpt-0")
    assert manifest.plugins["hooks[1]:Armed"]["state"] == {"seen": 100}


# -- asynchronous writes ------------------------------------------------------------------------
class GatedWrites:
    """Replaces the format writer: each write waits for the gate and is counted."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail_at: int | None = None) -> None:
        from monitored_checkpoint import _saver

        self.gate = threading.Event()
        self.gate.set()
        self.in_flight = 0
        self.max_in_flight = 0
        self.started: list[int] = []
        self.fail_at = fail_at
        self._lock = threading.Lock()
        self._real = _saver.write_checkpoint_files
        monkeypatch.setattr(_saver, "write_checkpoint_files", self)

    def __call__(self, store: Any, name: str, snapshot: Any) -> Any:
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self.started.append(snapshot.step)
        try:
            assert self.gate.wait(10), "the test never opened the gate"
            if snapshot.step == self.fail_at:
                raise OSError(28, "No space left on device")
            return self._real(store, name, snapshot)
        finally:
            with self._lock:
                self.in_flight -= 1


async def test_training_goes_on_while_a_write_is_in_flight(
    ckpt_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes = GatedWrites(monkeypatch)
    writes.gate.clear()
    state = new_state()
    hook = CheckpointSaverHook(ckpt_dir, save_steps=5)
    async with MonitoredSession(state, hooks=[hook], scaffold=Scaffold(init_fn=init)) as sess:
        for _ in range(4):
            await sess.run(noisy_step)
        assert state.global_step == 4, "four steps ran while step 0 was being written"
        assert hook.last_write is not None
        assert hook.last_write.step == 0
        assert not hook.last_write.done.is_set()
        writes.gate.set()
        await sess.run(noisy_step)
    assert steps_on_disk(ckpt_dir) == [0, 5]


async def test_at_most_one_write_in_flight(ckpt_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    writes = GatedWrites(monkeypatch)
    writes.gate.clear()
    opener = threading.Timer(0.2, writes.gate.set)
    opener.start()
    await train(ckpt_dir, 6, save_steps=1)
    opener.join()
    assert writes.max_in_flight == 1
    assert writes.started == [0, 1, 2, 3, 4, 5, 6], "no save is dropped"
    assert steps_on_disk(ckpt_dir) == [2, 3, 4, 5, 6]


async def test_closing_waits_for_the_last_write(
    ckpt_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes = GatedWrites(monkeypatch)
    writes.gate.clear()
    opener = threading.Timer(0.3, writes.gate.set)
    opener.start()
    started = time.monotonic()
    await train(ckpt_dir, 3, save_steps=100)
    assert time.monotonic() - started >= 0.25
    opener.join()
    assert steps_on_disk(ckpt_dir) == [0, 3]
    assert latest_checkpoint(ckpt_dir) == os.path.join(ckpt_dir, "model.ckpt-3")


async def test_a_snapshot_is_not_changed_by_later_steps(
    ckpt_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes = GatedWrites(monkeypatch)
    writes.gate.clear()
    state = new_state()
    hook = CheckpointSaverHook(ckpt_dir, save_steps=100)
    async with MonitoredSession(state, hooks=[hook], scaffold=Scaffold(init_fn=init)) as sess:
        at_zero = state["w"].copy()
        for _ in range(3):
            await sess.run(noisy_step)
        writes.gate.set()
    restored = TrainState()
    from monitored_checkpoint import restore

    restore(restored, os.path.join(ckpt_dir, "model.ckpt-0"))
    assert restored["w"].tobytes() == at_zero.tobytes()


async def test_synchronous_saves_are_on_disk_before_the_next_step(ckpt_dir: str) -> None:
    seen: list[str | None] = []

    def step(state: TrainState) -> None:
        seen.append(latest_checkpoint(ckpt_dir))
        noisy_step(state)

    await train(ckpt_dir, 4, step=step, asynchronous=False)
    assert [Path(p).name if p else None for p in seen] == [
        "model.ckpt-0",
        "model.ckpt-0",
        "model.ckpt-2",
        "model.ckpt-2",
    ]


async def test_write_failure_is_raised_at_the_next_step_with_path_and_cause(
    ckpt_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    GatedWrites(monkeypatch, fail_at=2)
    recorder = Recorder()
    state = new_state()
    hook = CheckpointSaverHook(ckpt_dir, save_steps=2, listeners=[recorder])
    with pytest.raises(CheckpointWriteError) as raised:
        async with MonitoredSession(state, hooks=[hook], scaffold=Scaffold(init_fn=init)) as sess:
            await sess.run(noisy_step)
            await sess.run(noisy_step)  # step 2: its save fails in the background
            assert hook.last_write is not None
            assert hook.last_write.done.wait(10)
            await sess.run(noisy_step)  # the next step boundary raises
    message = str(raised.value)
    assert os.path.join(ckpt_dir, "model.ckpt-2") in message
    assert "(step 2)" in message
    assert "No space left on device" in message
    assert isinstance(raised.value.__cause__, OSError)
    assert state.global_step == 2, "the step after the failure did not run"
    assert ("end", 2) not in recorder.events, "an error close skips end"
    assert ("after_save", 2) not in recorder.events
    assert steps_on_disk(ckpt_dir) == [0]


async def test_write_failure_stops_a_loop_that_checks_should_stop(
    ckpt_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    GatedWrites(monkeypatch, fail_at=0)
    with pytest.raises(CheckpointWriteError, match=r"model\.ckpt-0"):
        await train(ckpt_dir, 1000)


async def test_failure_of_the_final_save_is_raised_on_close(
    ckpt_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    GatedWrites(monkeypatch, fail_at=3)
    with pytest.raises(CheckpointWriteError, match=r"model\.ckpt-3 \(step 3\)"):
        await train(ckpt_dir, 3, save_steps=100)
    assert steps_on_disk(ckpt_dir) == [0]


async def test_error_close_still_finishes_the_write_in_flight(
    ckpt_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes = GatedWrites(monkeypatch)
    writes.gate.clear()
    opener = threading.Timer(0.2, writes.gate.set)
    opener.start()
    hook = CheckpointSaverHook(ckpt_dir, save_steps=100)
    with pytest.raises(ZeroDivisionError):
        async with MonitoredSession(new_state(), hooks=[hook], scaffold=Scaffold(init_fn=init)):
            raise ZeroDivisionError
    opener.join()
    assert steps_on_disk(ckpt_dir) == [0], "the write in flight was completed, not cut"


# -- setup errors -----------------------------------------------------------------------------
def _write_tf1_state_file(directory: str) -> None:
    os.makedirs(directory)
    Path(directory, "checkpoint").write_text('model_checkpoint_path: "model.ckpt-9"\n')


async def test_foreign_directory_fails_at_the_start(ckpt_dir: str) -> None:
    _write_tf1_state_file(ckpt_dir)
    with pytest.raises(ForeignCheckpointError):
        await train(ckpt_dir, 3)


async def test_bad_directory_fails_at_the_start(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(CheckpointDirectoryError, match="cannot be created"):
        await train(str(tmp_path / "file" / "ckpt"), 3)


def test_hook_arguments_are_checked(ckpt_dir: str) -> None:
    with pytest.raises(ValueError, match="exactly one of save_secs and save_steps"):
        CheckpointSaverHook(ckpt_dir)
    with pytest.raises(ValueError, match="exactly one of save_secs and save_steps"):
        CheckpointSaverHook(ckpt_dir, save_secs=1, save_steps=1)
    with pytest.raises(ValueError, match="checkpoint_basename"):
        CheckpointSaverHook(ckpt_dir, save_steps=1, checkpoint_basename="a/b")
    with pytest.raises(ValueError, match="every_steps must be positive"):
        CheckpointSaverHook(ckpt_dir, save_steps=0)


async def test_checkpoints_on_an_fsspec_url(mem_dir: str) -> None:
    straight = await train(mem_dir, 3)
    resumed = await train(mem_dir, 5)
    assert resumed.global_step == 5
    assert latest_checkpoint(mem_dir) == f"{mem_dir}/model.ckpt-5"
    assert straight.global_step == 3


async def test_basename_is_used(ckpt_dir: str) -> None:
    await train(ckpt_dir, 1, checkpoint_basename="net")
    names = sorted(n for n in os.listdir(ckpt_dir) if not n.startswith("."))
    assert names[1:3] == ["net-0.json", "net-0.safetensors"]


# -- MonitoredTrainingSession and the plugin -----------------------------------------------------
async def run_mts(directory: str, last_step: int, **kwargs: Any) -> TrainState:
    state = new_state()
    async with MonitoredTrainingSession(
        state,
        checkpoint_dir=directory,
        scaffold=Scaffold(init_fn=init),
        hooks=[StopAtStepHook(last_step=last_step)],
        log_step_count_steps=None,
        **kwargs,
    ) as sess:
        while not sess.should_stop():
            await sess.run(noisy_step)
    return state


async def test_monitored_training_session_checkpoints_and_resumes(ckpt_dir: str) -> None:
    await run_mts(ckpt_dir, 5, save_checkpoint_steps=2)
    assert steps_on_disk(ckpt_dir) == [0, 2, 4, 5]
    state = await run_mts(ckpt_dir, 7, save_checkpoint_steps=2)
    assert state.global_step == 7
    assert steps_on_disk(ckpt_dir) == [0, 2, 4, 5, 7]


async def test_monitored_training_session_default_is_every_600_secs(ckpt_dir: str) -> None:
    await run_mts(ckpt_dir, 3)
    assert steps_on_disk(ckpt_dir) == [0, 3]


async def test_monitored_training_session_without_intervals_only_restores(ckpt_dir: str) -> None:
    await run_mts(ckpt_dir, 2, save_checkpoint_steps=2)
    state = await run_mts(ckpt_dir, 4, save_checkpoint_secs=None, save_checkpoint_steps=None)
    assert state.global_step == 4
    assert steps_on_disk(ckpt_dir) == [0, 2]


def test_plugin_contributes_hooks_per_config() -> None:
    from monitored import TrainingConfig

    [hook] = (
        plugin_module.training_hooks(
            TrainingConfig(checkpoint_dir="d", save_checkpoint_steps=3, save_checkpoint_secs=None)
        )
        or []
    )
    assert isinstance(hook, CheckpointSaverHook)
    [both] = (
        plugin_module.training_hooks(
            TrainingConfig(checkpoint_dir="d", save_checkpoint_steps=3, save_checkpoint_secs=9)
        )
        or []
    )
    assert isinstance(both, CheckpointSaverHook)
    [restore_only] = (
        plugin_module.training_hooks(TrainingConfig(checkpoint_dir="d", save_checkpoint_secs=None))
        or []
    )
    assert isinstance(restore_only, CheckpointRestoreHook)
    assert plugin_module.training_hooks(TrainingConfig()) is None
    assert plugin_module.training_hooks(TrainingConfig(checkpoint_dir="d", is_chief=False)) is None
    assert plugin_module.chief_only is True


def test_plugin_is_installed_under_the_name_checkpoint() -> None:
    from monitored import installed_plugins

    [info] = [p for p in installed_plugins() if p.name == "checkpoint"]
    assert info.distribution == "monitored-checkpoint"
    assert info.plugin is plugin_module


def test_public_names() -> None:
    import monitored_checkpoint

    ours = {
        name
        for name, value in vars(monitored_checkpoint).items()
        if not name.startswith("_")
        and getattr(value, "__module__", "").startswith("monitored_checkpoint.")
    }
    assert ours <= set(monitored_checkpoint.__all__), "every public object is exported"
    assert len(monitored_checkpoint.__all__) == len(set(monitored_checkpoint.__all__))
    for name in monitored_checkpoint.__all__:
        assert hasattr(monitored_checkpoint, name), name
    assert "CheckpointSaverHook" in ours
    assert "latest_checkpoint" in ours


async def test_a_checkpoint_the_state_file_lost_is_not_rewritten_in_place(ckpt_dir: str) -> None:
    await train(ckpt_dir, 4)
    os.remove(os.path.join(ckpt_dir, "checkpoint"))
    data = os.path.join(ckpt_dir, "model.ckpt-4.safetensors")
    before = os.stat(data).st_mtime_ns
    state = await train(ckpt_dir, 4)  # restores step 4, already at its last step
    assert state.global_step == 4
    assert os.stat(data).st_mtime_ns == before


async def test_a_traced_step_shows_the_snapshot_and_the_background_write(tmp_path: Path) -> None:
    profiler = monitored.ProfilerHook(save_steps=2, output_dir=tmp_path / "traces")
    saver = CheckpointSaverHook(tmp_path / "ckpt", save_steps=2)
    state = monitored.TrainState({"w": np.zeros(1000, np.float32)})
    async with monitored.MonitoredSession(
        state, hooks=[profiler, saver, monitored.StopAtStepHook(last_step=3)]
    ) as sess:
        while not sess.should_stop():
            await sess.run(lambda s: setattr(s, "global_step", s.global_step + 1))
    trace = json.loads((tmp_path / "traces" / "timeline-2.json").read_text())["traceEvents"]
    by_name = {event["name"]: event for event in trace}
    snapshot, write = by_name["checkpoint.snapshot"], by_name["checkpoint.write"]
    assert (snapshot["tid"], snapshot["args"]["bytes"]) == ("step loop", 4000)
    assert write["ph"] == "X"
    assert write["tid"].startswith("checkpoint-writer")
    assert write["args"]["background"] is True
    assert write["args"]["path"].endswith("model.ckpt-2")
    assert ("checkpoint", "write (background)") in profiler.costs


# -- options (TF's RunConfig keep_checkpoint_max, issue 22) ------------------------------------
async def test_plugin_options_max_to_keep_keeps_that_many_checkpoints(ckpt_dir: str) -> None:
    await run_mts(
        ckpt_dir, 6, save_checkpoint_steps=1, plugin_options={"checkpoint": {"max_to_keep": 3}}
    )
    assert steps_on_disk(ckpt_dir) == [4, 5, 6]


async def test_plugin_options_max_to_keep_0_keeps_every_checkpoint(ckpt_dir: str) -> None:
    await run_mts(
        ckpt_dir, 7, save_checkpoint_steps=1, plugin_options={"checkpoint": {"max_to_keep": 0}}
    )
    assert steps_on_disk(ckpt_dir) == list(range(8))


async def test_plugin_options_from_the_environment(
    ckpt_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MONITORED_PLUGIN_OPTIONS", "checkpoint.max_to_keep=2")
    await run_mts(ckpt_dir, 5, save_checkpoint_steps=1)
    assert steps_on_disk(ckpt_dir) == [4, 5]


def test_plugin_options_keep_checkpoint_every_n_hours_reaches_the_saver() -> None:
    from monitored import TrainingConfig

    [hook] = (
        plugin_module.training_hooks(
            TrainingConfig(
                checkpoint_dir="d",
                save_checkpoint_secs=60,
                plugin_options={
                    "checkpoint": {"max_to_keep": 1, "keep_checkpoint_every_n_hours": 0.5}
                },
            )
        )
        or []
    )
    assert isinstance(hook, CheckpointSaverHook)
    assert (hook.saver.max_to_keep, hook.saver.keep_checkpoint_every_n_hours) == (1, 0.5)
    assert [option.name for option in plugin_module.declare_options()] == [
        "max_to_keep",
        "keep_checkpoint_every_n_hours",
    ]


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"max_to_keep": -1}, "PluginOptionError", r"checkpoint\.max_to_keep=-1: give the number"),
        (
            {"keep_checkpoint_every_n_hours": 0.0},
            "PluginOptionError",
            r"checkpoint\.keep_checkpoint_every_n_hours=0\.0: give a positive number",
        ),
        (
            {"keep_checkpoint_every_n_hours": float("nan")},
            "PluginOptionError",
            r"checkpoint\.keep_checkpoint_every_n_hours=nan",
        ),
        (
            {"max_to_keep": "3"},
            "PluginOptionError",
            r"option checkpoint\.max_to_keep: expected an int",
        ),
        (
            {"max_keep": 3},
            "PluginOptionError",
            r"has no option 'max_keep'.*did you mean 'max_to_keep'",
        ),
    ],
)
async def test_plugin_options_bad_values_are_refused_naming_the_option(
    ckpt_dir: str, options: dict[str, Any], error: str, match: str
) -> None:
    import monitored

    with pytest.raises(getattr(monitored, error), match=match):
        await run_mts(ckpt_dir, 2, save_checkpoint_steps=1, plugin_options={"checkpoint": options})
    assert _no_checkpoint(ckpt_dir)


# -- the hook's methods called directly (TF1 users' own hook tests, issue 22) -------------------
async def test_after_create_session_called_directly_saves_at_once(ckpt_dir: str) -> None:
    """TF1's hook tests call ``hook.after_create_session(session, coord)`` themselves,
    outside the session's creation: the save it defers to after every hook runs now."""
    recorder = Recorder()
    hook = CheckpointSaverHook(ckpt_dir, save_steps=2, listeners=[recorder], handle_signals=False)
    async with MonitoredSession(new_state(), scaffold=Scaffold(init_fn=init)) as sess:
        await hook.begin(sess)
        await hook.after_create_session(sess, sess.coord)
        assert ("before_save", 0) in recorder.events  # saved before the call returned
        await sess.run(noisy_step)
        await sess.run(noisy_step)
        # after_run, called directly too: the save of step 2 is handed back to await.
        context = monitored.SessionRunContext(None, sess)
        saving = hook.after_run(context, monitored.SessionRunValues(None))
        assert saving is not None
        await saving
        await hook.end(sess)
    assert steps_on_disk(ckpt_dir) == [0, 2]
    assert recorder.events[-1] == ("end", 2)


def _no_checkpoint(directory: str) -> bool:
    return not os.path.exists(directory) or steps_on_disk(directory) == []


# -- a plugin failing at the end ------------------------------------------------------------------
class FailingEnd:
    """A hook whose ``end`` raises, called before the saver's (``tryfirst``)."""

    @monitored.hookimpl(tryfirst=True)
    def end(self, session: Any) -> None:
        raise OSError("the end of this hook failed")


class AlsoFailingEnd:
    def end(self, session: Any) -> None:
        raise ValueError("and so did this one")


async def test_a_failing_end_does_not_cost_the_final_checkpoint(ckpt_dir: str) -> None:
    saver = CheckpointSaverHook(ckpt_dir, save_steps=2)
    hooks = [saver, StopAtStepHook(last_step=5), FailingEnd(), AlsoFailingEnd()]
    with pytest.raises(OSError, match="the end of this hook failed") as caught:
        async with MonitoredSession(new_state(), hooks=hooks, scaffold=Scaffold(init_fn=init)) as s:
            while not s.should_stop():
                await s.run(noisy_step)
    assert steps_on_disk(ckpt_dir) == [0, 2, 4, 5], "every end ran, the saver's too"
    assert latest_checkpoint(ckpt_dir) == os.path.join(ckpt_dir, "model.ckpt-5")
    notes = caught.value.__notes__
    assert "raised in hook 'end' of hook 'hooks[2]:FailingEnd'" in notes[0]
    assert "hook 'end' of hook 'hooks[3]:AlsoFailingEnd'" in notes[1]
    assert "ValueError: and so did this one" in notes[1]


FAILING_END_PLUGIN = """
class FailingEnd:
    def end(self, session):
        raise OSError("the end of this hook failed")

def training_hooks(config):
    return [FailingEnd()]
"""


async def test_a_failing_end_of_a_training_hooks_hook_does_not_cost_the_final_checkpoint(
    ckpt_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An installed plugin named to sort before "checkpoint": its training hook's end
    # is called before the checkpoint hook's.
    real = plugins_module.installed_entry_points()
    site = tmp_path / "site"
    site.mkdir()
    (site / "fake_aaa_plugin.py").write_text(FAILING_END_PLUGIN)
    info = site / "monitored_aaa-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: monitored-aaa\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[monitored]\naaa = fake_aaa_plugin\n")
    monkeypatch.syspath_prepend(str(site))
    fake = tuple(
        ep
        for dist in importlib.metadata.distributions(path=[str(site)])
        for ep in dist.entry_points
        if ep.group == "monitored"
    )
    monkeypatch.setattr(plugins_module, "installed_entry_points", lambda: (*fake, *real))
    try:
        with pytest.raises(OSError, match="the end of this hook failed") as caught:
            async with MonitoredTrainingSession(
                new_state(),
                checkpoint_dir=ckpt_dir,
                save_checkpoint_steps=2,
                hooks=[StopAtStepHook(last_step=5)],
                scaffold=Scaffold(init_fn=init),
                log_step_count_steps=None,
            ) as sess:
                while not sess.should_stop():
                    await sess.run(noisy_step)
    finally:
        sys.modules.pop("fake_aaa_plugin", None)
    assert latest_checkpoint(ckpt_dir) == os.path.join(ckpt_dir, "model.ckpt-5")
    assert "<aaa>" in caught.value.__notes__[0], caught.value.__notes__
