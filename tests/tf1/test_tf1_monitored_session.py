"""TensorFlow's ``monitored_session_test.py``, ported to ``monitored``.

TF's graph and tensors become a :class:`~monitored.TrainState` and step functions:
``session.run(do_step)`` is ``await sess.run(do_step)`` (the step adds one to the
global step and returns it), ``session.run(gstep)`` runs :func:`read_step`, and
``feed_dict={c: 51}`` is a keyword argument of the step. TF's session creators
become a hook counting ``after_create_session`` (one call per created session).
Where ``monitored`` differs on purpose, the test asserts ``monitored``'s documented
behaviour and says so ("Deliberate differences" in ``docs/tf1-migration.md``).
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _tf1 import do_step

import monitored
from monitored import (
    MonitoredSession,
    Scaffold,
    SessionRunArgs,
    SessionRunValues,
    SingularMonitoredSession,
    StopAtStepHook,
    TrainState,
)


class UnknownError(Exception):
    """TF's ``errors.UnknownError``: not a preemption."""


class CancelledError(Exception):
    """TF's ``errors.CancelledError``."""


def read_step(state: TrainState) -> dict[str, Any]:
    """TF's ``session.run(gstep)``: reads the global step, changes nothing."""
    return {"global_step": state.global_step}


def identity(state: TrainState, c: Any = 0) -> dict[str, Any]:
    """TF's ``v = identity(c)`` run with ``feed_dict={c: value}``."""
    state.global_step += 1
    return {"v": c}


def gstep(outputs: Any) -> int:
    return int(outputs["global_step"])


class FakeHook(monitored.SessionRunHook):
    def __init__(self) -> None:
        self.should_stop = False
        self.request: SessionRunArgs | None = None
        self.call_counter: collections.Counter[str] = collections.Counter()
        self.last_run_context: Any = None
        self.last_run_values: Any = None

    def begin(self, session: Any) -> None:
        self.call_counter["begin"] += 1

    def after_create_session(self, session: Any, coord: Any) -> None:
        self.call_counter["after_create_session"] += 1

    def before_run(self, run_context: Any) -> Any:
        self.call_counter["before_run"] += 1
        self.last_run_context = run_context
        return self.request

    def after_run(self, run_context: Any, run_values: Any) -> None:
        self.call_counter["after_run"] += 1
        self.last_run_values = run_values
        if self.should_stop:
            run_context.request_stop()

    def end(self, session: Any) -> None:
        self.call_counter["end"] += 1


class CountingSessionCreator(monitored.SessionRunHook):
    """TF's creator that counts created sessions: here, ``after_create_session`` calls."""

    def __init__(self) -> None:
        self.number_of_sessions_created = 0

    def after_create_session(self, session: Any, coord: Any) -> None:
        self.number_of_sessions_created += 1


class RaiseOnceAtCountN(monitored.SessionRunHook):
    """Raises ``ex`` from ``before_run`` the ``n``-th time it is called."""

    def __init__(self, n: int, ex: BaseException | type[BaseException]) -> None:
        self.n = n
        self.ex = ex
        self.raised = False

    def before_run(self, run_context: Any) -> None:
        self.n -= 1
        if self.n == 0 and not self.raised:
            self.raised = True
            raise self.ex


class StopCoordinatorWithException(monitored.SessionRunHook):
    """A thread of this hook stops the coordinator with an exception after N runs."""

    def __init__(
        self, calls_before_stopping: int, exception_to_raise: BaseException | None = None
    ) -> None:
        self._started_the_side_thread_already = False
        self._lock = threading.Lock()
        self._stored_exception_event = threading.Event()
        self._calls_before_stopping = calls_before_stopping
        self._exception_to_raise = exception_to_raise or monitored.AbortedError("Aborted at N")

    def _maybe_stop_with_exception(self, coord: monitored.Coordinator) -> None:
        while True:
            with self._lock:
                if self._calls_before_stopping == 0:
                    try:
                        raise self._exception_to_raise
                    except Exception as e:
                        coord.request_stop(e)
                        self._stored_exception_event.set()
                        break
            if coord.should_stop():  # the session closed first (not in TF's version)
                break
            time.sleep(0.001)

    def after_create_session(self, session: Any, coord: Any) -> None:
        if self._started_the_side_thread_already:
            return
        separate_thread = threading.Thread(
            target=self._maybe_stop_with_exception, args=(coord,), daemon=True
        )
        coord.register_thread(separate_thread)  # the coordinator joins it
        separate_thread.start()
        self._started_the_side_thread_already = True

    def after_run(self, run_context: Any, run_values: Any) -> None:
        stopping_now = False
        with self._lock:
            self._calls_before_stopping -= 1
            if self._calls_before_stopping == 0:
                stopping_now = True
        if stopping_now:
            self._stored_exception_event.wait()


class FailTrainingAfterCoordinatorStopped(StopCoordinatorWithException):
    """After N runs the coordinator holds an AbortedError and the step fails."""

    def __init__(self, calls_before_stopping: int) -> None:
        super().__init__(calls_before_stopping)
        self._coord: Any = None

    def after_create_session(self, session: Any, coord: Any) -> None:
        self._coord = coord
        super().after_create_session(session, coord)

    def after_run(self, run_context: Any, run_values: Any) -> None:
        super().after_run(run_context, run_values)
        try:
            # After a run, an exception could have been stored in the coordinator.
            self._coord.raise_requested_exception()
        except monitored.AbortedError:
            # The main thread got stuck and its session was garbage-collected.
            raise CancelledError("Session got garbage-collected.") from None


# --- ScaffoldTest ---------------------------------------------------------------------------


def test_ScaffoldTest_test_nothing_created_before_finalize() -> None:
    scaffold = Scaffold()
    assert scaffold.init_fn is None
    assert scaffold.ready_fn is None
    assert scaffold.ready_for_local_init_fn is None
    assert scaffold.local_init_fn is None


def _fns(*values: int) -> list[Any]:
    return [lambda state, v=v: v for v in values]


def test_ScaffoldTest_test_uses_passed_values() -> None:
    init_fn, ready_fn, ready_for_local_init_fn, local_init_fn = _fns(4, 5, 6, 7)
    scaffold = Scaffold(
        init_fn=init_fn,
        ready_fn=ready_fn,
        ready_for_local_init_fn=ready_for_local_init_fn,
        local_init_fn=local_init_fn,
    )
    assert scaffold.init_fn is init_fn
    assert scaffold.ready_fn is ready_fn
    assert scaffold.ready_for_local_init_fn is ready_for_local_init_fn
    assert scaffold.local_init_fn is local_init_fn


