"""TensorFlow's ``CheckpointSaverHook`` tests (``basic_session_run_hooks_test.py``),
ported to the ``monitored-checkpoint`` plugin's hook (skipped without the plugin).

TF drives most of them through its private ``_HookedSession``, which calls
``before_run``/``after_run`` but never ``after_create_session`` (so the first save
happens in the first step, not at creation); :class:`HookedSession` reproduces that
harness around a real ``MonitoredSession``. Tests that TF runs in a real
``SingularMonitoredSession`` (or that call ``after_create_session``) run the hook
directly, saving at creation as TF's does; a test that calls
``hook.after_create_session(sess, None)`` itself does so here too (the save the
hook defers runs at once outside a session event).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _tf1 import MOCK_START_TIME, FakeClock, do_step, step_by

import monitored
from monitored import SingularMonitoredSession, TrainState

ckpt = pytest.importorskip("monitored_checkpoint")


class MockCheckpointSaverListener:
    def __init__(self) -> None:
        self.begin_count = 0
        self.before_save_count = 0
        self.after_save_count = 0
        self.end_count = 0
        self.ask_for_stop = False

    def begin(self) -> None:
        self.begin_count += 1

    def before_save(self, session: Any, global_step: int) -> None:
        self.before_save_count += 1

    def after_save(self, session: Any, global_step: int) -> bool | None:
        self.after_save_count += 1
        return True if self.ask_for_stop else None

    def end(self, session: Any, global_step: int) -> None:
        self.end_count += 1

    def get_counts(self) -> dict[str, int]:
        return {
            "begin": self.begin_count,
            "before_save": self.before_save_count,
            "after_save": self.after_save_count,
            "end": self.end_count,
        }


def saver_hook(model_dir: Path, **kwargs: Any) -> Any:
    return ckpt.CheckpointSaverHook(
        str(model_dir), asynchronous=False, handle_signals=False, **kwargs
    )


class HookedSession:
    """TF's ``_HookedSession`` harness: the hook sees every event but
    ``after_create_session`` (``begin`` and ``end`` are called as TF's test calls them)."""

    def __init__(self, hook: Any) -> None:
        self.hook = hook

    def begin(self, session: Any) -> Any:
        return self.hook.begin(session)

    def after_run(self, run_context: Any, run_values: Any) -> Any:
        return self.hook.after_run(run_context, run_values)

    def end(self, session: Any) -> Any:
        return self.hook.end(session)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr("monitored._core._timer.time", fake)
    return fake


def saved_global_step(model_dir: Path) -> int:
    """TF's ``checkpoint_utils.load_variable(model_dir, global_step.name)``."""
    state = TrainState()
    assert ckpt.restore_latest(state, str(model_dir)) is not None
    return state.global_step


def test_CheckpointSaverHookTest_test_raise_in_both_secs_and_steps(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        saver_hook(tmp_path, save_secs=10, save_steps=20)


def test_CheckpointSaverHookTest_test_raise_in_none_secs_and_steps(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        saver_hook(tmp_path)


async def test_CheckpointSaverHookTest_test_save_secs_calls_listeners_at_begin_and_end(
    tmp_path: Path,
) -> None:
    listener = MockCheckpointSaverListener()
    hook = saver_hook(tmp_path, save_secs=2, listeners=[listener])
    async with monitored.MonitoredSession(TrainState(), hooks=[hook]) as sess:
        await sess.run(do_step)  # the hook saved before this step (at creation)
        await sess.run(do_step)  # not here, so it saves at the end
    assert listener.get_counts() == {"begin": 1, "before_save": 2, "after_save": 2, "end": 1}


async def _listener_with_session(model_dir: Path, listeners: list[Any]) -> int:
    hook = saver_hook(model_dir, save_steps=1, listeners=listeners)
    async with SingularMonitoredSession(TrainState(), hooks=[hook]) as sess:
        await sess.run(do_step)
        await sess.run(do_step)
        global_step_val = sess.state.global_step
    return global_step_val


async def test_CheckpointSaverHookTest_test_listener_with_monitored_session(
    tmp_path: Path,
) -> None:
    listener = MockCheckpointSaverListener()
    assert await _listener_with_session(tmp_path, [listener]) == 2
    assert listener.get_counts() == {"begin": 1, "before_save": 3, "after_save": 3, "end": 1}


async def test_CheckpointSaverHookTest_test_listener_stops_training_in_after_save(
    tmp_path: Path,
) -> None:
    listener = MockCheckpointSaverListener()
    hook = saver_hook(tmp_path, save_steps=1, listeners=[listener])
    async with SingularMonitoredSession(TrainState(), hooks=[hook]) as sess:
        await sess.run(do_step)
        assert not sess.should_stop()
        await sess.run(do_step)
        assert not sess.should_stop()
        listener.ask_for_stop = True
        await sess.run(do_step)
        assert sess.should_stop()


async def _restored_global_step(model_dir: Path) -> int:
    manager = monitored.SessionManager(saver=ckpt.Saver(), checkpoint_dir=str(model_dir))
    async with SingularMonitoredSession(TrainState(), session_manager=manager) as sess2:
        return sess2.state.global_step


async def test_CheckpointSaverHookTest_test_listener_with_default_saver(tmp_path: Path) -> None:
    listener = MockCheckpointSaverListener()
    assert await _listener_with_session(tmp_path, [listener]) == 2
    assert listener.get_counts() == {"begin": 1, "before_save": 3, "after_save": 3, "end": 1}
    assert await _restored_global_step(tmp_path) == 2


async def test_CheckpointSaverHookTest_test_two_listeners_with_default_saver(
    tmp_path: Path,
) -> None:
    listener1, listener2 = MockCheckpointSaverListener(), MockCheckpointSaverListener()
    assert await _listener_with_session(tmp_path, [listener1, listener2]) == 2
    assert listener1.get_counts() == {"begin": 1, "before_save": 3, "after_save": 3, "end": 1}
    assert listener1.get_counts() == listener2.get_counts()
    assert await _restored_global_step(tmp_path) == 2


async def test_CheckpointSaverHookTest_test_save_checkpoint_before_first_train_step(
    tmp_path: Path,
) -> None:
    # As TF's test: the _HookedSession harness, and after_create_session called by
    # the test itself, outside any session event (its deferred save runs at once).
    hook = saver_hook(tmp_path, save_steps=2)
    async with monitored.MonitoredSession(TrainState(), hooks=[HookedSession(hook)]) as sess:
        await hook.after_create_session(sess, None)
        # Verifies that checkpoint is saved at step 0.
        assert saved_global_step(tmp_path) == 0
        # Not saved after one step.
        await sess.run(do_step)
        assert saved_global_step(tmp_path) == 0
        # Saved after save_steps.
        await sess.run(do_step)
        assert saved_global_step(tmp_path) == 2


async def test_CheckpointSaverHookTest_test_save_saves_at_end(tmp_path: Path) -> None:
    hook = saver_hook(tmp_path, save_secs=2)
    async with monitored.MonitoredSession(TrainState(), hooks=[hook]) as sess:
        await sess.run(do_step)
        await sess.run(do_step)
    assert saved_global_step(tmp_path) == 2


async def _saves_after_each(model_dir: Path, train_op: Any, expected: list[int], **kw: Any) -> None:
    hook = saver_hook(model_dir, **kw)
    async with monitored.MonitoredSession(TrainState(), hooks=[HookedSession(hook)]) as sess:
        for step_saved in expected:
            await sess.run(train_op)
            assert saved_global_step(model_dir) == step_saved


async def test_CheckpointSaverHookTest_test_saves_when_saver_and_scaffold_both_missing(
    tmp_path: Path,
) -> None:
    await _saves_after_each(tmp_path, do_step, [1], save_steps=1)


async def test_CheckpointSaverHookTest_test_save_secs_saves_in_first_step(tmp_path: Path) -> None:
    await _saves_after_each(tmp_path, do_step, [1], save_secs=2)


async def test_CheckpointSaverHookTest_test_save_secs_saves_periodically(
    tmp_path: Path, clock: FakeClock
) -> None:
    hook = saver_hook(tmp_path, save_secs=2)
    async with monitored.MonitoredSession(TrainState(), hooks=[HookedSession(hook)]) as sess:
        clock.value = MOCK_START_TIME
        await sess.run(do_step)  # saved
        clock.value = MOCK_START_TIME + 0.5
        await sess.run(do_step)  # not saved
        assert saved_global_step(tmp_path) == 1
        clock.value = MOCK_START_TIME + 2.5  # 2.5 seconds later
        await sess.run(do_step)  # saved
        clock.value = MOCK_START_TIME + 2.6
        await sess.run(do_step)  # not saved
        clock.value = MOCK_START_TIME + 2.7
        await sess.run(do_step)  # not saved
        assert saved_global_step(tmp_path) == 3
        clock.value = MOCK_START_TIME + 10  # 7.5 seconds more
        await sess.run(do_step)  # saved
        assert saved_global_step(tmp_path) == 6


async def test_CheckpointSaverHookTest_test_save_secs_calls_listeners_periodically(
    tmp_path: Path, clock: FakeClock
) -> None:
    listener = MockCheckpointSaverListener()
    hook = saver_hook(tmp_path, save_secs=2, listeners=[listener])
    async with monitored.MonitoredSession(TrainState(), hooks=[HookedSession(hook)]) as sess:
        for offset in [0.5, 0.5, 3.0, 3.5, 4.0, 6.5, 7.0]:  # saves at 0.5, 3.0, 6.5
            clock.value = MOCK_START_TIME + offset
            await sess.run(do_step)
        clock.value = MOCK_START_TIME + 7.5  # and at the end
    assert listener.get_counts() == {"begin": 1, "before_save": 4, "after_save": 4, "end": 1}


async def test_CheckpointSaverHookTest_test_save_steps_saves_in_first_step(tmp_path: Path) -> None:
    await _saves_after_each(tmp_path, do_step, [1], save_steps=2)


async def test_CheckpointSaverHookTest_test_save_steps_saves_periodically(tmp_path: Path) -> None:
    await _saves_after_each(tmp_path, do_step, [1, 1, 3, 3, 5], save_steps=2)


async def test_ResourceCheckpointSaverHookTest_test_save_steps_saves_periodically(
    tmp_path: Path,
) -> None:
    # TF's resource-variable global step: the same scenario, one kind of step here.
    await _saves_after_each(tmp_path, do_step, [1, 1, 3, 3, 5], save_steps=2)


# --- CheckpointSaverHookMultiStepTest: each run adds steps_per_run = 5 to the global
# step. TF tells the hook through a private setter; here the hook reads the step.


async def test_CheckpointSaverHookMultiStepTest_test_save_steps_saves_in_first_step(
    tmp_path: Path,
) -> None:
    await _saves_after_each(tmp_path, step_by(5), [5], save_steps=2 * 5)


async def test_CheckpointSaverHookMultiStepTest_test_save_steps_saves_periodically(
    tmp_path: Path,
) -> None:
    await _saves_after_each(tmp_path, step_by(5), [5, 5, 15, 15, 25], save_steps=2 * 5)


async def test_CheckpointSaverHookMultiStepTest_test_save_steps_saves_at_end(
    tmp_path: Path,
) -> None:
    hook = saver_hook(tmp_path, save_steps=2 * 5)
    async with monitored.MonitoredSession(TrainState(), hooks=[HookedSession(hook)]) as sess:
        await sess.run(step_by(5))
        await sess.run(step_by(5))
    assert saved_global_step(tmp_path) == 10