def test_ScaffoldTest_test_new_scaffold_from_default_scaffold() -> None:
    scaffold1 = Scaffold()
    init_fn, ready_fn, ready_for_local_init_fn, local_init_fn = _fns(4, 5, 6, 7)
    scaffold2 = Scaffold(
        init_fn=init_fn,
        ready_fn=ready_fn,
        ready_for_local_init_fn=ready_for_local_init_fn,
        local_init_fn=local_init_fn,
        copy_from_scaffold=scaffold1,
    )
    assert scaffold2.init_fn is init_fn
    assert scaffold2.ready_fn is ready_fn
    assert scaffold2.ready_for_local_init_fn is ready_for_local_init_fn
    assert scaffold2.local_init_fn is local_init_fn


def test_ScaffoldTest_test_new_scaffold_from_existing_scaffold() -> None:
    scaffold1 = Scaffold(*_fns(2, 3, 4, 5))
    init_fn, ready_fn, local_init_fn, ready_for_local_init_fn = _fns(8, 10, 12, 14)
    scaffold2 = Scaffold(
        init_fn=init_fn,
        ready_fn=ready_fn,
        local_init_fn=local_init_fn,
        ready_for_local_init_fn=ready_for_local_init_fn,
        copy_from_scaffold=scaffold1,
    )
    assert scaffold2.init_fn is init_fn
    assert scaffold2.ready_fn is ready_fn
    assert scaffold2.local_init_fn is local_init_fn
    assert scaffold2.ready_for_local_init_fn is ready_for_local_init_fn
    # And what is not given is copied.
    scaffold3 = Scaffold(init_fn=init_fn, copy_from_scaffold=scaffold1)
    assert scaffold3.init_fn is init_fn
    assert scaffold3.ready_fn is scaffold1.ready_fn
    assert scaffold3.local_init_fn is scaffold1.local_init_fn


def test_ScaffoldTest_test_copy_from_scaffold_is_scaffold() -> None:
    with pytest.raises(TypeError, match="copy_from_scaffold is not a Scaffold instance"):
        Scaffold(copy_from_scaffold=1)  # type: ignore[arg-type]


# --- MonitoredTrainingSessionTest -----------------------------------------------------------


@pytest.fixture
def checkpoint_plugin(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The installed checkpoint plugin, loaded as a real install would load it."""
    module = pytest.importorskip("monitored_checkpoint")
    monkeypatch.delenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD")
    return module


async def test_MonitoredTrainingSessionTest_test_saving_restoring_checkpoint(
    tmp_path: Path, checkpoint_plugin: Any
) -> None:
    logdir = str(tmp_path)
    async with monitored.MonitoredTrainingSession(
        TrainState(), is_chief=True, checkpoint_dir=logdir
    ) as session:
        assert session.state.global_step == 0
        assert gstep(await session.run(do_step)) == 1
        assert gstep(await session.run(do_step)) == 2
    # A restart finds the checkpoint and recovers automatically.
    async with monitored.MonitoredTrainingSession(
        TrainState(), is_chief=True, checkpoint_dir=logdir
    ) as session:
        assert session.state.global_step == 2


async def test_MonitoredTrainingSessionTest_test_save_checkpoint_steps(
    tmp_path: Path, checkpoint_plugin: Any
) -> None:
    logdir = str(tmp_path)
    async with monitored.MonitoredTrainingSession(
        TrainState(),
        is_chief=True,
        checkpoint_dir=logdir,
        save_checkpoint_steps=100,
        log_step_count_steps=10,
    ) as session:
        for _ in range(100):
            await session.run(do_step)
    async with monitored.MonitoredTrainingSession(
        TrainState(), is_chief=True, checkpoint_dir=logdir
    ) as session:
        assert session.state.global_step == 100


async def test_MonitoredTrainingSessionTest_test_save_checkpoint_secs(
    tmp_path: Path, checkpoint_plugin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from _tf1 import FakeClock

    clock = FakeClock()
    monkeypatch.setattr("monitored._core._timer.time", clock)
    logdir = str(tmp_path)
    async with monitored.MonitoredTrainingSession(
        TrainState(),
        is_chief=True,
        checkpoint_dir=logdir,
        save_checkpoint_secs=0.1,
        log_step_count_steps=10,
    ) as session:
        await session.run(do_step)
        clock.value += 0.2  # TF sleeps 0.2 s
        for _ in range(10):
            await session.run(do_step)
    async with monitored.MonitoredTrainingSession(
        TrainState(), is_chief=True, checkpoint_dir=logdir
    ) as session:
        assert session.state.global_step == 11


async def test_MonitoredTrainingSessionTest_test_custom_saving(
    tmp_path: Path, checkpoint_plugin: Any
) -> None:
    logdir = str(tmp_path)
    fake_hook = FakeHook()
    async with monitored.MonitoredTrainingSession(
        TrainState(),
        is_chief=True,
        checkpoint_dir=logdir,
        chief_only_hooks=[fake_hook],
        save_checkpoint_secs=0,
    ) as session:
        assert session.state.global_step == 0
        assert gstep(await session.run(do_step)) == 1
        assert gstep(await session.run(do_step)) == 2
    # The custom hook was called.
    assert fake_hook.call_counter["begin"] == 1
    # A restart finds no checkpoint, since none was saved.
    async with monitored.MonitoredTrainingSession(
        TrainState(), is_chief=True, checkpoint_dir=logdir
    ) as session:
        assert session.state.global_step == 0


# --- WrappedSessionTest / CoordinatedSessionTest ----------------------------------------------
# TF's private session layers; their scenarios are run on MonitoredSession itself.


async def test_WrappedSessionTest_test_should_stop_on_close() -> None:
    session = MonitoredSession(TrainState())
    await session.__aenter__()
    assert not session.should_stop()
    await session.close()
    assert session.should_stop()


async def test_WrappedSessionTest_test_close_twice() -> None:
    session = MonitoredSession(TrainState())
    await session.__aenter__()
    await session.close()
    assert session.should_stop()
    await session.close()
    assert session.should_stop()


async def test_WrappedSessionTest_test_run() -> None:
    async with MonitoredSession(TrainState()) as session:
        assert (await session.run(identity, c=51))["v"] == 51


async def test_CoordinatedSessionTest_test_run() -> None:
    async with MonitoredSession(TrainState()) as session:
        assert (await session.run(identity, c=42))["v"] == 42


async def test_CoordinatedSessionTest_test_should_stop_on_close() -> None:
    session = MonitoredSession(TrainState())
    await session.__aenter__()
    assert not session.should_stop()
    await session.close()
    assert session.should_stop()


async def test_CoordinatedSessionTest_test_should_stop_on_coord_stop() -> None:
    async with MonitoredSession(TrainState()) as session:
        assert not session.should_stop()
        session.coord.request_stop()
        assert session.should_stop()


def bad_step(state: TrainState, c: Any = 0) -> Any:
    raise TypeError("None has invalid type")


async def test_CoordinatedSessionTest_test_dont_request_stop_on_exception_in_main_thread() -> None:
    async with MonitoredSession(TrainState()) as session:
        assert not session.should_stop()
        assert (await session.run(identity, c=0))["v"] == 0
        assert (await session.run(identity, c=1))["v"] == 1
        with pytest.raises(TypeError, match="None has invalid type"):
            await session.run(bad_step, c=2)
        assert not session.coord.should_stop()
        assert not session.should_stop()


def busy_wait_for_coord_stop(coord: monitored.Coordinator) -> None:
    while not coord.should_stop():
        time.sleep(0.001)


async def test_CoordinatedSessionTest_test_stop_threads_on_close_after_exception() -> None:
    session = MonitoredSession(TrainState())
    await session.__aenter__()
    coord = session.coord
    threads = [threading.Thread(target=busy_wait_for_coord_stop, args=(coord,)) for _ in range(3)]
    for t in threads:
        coord.register_thread(t)
        t.start()
    assert not session.should_stop()
    assert all(t.is_alive() for t in threads)
    assert (await session.run(identity, c=0))["v"] == 0
    assert all(t.is_alive() for t in threads)
    assert (await session.run(identity, c=1))["v"] == 1
    assert all(t.is_alive() for t in threads)
    with pytest.raises(TypeError, match="None has invalid type"):
        await session.run(bad_step, c=2)
    await session.close()
    assert not any(t.is_alive() for t in threads)
    assert coord.should_stop()
    assert session.should_stop()


async def test_CoordinatedSessionTest_test_stop_threads_on_close() -> None:
    session = MonitoredSession(TrainState())
    await session.__aenter__()
    coord = session.coord
    threads = [threading.Thread(target=busy_wait_for_coord_stop, args=(coord,)) for _ in range(3)]
    for t in threads:
        coord.register_thread(t)
        t.start()
    await session.close()
    assert not any(t.is_alive() for t in threads)
    assert coord.should_stop()
    assert session.should_stop()


def failing_assertion(state: TrainState) -> Any:
    raise ValueError("This should fail.")


async def test_CoordinatedSessionTest_test_propagates_exception_trace() -> None:
    async with MonitoredSession(TrainState()) as session:
        try:
            await session.run(failing_assertion)
            pytest.fail("No exception was raised by assertion.")
        except ValueError:
            # The innermost frame is where the exception was raised, not the session.
            tb = traceback.extract_tb(sys.exc_info()[2])
            assert tb[-1].name == "failing_assertion"
            assert os.path.basename(tb[-1].filename) == os.path.basename(__file__)


# --- RecoverableSessionTest -----------------------------------------------------------------


async def test_RecoverableSessionTest_test_run() -> None:
    async with MonitoredSession(TrainState()) as session:
        assert (await session.run(identity, c=51))["v"] == 51


async def test_RecoverableSessionTest_test_recovery() -> None:
    class StackSessionCreator(monitored.SessionRunHook):
        """Each created session aborts after 1, 2, then 3 runs."""

        def __init__(self) -> None:
            self.sessions_to_use = [x + 1 for x in range(3)]
            self.budget = 0

        def after_create_session(self, session: Any, coord: Any) -> None:
            self.budget = self.sessions_to_use.pop(0)

    creator = StackSessionCreator()

    def v(state: TrainState, c: Any) -> dict[str, Any]:
        if creator.budget == 0:
            raise monitored.AbortedError("Aborted at N")
        creator.budget -= 1
        return {"v": c}

    assert len(creator.sessions_to_use) == 3
    async with MonitoredSession(TrainState(), hooks=[creator]) as session:
        assert len(creator.sessions_to_use) == 2  # one session popped
        assert (await session.run(v, c=51))["v"] == 51
        assert len(creator.sessions_to_use) == 2
        # Fails and recovers with the second session.
        assert (await session.run(v, c=42))["v"] == 42
        assert len(creator.sessions_to_use) == 1
        assert (await session.run(v, c=33))["v"] == 33
        assert len(creator.sessions_to_use) == 1
        # Fails and recovers with the last session.
        assert (await session.run(v, c=24))["v"] == 24
        assert len(creator.sessions_to_use) == 0
        assert (await session.run(v, c=11))["v"] == 11
        assert (await session.run(v, c=0))["v"] == 0
        # Fails for real: no session is left to pop.
        with pytest.raises(IndexError, match="pop from empty list"):
            await session.run(v, c=-12)


async def _recovers_from(hook: Any, runner: str) -> None:
    creator = CountingSessionCreator()
    async with MonitoredSession(TrainState(), hooks=[creator, hook]) as session:
        assert creator.number_of_sessions_created == 1
        assert not session.should_stop()
        # The coordinator does not abort during call number 0.
        assert await _run(session, runner, 51, hook) == 51
        assert not session.should_stop()
        # It aborts during call number 1.
        assert await _run(session, runner, 42, hook) == 42
        # The coordinator was asked to stop, yet the session is re-created and goes on.
        assert not session.should_stop()
        assert creator.number_of_sessions_created == 2


async def _does_not_recover_from_unknown_error(runner: str) -> None:
    creator = CountingSessionCreator()
    hook = StopCoordinatorWithException(
        calls_before_stopping=2,
        exception_to_raise=UnknownError("Some fatal exception inside the coordinator."),
    )
    session = MonitoredSession(TrainState(), hooks=[creator, hook])
    await session.__aenter__()
    assert creator.number_of_sessions_created == 1
    assert not session.should_stop()
    assert await _run(session, runner, 51, hook) == 51
    assert not session.should_stop()
    assert await _run(session, runner, 42, hook) == 42
    # A non-recoverable error: training stops and the session is not re-created.
    assert session.should_stop()
    assert creator.number_of_sessions_created == 1
    with pytest.raises(UnknownError):
        await session.close()


async def _run(session: MonitoredSession, runner: str, value: int, hook: Any) -> Any:
    if runner == "run":
        return (await session.run(identity, c=value))["v"]

    async def step_fn(step_context: monitored.StepContext) -> Any:
        if runner == "run_with_hooks":
            return (await step_context.run_with_hooks(identity, c=value))["v"]
        # TF points the raw session at the hooked one, so the hook still counts runs.
        outputs = await step_context.session.run(identity, c=value)
        hook.after_run(None, None)
        return outputs["v"]

    return await session.run_step_fn(step_fn)


async def test_RecoverableSessionTest_test_recovery_from_coordinator_exception() -> None:
    await _recovers_from(StopCoordinatorWithException(calls_before_stopping=2), "run")


async def test_RecoverableSessionTest_test_recovery_from_non_preemption_in_coordinator() -> None:
    await _does_not_recover_from_unknown_error("run")


async def test_RecoverableSessionTest_test_recovery_from_session_getting_stuck() -> None:
    await _recovers_from(FailTrainingAfterCoordinatorStopped(calls_before_stopping=2), "run")


async def test_RecoverableSessionTest_test_step_fn_recovery_from_coordinator_exception_when_run_hooks() -> (
    None
):
    await _recovers_from(StopCoordinatorWithException(calls_before_stopping=2), "run_with_hooks")


async def test_RecoverableSessionTest_test_recovery_from_non_preemption_in_coordinator_when_run_hooks() -> (
    None
):
    await _does_not_recover_from_unknown_error("run_with_hooks")


async def test_RecoverableSessionTest_test_recovery_from_session_getting_stuck_when_run_hooks() -> (
    None
):
    await _recovers_from(
        FailTrainingAfterCoordinatorStopped(calls_before_stopping=2), "run_with_hooks"
    )


async def test_RecoverableSessionTest_test_step_fn_recovery_from_coordinator_exception_with_raw_session() -> (
    None
):
    await _recovers_from(StopCoordinatorWithException(calls_before_stopping=2), "raw")


async def test_RecoverableSessionTest_test_recovery_from_non_preemption_in_coordinator_with_raw_session() -> (
    None
):
    # TF's test runs the hooks here too (run_with_hooks under a patched raw session).
    await _does_not_recover_from_unknown_error("run_with_hooks")


async def test_RecoverableSessionTest_test_recovery_from_session_getting_stuck_with_raw_session() -> (
    None
):
    await _recovers_from(
        FailTrainingAfterCoordinatorStopped(calls_before_stopping=2), "run_with_hooks"
    )


# --- HookedSessionTest ----------------------------------------------------------------------


async def test_HookedSessionTest_testRunPassesAllArguments() -> None:
    called: dict[str, Any] = {}

    def a_tensor(state: TrainState, **kwargs: Any) -> dict[str, Any]:
        called.update(kwargs)
        state.global_step += 1
        return {"a_tensor": np.asarray([0])}

    async with MonitoredSession(TrainState(), hooks=[]) as session:
        output = await session.run(
            a_tensor, feed_dict="a_feed", options="an_option", run_metadata="a_metadata"
        )
        assert output["a_tensor"].tolist() == [0]
        assert called == {
            "feed_dict": "a_feed",
            "options": "an_option",
            "run_metadata": "a_metadata",
        }


def a_tensor(state: TrainState) -> dict[str, Any]:
    state.global_step += 1
    return {
        "a_tensor": np.asarray([0]),
        "another_tensor": np.asarray([5]),
        "third_tensor": np.asarray([10]),
    }


async def test_HookedSessionTest_testCallsHooksBeginEnd() -> None:
    mock_hook, mock_hook2 = FakeHook(), FakeHook()
    async with MonitoredSession(TrainState(), hooks=[mock_hook, mock_hook2]) as session:
        await session.run(a_tensor)
        for hook in [mock_hook, mock_hook2]:
            # Differences: no RunOptions/RunMetadata protos (None unless a hook asks
            # for a trace), and the caller's arguments are the step's keyword arguments.
            assert hook.last_run_values == SessionRunValues(
                results=None, options=None, run_metadata=None
            )
            assert hook.last_run_context.original_args == SessionRunArgs(None, {})
            assert hook.last_run_context.session is session
            # MonitoredSession (not TF's bare _HookedSession) calls begin and
            # after_create_session once.
            assert hook.call_counter["begin"] == 1
            assert hook.call_counter["after_create_session"] == 1
            assert hook.call_counter["before_run"] == 1
            assert hook.call_counter["after_run"] == 1


async def test_HookedSessionTest_testShouldStop() -> None:
    mock_hook, mock_hook2 = FakeHook(), FakeHook()
    async with MonitoredSession(TrainState(), hooks=[mock_hook, mock_hook2]) as session:
        await session.run(a_tensor)
        assert not session.should_stop()
        mock_hook.should_stop = True
        await session.run(a_tensor)
        assert session.should_stop()


async def test_HookedSessionTest_testFetchesHookRequests() -> None:
    mock_hook, mock_hook2 = FakeHook(), FakeHook()
    mock_hook.request = SessionRunArgs(["another_tensor"])
    mock_hook2.request = SessionRunArgs(["third_tensor"])
    async with MonitoredSession(TrainState(), hooks=[mock_hook, mock_hook2]) as session:
        output = await session.run(a_tensor)
        assert output["a_tensor"].tolist() == [0]
        assert [r.tolist() for r in mock_hook.last_run_values.results] == [[5]]
        assert [r.tolist() for r in mock_hook2.last_run_values.results] == [[10]]


def add_tensor(state: TrainState, a: Any = 0, b: Any = 0, c: Any = 0) -> dict[str, Any]:
    state.global_step += 1
    return {"add": np.asarray(a) + np.asarray(b) + np.asarray(c)}


async def test_HookedSessionTest_testOnlyHooksHaveFeeds() -> None:
    mock_hook, mock_hook2 = FakeHook(), FakeHook()
    mock_hook.request = SessionRunArgs(None, feed_dict={"a": [5]})
    mock_hook2.request = SessionRunArgs(None, feed_dict={"b": [10]})
    async with MonitoredSession(TrainState(), hooks=[mock_hook, mock_hook2]) as session:
        assert (await session.run(add_tensor))["add"].tolist() == [15]


async def test_HookedSessionTest_testBothHooksAndUserHaveFeeds() -> None:
    mock_hook, mock_hook2 = FakeHook(), FakeHook()
    mock_hook.request = SessionRunArgs(None, feed_dict={"a": [5]})
    mock_hook2.request = SessionRunArgs(None, feed_dict={"b": [10]})
    async with MonitoredSession(TrainState(), hooks=[mock_hook, mock_hook2]) as session:
        feed_dict = {"c": [20]}
        assert (await session.run(add_tensor, **feed_dict))["add"].tolist() == [35]
        # The caller's feeds are not changed.
        assert len(feed_dict) == 1


async def test_HookedSessionTest_testHooksFeedConflicts() -> None:
    mock_hook, mock_hook2 = FakeHook(), FakeHook()
    mock_hook.request = SessionRunArgs(None, feed_dict={"a": [5]})
    mock_hook2.request = SessionRunArgs(None, feed_dict={"a": [10]})
    async with MonitoredSession(TrainState(), hooks=[mock_hook, mock_hook2]) as session:
        # TF: "Same tensor is fed"; feeds are keyword names here.
        with pytest.raises(RuntimeError, match="Same feed key 'a' is given by two hooks"):
            await session.run(add_tensor)


async def test_HookedSessionTest_testHooksAndUserFeedConflicts() -> None:
    mock_hook, mock_hook2 = FakeHook(), FakeHook()
    mock_hook.request = SessionRunArgs(None, feed_dict={"a": [5]})
    mock_hook2.request = SessionRunArgs(None, feed_dict={"b": [10]})
    async with MonitoredSession(TrainState(), hooks=[mock_hook, mock_hook2]) as session:
        with pytest.raises(RuntimeError, match="Same feed key 'b' is given by the caller and by"):
            await session.run(add_tensor, b=[10])


# --- MonitoredSessionTest -------------------------------------------------------------------


async def test_MonitoredSessionTest_test_defaults() -> None:
    async with MonitoredSession(TrainState({"a_var": np.asarray(0)})) as session:
        assert session.state["a_var"] == 0


def _load_ckpt(saved: dict[str, Any]) -> Any:
    """TF's ``Scaffold(init_fn=load_ckpt)`` restoring a saved checkpoint."""

    def init_fn(state: TrainState) -> None:
        state.global_step = saved["global_step"]

    return init_fn


async def test_MonitoredSessionTest_test_last_step() -> None:
    # Run till step 3 and save.
    hooks = [StopAtStepHook(last_step=3)]
    async with MonitoredSession(TrainState(), hooks=hooks) as session:
        assert gstep(await session.run(read_step)) == 0
        assert not session.should_stop()
        assert gstep(await session.run(do_step)) == 1
        assert not session.should_stop()
        assert gstep(await session.run(do_step)) == 2
        assert not session.should_stop()
        assert gstep(await session.run(do_step)) == 3
        assert session.should_stop()
        saved = {"global_step": session.state.global_step}
    # Run till step 5.
    hooks = [StopAtStepHook(last_step=5)]
    scaffold = Scaffold(init_fn=_load_ckpt(saved))
    async with MonitoredSession(TrainState(), hooks=hooks, scaffold=scaffold) as session:
        assert gstep(await session.run(read_step)) == 3
        assert not session.should_stop()
        assert gstep(await session.run(do_step)) == 4
        assert not session.should_stop()
        assert gstep(await session.run(do_step)) == 5
        assert session.should_stop()


async def test_MonitoredSessionTest_test_num_steps() -> None:
    # Do 3 steps and save.
    hooks = [StopAtStepHook(num_steps=3)]
    async with MonitoredSession(TrainState(), hooks=hooks) as session:
        await session.run(do_step)
        assert not session.should_stop()
        await session.run(do_step)
        assert not session.should_stop()
        await session.run(do_step)
        assert session.should_stop()
        saved = {"global_step": session.state.global_step}
    # Restore and do 4 steps.
    hooks = [StopAtStepHook(num_steps=4)]
    scaffold = Scaffold(init_fn=_load_ckpt(saved))
    async with MonitoredSession(TrainState(), hooks=hooks, scaffold=scaffold) as session:
        assert gstep(await session.run(do_step)) == 4
        assert not session.should_stop()
        await session.run(do_step)
        assert not session.should_stop()
        await session.run(do_step)
        assert not session.should_stop()
        await session.run(do_step)
        assert session.should_stop()


async def test_MonitoredSessionTest_test_recovery(tmp_path: Path, checkpoint_plugin: Any) -> None:
    ckpt = checkpoint_plugin
    logdir = str(tmp_path)
    # Save every step (and at the end).
    hooks = [ckpt.CheckpointSaverHook(logdir, save_steps=1, asynchronous=False)]
    manager = monitored.SessionManager(saver=ckpt.Saver(), checkpoint_dir=logdir)
    async with MonitoredSession(TrainState(), hooks=hooks, session_manager=manager) as session:
        assert gstep(await session.run(read_step)) == 0
        assert gstep(await session.run(do_step)) == 1
        assert gstep(await session.run(do_step)) == 2
    # A restart finds the checkpoint and recovers automatically.
    manager = monitored.SessionManager(saver=ckpt.Saver(), checkpoint_dir=logdir)
    async with MonitoredSession(TrainState(), session_manager=manager) as session:
        assert session.state.global_step == 2
    # A restart from the given checkpoint file recovers too.
    manager = monitored.SessionManager(
        saver=ckpt.Saver(), checkpoint_filename_with_path=ckpt.latest_checkpoint(logdir)
    )
    async with MonitoredSession(TrainState(), session_manager=manager) as session:
        assert session.state.global_step == 2


async def test_MonitoredSessionTest_test_retry_initialization_on_aborted_error() -> None:
    init_raised_aborted_error = False

    def init_fn(state: TrainState) -> None:
        nonlocal init_raised_aborted_error
        if not init_raised_aborted_error:
            init_raised_aborted_error = True
            raise monitored.AbortedError("Abort")

    async with MonitoredSession(TrainState(), scaffold=Scaffold(init_fn=init_fn)) as session:
        assert not session.should_stop()
        assert gstep(await session.run(read_step)) == 0
    assert init_raised_aborted_error


async def _retry_test(ex: BaseException) -> None:
    hook = RaiseOnceAtCountN(4, ex)
    async with MonitoredSession(TrainState(), hooks=[hook]) as session:
        assert gstep(await session.run(read_step)) == 0
        assert gstep(await session.run(do_step)) == 1
        assert gstep(await session.run(do_step)) == 2
        assert not session.should_stop()
        # The hook raises at this run; the session is re-created and the step
        # retried. Difference: TF re-initializes the variables (the step restarts
        # from 0 and this run returns 1); monitored keeps the state in memory.
        assert gstep(await session.run(do_step)) == 3
        assert not session.should_stop()
        assert hook.raised
        assert gstep(await session.run(do_step)) == 4
        assert not session.should_stop()


async def test_MonitoredSessionTest_test_retry_on_aborted_error() -> None:
    await _retry_test(monitored.AbortedError("Abort"))


async def test_MonitoredSessionTest_test_retry_on_unavailable_error() -> None:
    await _retry_test(monitored.UnavailableError("Unavailable"))


async def test_MonitoredSessionTest_test_recover_and_retry_on_aborted_error(
    tmp_path: Path, checkpoint_plugin: Any
) -> None:
    ckpt = checkpoint_plugin
    logdir = str(tmp_path)
    abort_hook = RaiseOnceAtCountN(4, monitored.AbortedError("Abort"))
    ckpt_hook = ckpt.CheckpointSaverHook(logdir, save_steps=1, asynchronous=False)
    manager = monitored.SessionManager(saver=ckpt.Saver(), checkpoint_dir=logdir)
    async with MonitoredSession(
        TrainState(), hooks=[abort_hook, ckpt_hook], session_manager=manager
    ) as session:
        assert gstep(await session.run(read_step)) == 0
        assert gstep(await session.run(do_step)) == 1
        assert gstep(await session.run(do_step)) == 2
        assert not session.should_stop()
        # The hook raises AbortedError: the session restores and retries.
        assert gstep(await session.run(do_step)) == 3
        assert abort_hook.raised
        assert not session.should_stop()
        assert gstep(await session.run(do_step)) == 4
        assert not session.should_stop()


async def _exit_cleanly(session_type: type[MonitoredSession], ex: Any) -> None:
    hook = RaiseOnceAtCountN(2, ex)
    session = session_type(TrainState(), hooks=[hook])
    async with session:
        assert gstep(await session.run(read_step)) == 0
        assert not session.should_stop()
        # The hook raises the end of input here: the body is left, cleanly.
        await session.run(do_step)
        pytest.fail("not reached")
    assert session.should_stop()


async def test_MonitoredSessionTest_test_exit_cleanly_on_out_of_range_exception() -> None:
    await _exit_cleanly(MonitoredSession, monitored.OutOfRangeError("EOI"))


async def test_MonitoredSessionTest_test_exit_cleanly_on_stop_iteration_exception() -> None:
    await _exit_cleanly(MonitoredSession, StopIteration)


async def test_MonitoredSessionTest_test_regular_exception_pass_through_run() -> None:
    hook = RaiseOnceAtCountN(4, RuntimeError("regular exception"))
    session = MonitoredSession(TrainState(), hooks=[hook])
    with pytest.raises(RuntimeError, match="regular exception"):
        async with session:
            assert gstep(await session.run(read_step)) == 0
            assert gstep(await session.run(do_step)) == 1
            assert gstep(await session.run(do_step)) == 2
            assert not session.should_stop()
            await session.run(do_step)  # the hook raises
            pytest.fail("not reached")
    assert hook.raised
    assert session.should_stop()


async def _regular_exception_reported_to_coord_pass_through_run(
    session_type: type[MonitoredSession],
) -> None:
    session = session_type(TrainState())
    run_performed_without_error = False
    with pytest.raises(RuntimeError, match="a thread wants to stop"):
        async with session:
            assert gstep(await session.run(read_step)) == 0
            try:
                raise RuntimeError("a thread wants to stop")
            except RuntimeError as e:
                session.coord.request_stop(e)
            # Difference: TF runs this step and raises at the exit; monitored
            # raises the reported exception from this next run.
            await session.run(read_step)
            run_performed_without_error = True
    assert not run_performed_without_error


async def test_MonitoredSessionTest_test_regular_exception_reported_to_coord_pass_through_run() -> (
    None
):
    await _regular_exception_reported_to_coord_pass_through_run(MonitoredSession)


async def test_MonitoredSessionTest_test_regular_exception_reported_to_coord_pass_through_return() -> (
    None
):
    session = MonitoredSession(TrainState())
    with pytest.raises(RuntimeError, match="a thread wants to stop"):
        async with session:
            assert gstep(await session.run(read_step)) == 0
            try:
                raise RuntimeError("a thread wants to stop")
            except RuntimeError as e:
                session.coord.request_stop(e)
            assert session.should_stop()


async def _stop_cleanly(session: MonitoredSession) -> None:
    async with session:
        assert gstep(await session.run(do_step)) == 1
        assert gstep(await session.run(do_step)) == 2
        assert not session.should_stop()
    # Closed.
    assert session.should_stop()
    with pytest.raises(RuntimeError, match="the session is closed"):
        await session.run(do_step)


async def test_MonitoredSessionTest_test_stop_cleanly_when_no_exception_in_with_body() -> None:
    await _stop_cleanly(MonitoredSession(TrainState()))


async def test_MonitoredSessionTest_test_raises_regular_exceptions_in_with_body() -> None:
    session = MonitoredSession(TrainState())
    with pytest.raises(RuntimeError, match="regular exception"):
        async with session:
            assert gstep(await session.run(do_step)) == 1
            assert gstep(await session.run(do_step)) == 2
            assert not session.should_stop()
            raise RuntimeError("regular exception")
    assert session.should_stop()
    with pytest.raises(RuntimeError, match="the session is closed"):
        await session.run(do_step)


async def test_MonitoredSessionTest_test_graph_finalized_during_run_unfinalized_after_exit() -> (
    None
):
    state = TrainState({"a_var": np.asarray(0)})
    async with MonitoredSession(state) as session:
        assert session.state["a_var"] == 0
        assert state.finalized
    assert not state.finalized


async def test_MonitoredSessionTest_test_keep_finalized_graph_as_finalized() -> None:
    state = TrainState({"a_var": np.asarray(0)})
    state.finalize()
    async with MonitoredSession(state) as session:
        assert session.state["a_var"] == 0
        assert state.finalized
    assert state.finalized


async def test_MonitoredSessionTest_test_with_statement_and_close() -> None:
    # close() inside the with block: the exit says so.
    with pytest.raises(RuntimeError, match="Session is already closed"):
        async with MonitoredSession(TrainState()) as session:
            await session.close()


def v_step(state: TrainState, c: float) -> dict[str, Any]:
    state.global_step += 1
    return {"v": c}


async def test_MonitoredSessionTest_test_step_fn_example() -> None:
    async def step_fn(step_context: monitored.StepContext) -> Any:
        return (await step_context.run_with_hooks(v_step, c=3.2))["v"]

    async with MonitoredSession(TrainState()) as session:
        assert await session.run_step_fn(step_fn) == pytest.approx(3.2, abs=0.1)


async def test_MonitoredSessionTest_test_step_function_stops() -> None:
    def step_fn(step_context: monitored.StepContext) -> None:
        step_context.request_stop()

    async with MonitoredSession(TrainState()) as session:
        assert await session.run_step_fn(step_fn) is None
        assert session.should_stop()


async def test_MonitoredSessionTest_test_step_request_stop_without_a_with_block() -> None:
    def step_fn(step_context: monitored.StepContext) -> None:
        step_context.request_stop()

    session = MonitoredSession(TrainState())
    # Difference: TF's request_stop raises StopIteration out of run_step_fn; here a
    # session that was never entered refuses to run at all.
    with pytest.raises(RuntimeError, match="not entered"):
        await session.run_step_fn(step_fn)
    assert not session.should_stop()


async def test_MonitoredSessionTest_test_step_request_stop_in_a_loop() -> None:
    def step_fn(step_context: monitored.StepContext) -> None:
        step_context.request_stop()

    # Difference: TF's request_stop raises StopIteration, which leaves the loop and
    # the with block at once; here run_step_fn returns None and should_stop() ends
    # the loop (documented in the guide and the TF1 page).
    iterations = 0
    async with MonitoredSession(TrainState()) as session:
        while not session.should_stop():
            assert await session.run_step_fn(step_fn) is None
            iterations += 1
    assert iterations == 1


async def test_MonitoredSessionTest_test_step_request_stop_with_returning_a_type() -> None:
    def step_fn(step_context: monitored.StepContext) -> str:
        return "a type"

    async with MonitoredSession(TrainState()) as session:
        assert await session.run_step_fn(step_fn) == "a type"


async def test_MonitoredSessionTest_test_step_with_extra_arguments() -> None:
    def step_fn(step_context: monitored.StepContext, extra_foo: Any) -> None:
        pass

    async with MonitoredSession(TrainState()) as session:
        with pytest.raises(
            ValueError, match="`step_fn` may either have one `step_context` argument"
        ):
            await session.run_step_fn(step_fn)


async def test_MonitoredSessionTest_test_step_fn_belongs_to_a_class() -> None:
    class Model:
        async def step_fn(self, step_context: monitored.StepContext) -> Any:
            return (await step_context.run_with_hooks(v_step, c=3.2))["v"]

    async with MonitoredSession(TrainState()) as session:
        model = Model()
        assert await session.run_step_fn(model.step_fn) == pytest.approx(3.2, abs=0.1)


async def test_MonitoredSessionTest_test_step_fn_belongs_to_a_class_and_has_extra_methods() -> None:
    class Model:
        def step_fn(self, step_context: monitored.StepContext, extra_foo: Any) -> None:
            pass

    async with MonitoredSession(TrainState()) as session:
        with pytest.raises(
            ValueError, match="`step_fn` may either have one `step_context` argument"
        ):
            model = Model()
            await session.run_step_fn(model.step_fn)


def _staged_hook() -> Any:
    class Hook(monitored.SessionRunHook):
        def before_run(self, run_context: Any) -> Any:
            return SessionRunArgs(fetches="stage_1_0")

        def after_run(self, run_context: Any, run_values: Any) -> None:
            assert run_context.session.fetch("var") == pytest.approx(0.3 + 0.5 + 0.7, abs=0.1)
            # Difference: TF runs stage_2 from after_run with run_context.session.run;
            # here a hook cannot run steps (it reads values, or fetches them).
            with pytest.raises(RuntimeError, match="run called from inside a hook"):
                run_context.session._check_can_run()

    return Hook()


def stage_0(state: TrainState) -> float:
    state["var"] += 0.3
    return float(state["var"])


def stage_1(state: TrainState) -> dict[str, Any]:
    """stage_1_0 (+0.7) then stage_1_1 (+0.5), as TF's control dependency orders them."""
    state["var"] += 0.7
    stage_1_0 = float(state["var"])
    state["var"] += 0.5
    state.global_step += 1
    return {"stage_1_0": stage_1_0, "stage_1_1": float(state["var"])}


async def _step_fn_with_hooks(session_type: type[MonitoredSession]) -> None:
    async def step_fn(step_context: monitored.StepContext) -> Any:
        assert await step_context.session.run(stage_0) == pytest.approx(0.3, abs=0.1)
        return (await step_context.run_with_hooks(stage_1))["stage_1_1"]

    state = TrainState({"var": np.asarray(0.0)})
    async with session_type(state, hooks=[_staged_hook()]) as session:
        assert await session.run_step_fn(step_fn) == pytest.approx(0.3 + 0.5 + 0.7)


async def test_MonitoredSessionTest_test_step_fn_with_hooks() -> None:
    await _step_fn_with_hooks(MonitoredSession)


async def test_MonitoredSessionTest_test_step_fn_has_the_same_hooks_behavior_without_recovery() -> (
    None
):
    await _step_fn_with_hooks(SingularMonitoredSession)


async def test_MonitoredSessionTest_test_step_fn_with_hooks_and_request_stop() -> None:
    trace_the_hook = {"before_run": False, "after_run": False}

    class Hook(monitored.SessionRunHook):
        def before_run(self, run_context: Any) -> None:
            trace_the_hook["before_run"] = True

        def after_run(self, run_context: Any, run_values: Any) -> None:
            trace_the_hook["after_run"] = True

    def step_fn(step_context: monitored.StepContext) -> None:
        step_context.request_stop()

    async with MonitoredSession(TrainState(), hooks=[Hook()]) as session:
        assert await session.run_step_fn(step_fn) is None
        assert session.should_stop()
        # request_stop() in a step_fn interrupts the flow before the hooks run.
        assert not trace_the_hook["before_run"]
        assert not trace_the_hook["after_run"]


async def test_MonitoredSessionTest_test_recovers_from_an_exception_in_step_fn() -> None:
    trace_the_exception = {"run_already": False}

    async def step_fn(step_context: monitored.StepContext) -> Any:
        if not trace_the_exception["run_already"]:
            trace_the_exception["run_already"] = True
            raise monitored.AbortedError("Abort")
        return (await step_context.run_with_hooks(v_step, c=3.2))["v"]

    async with MonitoredSession(TrainState()) as session:
        assert await session.run_step_fn(step_fn) == pytest.approx(3.2, abs=0.1)
    assert trace_the_exception["run_already"]


def graph_side_effect(state: TrainState) -> None:
    state["graph_state"] += 0.31


async def test_MonitoredSessionTest_test_recovers_from_an_exception_in_step_fn_after_hooks() -> (
    None
):
    trace_the_exception = {"run_already": False, "side_effect_counter": 0}

    async def step_fn(step_context: monitored.StepContext) -> Any:
        trace_the_exception["side_effect_counter"] += 1
        await step_context.session.run(graph_side_effect)
        value = (await step_context.run_with_hooks(v_step, c=3.2))["v"]
        if not trace_the_exception["run_already"]:
            trace_the_exception["run_already"] = True
            raise monitored.AbortedError("Abort")
        return value

    creator = CountingSessionCreator()
    state = TrainState({"graph_state": np.asarray(0.0)})
    async with MonitoredSession(state, hooks=[creator]) as session:
        assert await session.run_step_fn(step_fn) == pytest.approx(3.2, abs=0.1)
        assert trace_the_exception["run_already"]
        # The rest of the step_fn runs again after the AbortedError.
        assert trace_the_exception["side_effect_counter"] == 2
        assert session.state["graph_state"] == pytest.approx(0.62, abs=0.1)


async def test_MonitoredSessionTest_test_step_fn_doesnt_recover_when_it_wasnt_asked_to() -> None:
    trace_the_exception = {"run_already": False}

    async def step_fn(step_context: monitored.StepContext) -> Any:
        if not trace_the_exception["run_already"]:
            trace_the_exception["run_already"] = True
            raise monitored.AbortedError("Abort")
        return (await step_context.run_with_hooks(v_step, c=3.2))["v"]

    async with SingularMonitoredSession(TrainState()) as session:
        with pytest.raises(monitored.AbortedError, match="Abort"):
            await session.run_step_fn(step_fn)
            pytest.fail("not reached")
    assert trace_the_exception["run_already"]


async def test_MonitoredSessionTest_test_step_fn_exception_from_before_run() -> None:
    trace_the_exception = {"run_already": False, "side_effect_counter": 0}

    class Hook(monitored.SessionRunHook):
        def before_run(self, run_context: Any) -> Any:
            if not trace_the_exception["run_already"]:
                trace_the_exception["run_already"] = True
                raise monitored.AbortedError("Abort")
            return SessionRunArgs(fetches="vv")

        def after_run(self, run_context: Any, run_values: Any) -> None:
            assert run_values.results == pytest.approx(3.2, abs=0.1)

    def v_and_vv(state: TrainState, c: float) -> dict[str, Any]:
        state.global_step += 1
        return {"v": c, "vv": 3.2}

    async def step_fn(step_context: monitored.StepContext) -> Any:
        trace_the_exception["side_effect_counter"] += 1
        await step_context.session.run(graph_side_effect)
        return (await step_context.run_with_hooks(v_and_vv, c=1.3))["v"]

    state = TrainState({"graph_state": np.asarray(0.0)})
    async with MonitoredSession(state, hooks=[CountingSessionCreator(), Hook()]) as session:
        assert await session.run_step_fn(step_fn) == pytest.approx(1.3, abs=0.1)
        assert trace_the_exception["side_effect_counter"] == 2
        assert session.state["graph_state"] == pytest.approx(0.62, abs=0.1)


# --- SingularMonitoredSessionTest -----------------------------------------------------------


async def test_SingularMonitoredSessionTest_test_handles_initialization() -> None:
    async with SingularMonitoredSession(TrainState({"a_var": np.asarray(0)})) as session:
        assert session.state["a_var"] == 0


async def test_SingularMonitoredSessionTest_test_do_not_handle_aborted_error() -> None:
    class RaiseAbortedHook(monitored.SessionRunHook):
        def before_run(self, run_context: Any) -> None:
            raise monitored.AbortedError("Abort")

    async with SingularMonitoredSession(TrainState(), hooks=[RaiseAbortedHook()]) as session:
        with pytest.raises(monitored.AbortedError):
            await session.run(read_step)

    with pytest.raises(monitored.AbortedError):
        async with SingularMonitoredSession(TrainState(), hooks=[RaiseAbortedHook()]) as session:
            await session.run(read_step)


async def test_SingularMonitoredSessionTest_test_exit_cleanly_on_out_of_range_exception() -> None:
    await _exit_cleanly(SingularMonitoredSession, monitored.OutOfRangeError("EOI"))


async def test_SingularMonitoredSessionTest_test_regular_exception_reported_to_coord_pass_through_run() -> (
    None
):
    await _regular_exception_reported_to_coord_pass_through_run(SingularMonitoredSession)


async def test_SingularMonitoredSessionTest_test_stop_cleanly_when_no_exception_in_with_body() -> (
    None
):
    session = SingularMonitoredSession(TrainState())
    await _stop_cleanly(session)
    assert session.raw_session() is None


async def test_SingularMonitoredSessionTest_test_raw_session() -> None:
    async with SingularMonitoredSession(TrainState()) as session:
        assert isinstance(session.raw_session(), monitored.RawSession)
