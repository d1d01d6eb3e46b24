"""MonitoredSession: TF1's lifecycle, stop, feeds, step functions, ends and recovery."""

from __future__ import annotations

import inspect
import logging
import time
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import pytest
from _helpers import Recorder, counting_step

import monitored
from monitored import PluginError, SessionRunArgs, TrainState


async def run_steps(sess: monitored.MonitoredSession, n: int, step: Any = counting_step) -> None:
    for _ in range(n):
        await sess.run(step)


async def test_events_are_called_in_tf1_order_and_list_order(state: TrainState, log: list) -> None:
    hooks = [Recorder("a", log), Recorder("b", log)]
    async with monitored.MonitoredSession(state, hooks=hooks) as sess:
        assert log == [
            ("a", "begin"),
            ("b", "begin"),
            ("a", "after_create_session"),
            ("b", "after_create_session"),
        ]
        log.clear()
        await sess.run(counting_step)
        assert log == [
            ("a", "before_run"),
            ("b", "before_run"),
            ("a", "after_run"),
            ("b", "after_run"),
        ]
        log.clear()
    assert log == [("a", "end"), ("b", "end")]


async def test_begin_runs_before_the_state_is_initialized(state: TrainState) -> None:
    seen = {}

    class Hook:
        def begin(self, session: monitored.MonitoredSession) -> None:
            seen["initialized"] = session.state.initialized
            session.state["extra"] = np.zeros(2)  # begin may still add entries

        def after_create_session(self, session: Any, coord: Any) -> None:
            seen["finalized"] = session.state.finalized

    async with monitored.MonitoredSession(state, hooks=[Hook()]):
        pass
    assert seen == {"initialized": False, "finalized": True}
    assert "extra" in state


async def test_run_returns_the_step_outputs_and_passes_args(state: TrainState) -> None:
    def step(state: TrainState, x: np.ndarray, *, scale: float) -> dict[str, Any]:
        state["w"] += x * scale
        return {"w": state["w"]}

    async with monitored.MonitoredSession(state) as sess:
        out = await sess.run(step, np.ones(3, np.float32), scale=2.0)
        assert sess.last_outputs is out
    np.testing.assert_array_equal(out["w"], [2, 2, 2])
    assert sess.last_outputs == {}  # released at close: no device array kept alive


async def test_async_step_functions_are_awaited(state: TrainState) -> None:
    async def step(state: TrainState) -> dict[str, Any]:
        state.global_step += 1
        return {"step": state.global_step}

    async with monitored.MonitoredSession(state) as sess:
        assert (await sess.run(step))["step"] == 1


async def test_step_returning_none_has_no_outputs(state: TrainState) -> None:
    async with monitored.MonitoredSession(state) as sess:
        assert await sess.run(lambda state: None) == {}


async def test_step_returning_a_non_mapping_is_a_clear_error(state: TrainState) -> None:
    def bad_step(state: TrainState) -> float:
        return 1.0

    with pytest.raises(TypeError, match=r"step function .*bad_step returned float"):
        async with monitored.MonitoredSession(state) as sess:
            await sess.run(bad_step)


async def test_request_stop_finishes_the_step_and_every_after_run(
    state: TrainState, log: list
) -> None:
    class Stopper:
        def after_run(self, run_context: Any, run_values: Any) -> None:
            run_context.request_stop()
            assert run_context.stop_requested

    hooks = [Stopper(), Recorder("after", log)]
    async with monitored.MonitoredSession(state, hooks=hooks) as sess:
        assert not sess.should_stop()
        await sess.run(counting_step)
        assert sess.should_stop()
        assert ("after", "after_run") in log
        with pytest.raises(RuntimeError, match="Run called even after should_stop requested."):
            await sess.run(counting_step)
    assert state.global_step == 1
    assert log[-1] == ("after", "end")


async def test_request_stop_in_before_run_still_runs_the_step(state: TrainState) -> None:
    class Stopper:
        def before_run(self, run_context: Any) -> None:
            run_context.request_stop()

    async with monitored.MonitoredSession(state, hooks=[Stopper()]) as sess:
        await sess.run(counting_step)
        assert sess.should_stop()
    assert state.global_step == 1


async def test_each_hook_gets_exactly_its_own_fetches(state: TrainState) -> None:
    log: list = []
    nested = Recorder("nested", log, fetches={"l": "loss", "both": ("w", ["global_step"])})
    plain = Recorder("plain", log, fetches="loss")
    silent = Recorder("silent", log)
    async with monitored.MonitoredSession(state, hooks=[nested, plain, silent]) as sess:
        await sess.run(counting_step)
    [got] = nested.results
    assert set(got) == {"l", "both"}
    assert got["l"] == 3.0
    assert isinstance(got["both"], tuple)
    np.testing.assert_array_equal(got["both"][0], [1, 1, 1])
    assert got["both"][0].dtype == np.float32
    assert got["both"][1] == [1]
    assert plain.results == [3.0]
    assert isinstance(plain.results[0], np.float32)  # a NumPy scalar: immutable, not copied
    assert silent.results == [None]


async def test_fetched_state_is_a_copy_the_next_step_does_not_change(state: TrainState) -> None:
    hook = Recorder("r", [], fetches="w")
    async with monitored.MonitoredSession(state, hooks=[hook]) as sess:
        await run_steps(sess, 2)
    np.testing.assert_array_equal(hook.results[0], [1, 1, 1])
    np.testing.assert_array_equal(hook.results[1], [2, 2, 2])


async def test_fetching_an_unknown_name_names_the_hook_and_what_exists(state: TrainState) -> None:
    hook = Recorder("r", [], fetches=["loss", "nope"])
    with pytest.raises(monitored.FetchError, match=r"hook 'hooks\[0\]:Recorder'.*'nope' at step 1"):
        async with monitored.MonitoredSession(state, hooks=[hook]) as sess:
            await sess.run(counting_step)


async def test_an_optional_fetch_that_is_missing_is_none(state: TrainState) -> None:
    hook = Recorder(
        "r", [], fetches={"loss": monitored.optional("loss"), "acc": monitored.optional("acc")}
    )
    async with monitored.MonitoredSession(state, hooks=[hook]) as sess:
        await sess.run(counting_step)
    assert hook.results == [{"loss": 3.0, "acc": None}]


async def test_an_optional_fetch_asked_for_as_required_by_another_hook_is_an_error(
    state: TrainState,
) -> None:
    watcher = Recorder("watcher", [], fetches=monitored.optional("acc"))
    strict = Recorder("strict", [], fetches="acc")
    with pytest.raises(
        monitored.FetchError, match=r"^hook 'hooks\[1\]:Recorder'[^,]*asked to fetch 'acc'"
    ) as info:
        async with monitored.MonitoredSession(state, hooks=[watcher, strict]) as sess:
            await sess.run(counting_step)
    assert "monitored.optional('acc')" in str(info.value)
    assert "hooks[0]" not in str(info.value)


async def test_an_optional_fetch_that_exists_is_fetched_once_with_the_required_one(
    state: TrainState,
) -> None:
    a = Recorder("a", [], fetches=monitored.optional("loss"))
    b = Recorder("b", [], fetches=["loss"])
    async with monitored.MonitoredSession(state, hooks=[a, b]) as sess:
        await sess.run(counting_step)
    assert a.results == [3.0]
    assert b.results == [[3.0]]


def test_optional_takes_a_name() -> None:
    assert repr(monitored.optional("loss")) == "optional('loss')"
    with pytest.raises(TypeError, match="takes a fetch name"):
        monitored.optional(3)  # type: ignore[arg-type]


async def test_fetching_a_non_name_is_a_type_error(state: TrainState) -> None:
    hook = Recorder("r", [], fetches=["loss", 3])
    with pytest.raises(TypeError, match=r"asked to fetch 3 \(int\)"):
        async with monitored.MonitoredSession(state, hooks=[hook]) as sess:
            await sess.run(counting_step)


async def test_before_run_must_return_session_run_args(state: TrainState) -> None:
    class Bad:
        def before_run(self, run_context: Any) -> dict[str, str]:
            return {"fetches": "loss"}

    with pytest.raises(TypeError, match=r"returned dict; it must return SessionRunArgs or None"):
        async with monitored.MonitoredSession(state, hooks=[Bad()]) as sess:
            await sess.run(counting_step)


async def test_feeds_become_step_keyword_arguments(state: TrainState) -> None:
    class Feeder:
        def before_run(self, run_context: Any) -> SessionRunArgs:
            return SessionRunArgs(feed_dict={"lr": 0.5})

    async with monitored.MonitoredSession(state, hooks=[Feeder()]) as sess:
        out = await sess.run(counting_step, other=1)
    assert out["feed:lr"] == 0.5
    assert out["feed:other"] == 1


async def test_a_feed_given_by_two_hooks_is_an_error(state: TrainState) -> None:
    class Feeder:
        def before_run(self, run_context: Any) -> SessionRunArgs:
            return SessionRunArgs(feeds={"lr": 0.5})

    with pytest.raises(RuntimeError, match=r"Same feed key 'lr' is given by two hooks"):
        async with monitored.MonitoredSession(state, hooks=[Feeder(), Feeder()]) as sess:
            await sess.run(counting_step)


async def test_a_feed_given_by_a_hook_and_the_caller_is_an_error(state: TrainState) -> None:
    class Feeder:
        def before_run(self, run_context: Any) -> SessionRunArgs:
            assert run_context.original_args.feeds == {"lr": 1.0}
            return SessionRunArgs(feeds={"lr": 0.5})

    with pytest.raises(RuntimeError, match=r"Same feed key 'lr' is given by the caller"):
        async with monitored.MonitoredSession(state, hooks=[Feeder()]) as sess:
            await sess.run(counting_step, lr=1.0)


# --- run_step_fn -------------------------------------------------------------------------


async def test_run_step_fn_with_hooks_and_request_stop(state: TrainState, log: list) -> None:
    async def step_fn(ctx: monitored.StepContext) -> str:
        await ctx.run_with_hooks(counting_step)
        if ctx.state.global_step == 2:
            ctx.request_stop()
        return "done"

    async with monitored.MonitoredSession(state, hooks=[Recorder("r", log)]) as sess:
        assert await sess.run_step_fn(step_fn) == "done"
        assert not sess.should_stop()
        assert await sess.run_step_fn(step_fn) is None
        assert sess.should_stop()
    assert log.count(("r", "before_run")) == 2
    assert state.global_step == 2


async def test_run_step_fn_raw_session_calls_no_hooks(state: TrainState, log: list) -> None:
    def step_fn(ctx: monitored.StepContext) -> Any:
        return ctx.session.run(counting_step)

    async with monitored.MonitoredSession(state, hooks=[Recorder("r", log)]) as sess:
        out = await sess.run_step_fn(step_fn)
    assert out["loss"] == 3.0
    assert ("r", "before_run") not in log


# --- ends -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "end_of_input", [monitored.OutOfRangeError, StopIteration, StopAsyncIteration]
)
async def test_end_of_input_is_a_normal_end(
    state: TrainState, log: list, end_of_input: type[BaseException]
) -> None:
    async with monitored.MonitoredSession(state, hooks=[Recorder("r", log)]) as sess:
        await sess.run(counting_step)
        raise end_of_input()
    assert log[-1] == ("r", "end")


async def test_end_of_input_from_an_iterator_ends_the_loop(state: TrainState, log: list) -> None:
    batches = iter([1, 2, 3])
    async with monitored.MonitoredSession(state, hooks=[Recorder("r", log)]) as sess:
        while not sess.should_stop():
            await sess.run(counting_step, batch=next(batches))
    assert state.global_step == 3
    assert log[-1] == ("r", "end")


async def test_other_exceptions_skip_end_and_propagate_unchanged(
    state: TrainState, log: list
) -> None:
    error = ValueError("boom")

    def failing_step(state: TrainState) -> None:
        raise error

    with pytest.raises(ValueError, match="boom") as info:
        async with monitored.MonitoredSession(state, hooks=[Recorder("r", log)]) as sess:
            await sess.run(failing_step)
    assert info.value is error
    assert ("r", "end") not in log


async def test_hook_exception_names_the_hook_and_step_and_skips_end(
    state: TrainState, log: list
) -> None:
    class Broken:
        def after_run(self, run_context: Any, run_values: Any) -> None:
            raise KeyError("oops")

    with pytest.raises(KeyError) as info:
        async with monitored.MonitoredSession(state, hooks=[Recorder("r", log), Broken()]) as sess:
            await sess.run(counting_step)
    assert "raised in hook 'after_run' of hook 'hooks[1]:" in "\n".join(info.value.__notes__)
    assert "at step 1" in info.value.__notes__[0]
    assert ("r", "end") not in log


async def test_exception_in_begin_closes_the_session_and_propagates(state: TrainState) -> None:
    class Broken:
        def begin(self, session: Any) -> None:
            raise OSError("no disk")

    sess = monitored.MonitoredSession(state, hooks=[Broken()])
    with pytest.raises(OSError, match="no disk"):
        async with sess:
            pytest.fail("the body must not run")
    with pytest.raises(RuntimeError, match="the session is closed"):
        await sess.run(counting_step)


async def test_exception_in_end_propagates_after_closing(state: TrainState) -> None:
    class Broken:
        def end(self, session: Any) -> None:
            raise OSError("cannot save")

    log: list = []
    sess = monitored.MonitoredSession(
        state, hooks=[Recorder("a", log), Broken(), Recorder("b", log)]
    )
    with pytest.raises(OSError, match="cannot save") as info:
        async with sess:
            await sess.run(counting_step)
    assert ("a", "end") in log
    assert ("b", "end") in log, "a failing end does not cost the others theirs"
    [note] = info.value.__notes__
    assert note.startswith("raised in hook 'end' of hook 'hooks[1]:Broken' (")
    assert note.endswith(".Broken) at step 1")
    with pytest.raises(RuntimeError, match="closed"):
        await sess.run(counting_step)


async def test_every_end_runs_and_the_first_error_carries_the_others_as_notes(
    state: TrainState,
) -> None:
    class Broken:
        def __init__(self, error: Exception) -> None:
            self.error = error

        def end(self, session: Any) -> None:
            raise self.error

    log: list = []
    first, second = OSError("first"), ValueError("second")

    class Last(Recorder):
        @monitored.hookimpl(trylast=True)
        def end(self, session: Any) -> None:
            log.append(("last", "end"))

    hooks = [Last("last", log), Broken(first), Recorder("a", log), Broken(second)]
    with pytest.raises(OSError) as info:
        async with monitored.MonitoredSession(state, hooks=hooks):
            pass
    assert info.value is first
    assert ("a", "end") in log
    assert ("last", "end") in log
    assert "raised in hook 'end' of hook 'hooks[1]:Broken'" in info.value.__notes__[0]
    assert "hook 'end' of hook 'hooks[3]:Broken'" in info.value.__notes__[1]
    assert "raised too: ValueError: second" in info.value.__notes__[1]


async def test_run_outside_the_context_manager_is_an_error(state: TrainState) -> None:
    sess = monitored.MonitoredSession(state)
    with pytest.raises(RuntimeError, match="not entered"):
        await sess.run(counting_step)
    async with sess:
        pass
    with pytest.raises(RuntimeError, match="closed"):
        await sess.run(counting_step)
    with pytest.raises(RuntimeError, match="entered only once"):
        async with sess:
            pass


async def test_close_ends_the_session_normally(state: TrainState, log: list) -> None:
    sess = monitored.MonitoredSession(state, hooks=[Recorder("r", log)])
    await sess.__aenter__()
    await sess.run(counting_step)
    await sess.close()
    await sess.close()  # idempotent
    assert log[-1] == ("r", "end")
    assert log.count(("r", "end")) == 1


def test_state_must_be_a_train_state() -> None:
    with pytest.raises(TypeError, match="state must be a monitored.TrainState, got dict"):
        monitored.MonitoredSession({"w": np.zeros(1)})  # type: ignore[arg-type]


def test_max_recoveries_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="max_recoveries must be >= 0"):
        monitored.MonitoredSession(max_recoveries=-1)


async def test_the_state_is_frozen_after_the_session_is_created(state: TrainState) -> None:
    async with monitored.MonitoredSession(state):
        with pytest.raises(KeyError, match="cannot add TrainState entry 'new'"):
            state["new"] = np.zeros(1)


# --- background failures ------------------------------------------------------------------


async def test_a_background_task_failure_stops_the_loop_and_is_raised(
    state: TrainState, log: list
) -> None:
    error = OSError("disk full")

    class Starter:
        def after_create_session(self, session: Any, coord: monitored.Coordinator) -> None:
            async def fail() -> None:
                raise error

            coord.start_soon(fail)

    with pytest.raises(OSError, match="disk full") as info:
        async with monitored.MonitoredSession(state, hooks=[Starter(), Recorder("r", log)]) as sess:
            while not sess.should_stop():
                await sess.run(counting_step)
                await monitored_sleep()
    assert info.value is error
    assert ("r", "end") not in log


async def test_a_background_failure_is_raised_by_the_next_run(state: TrainState) -> None:
    async with monitored.MonitoredSession(state) as sess:
        sess.coord.request_stop(ValueError("reader died"))
        with pytest.raises(ValueError, match="reader died"):
            await sess.run(counting_step)
        sess.coord.clear_stop()


async def monitored_sleep() -> None:
    import anyio

    await anyio.sleep(0.01)


# --- recovery -----------------------------------------------------------------------------


@pytest.mark.parametrize("error", [monitored.AbortedError, monitored.UnavailableError])
async def test_aborted_steps_recreate_the_session_and_retry(
    state: TrainState, log: list, error: type[Exception]
) -> None:
    failures = [error("preempted")]

    def flaky_step(state: TrainState) -> dict[str, Any]:
        if failures:
            raise failures.pop()
        return counting_step(state)

    restores = []

    class Restorer:
        def restore_state(self, session: Any) -> None:
            restores.append(session.state.global_step)

    async with monitored.MonitoredSession(state, hooks=[Recorder("r", log), Restorer()]) as sess:
        await sess.run(flaky_step)
    assert state.global_step == 1
    assert log.count(("r", "after_create_session")) == 2
    assert log.count(("r", "begin")) == 1
    assert log.count(("r", "before_run")) == 2
    assert restores == [0, 0]


async def test_recovery_keeps_the_state_in_memory_when_nothing_is_restored(
    state: TrainState,
) -> None:
    inits = []
    scaffold = monitored.Scaffold(init_fn=lambda s: inits.append(1))
    calls = 0

    def step(state: TrainState) -> dict[str, Any]:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise monitored.AbortedError("lost a worker")
        return counting_step(state)

    async with monitored.MonitoredSession(state, scaffold=scaffold) as sess:
        for _ in range(3):
            await sess.run(step)
    assert inits == [1]
    assert state.global_step == 3


async def test_max_recoveries_bounds_the_retries(state: TrainState, log: list) -> None:
    attempts = []

    def always_aborted(state: TrainState) -> None:
        attempts.append(1)
        raise monitored.AbortedError("down")

    with pytest.raises(monitored.AbortedError, match="down"):
        async with monitored.MonitoredSession(
            state, max_recoveries=2, hooks=[Recorder("r", log)]
        ) as sess:
            await sess.run(always_aborted)
    assert len(attempts) == 3  # the first try and two recoveries
    assert log.count(("r", "after_create_session")) == 3


async def test_aborted_while_creating_the_session_is_retried(state: TrainState, log: list) -> None:
    failures = [monitored.UnavailableError("checkpoint store down")]

    class FlakyRestore:
        def restore_state(self) -> None:
            if failures:
                raise failures.pop()

    async with monitored.MonitoredSession(state, hooks=[FlakyRestore(), Recorder("r", log)]):
        pass
    assert log.count(("r", "after_create_session")) == 1
    assert log[-1] == ("r", "end")


async def test_run_step_fn_recovers_too(state: TrainState) -> None:
    failures = [monitored.AbortedError("x")]

    async def step_fn(ctx: monitored.StepContext) -> Any:
        if failures:
            raise failures.pop()
        return await ctx.run_with_hooks(counting_step)

    async with monitored.MonitoredSession(state) as sess:
        await sess.run_step_fn(step_fn)
    assert state.global_step == 1


async def test_singular_session_does_not_recover(state: TrainState) -> None:
    def aborted(state: TrainState) -> None:
        raise monitored.AbortedError("down")

    with pytest.raises(monitored.AbortedError):
        async with monitored.SingularMonitoredSession(state) as sess:
            await sess.run(aborted)


async def test_singular_session_raw_session_runs_without_hooks(
    state: TrainState, log: list
) -> None:
    async with monitored.SingularMonitoredSession(state, hooks=[Recorder("r", log)]) as sess:
        out = await sess.raw_session().run(counting_step)
        assert sess.raw_session().state is state
    assert out["loss"] == 3.0
    assert ("r", "before_run") not in log


# --- hooks: sync, async, partial signatures --------------------------------------------------


async def test_async_hooks_and_partial_signatures(state: TrainState) -> None:
    seen: list[str] = []

    class AsyncHook:
        async def before_run(self, run_context: Any) -> SessionRunArgs:
            seen.append("async before_run")
            return SessionRunArgs("loss")

        async def after_run(self, run_values: Any) -> None:  # takes only run_values
            seen.append(f"async after_run {float(run_values.results)}")

        def end(self) -> None:  # takes nothing
            seen.append("end")

    class ReturnsAwaitable:
        def after_run(self, run_context: Any) -> Any:
            async def later() -> None:
                seen.append("awaited")

            return later()

    async with monitored.MonitoredSession(state, hooks=[AsyncHook(), ReturnsAwaitable()]) as sess:
        await sess.run(counting_step)
    assert seen == ["async before_run", "async after_run 3.0", "awaited", "end"]


async def test_session_run_hook_defaults_are_not_called(state: TrainState) -> None:
    class OnlyAfterRun(monitored.SessionRunHook):
        def after_run(self, run_context: Any, run_values: Any) -> None:
            pass

    async with monitored.MonitoredSession(state, hooks=[OnlyAfterRun()]) as sess:
        plan = sess._require_plan()
        assert len(plan["after_run"]) == 1
        assert plan["before_run"] == ()
        assert plan["begin"] == ()


async def test_the_same_hook_twice_is_an_error(state: TrainState) -> None:
    hook = Recorder("r", [])
    with pytest.raises(monitored.PluginValidationError, match="passed twice"):
        async with monitored.MonitoredSession(state, hooks=[hook, hook]):
            pass


async def test_call_hook_runs_extension_hooks_in_order(state: TrainState) -> None:
    class Listener:
        def __init__(self, answer: bool | None) -> None:
            self.answer = answer

        async def after_save(self, step: int, path: str) -> bool | None:
            return self.answer

    async with monitored.MonitoredSession(state, hooks=[Listener(None), Listener(True)]) as sess:
        assert await sess.call_hook("after_save", sess, 3, "ckpt-3") == [None, True]
        assert await sess.call_first("after_save", sess, 3, "ckpt-3") is True


async def test_plugin_states_are_namespaced_and_versioned(state: TrainState) -> None:
    class Patience:
        plugin_state_version = 2

        def __init__(self) -> None:
            self.bad_steps = 0

        def plugin_state(self) -> dict[str, int]:
            return {"bad_steps": self.bad_steps}

        def load_plugin_state(self, state: dict[str, int]) -> None:
            self.bad_steps = state["bad_steps"]

    first, second = Patience(), Patience()
    first.bad_steps, second.bad_steps = 3, 5
    async with monitored.MonitoredSession(state, hooks=[first, second]) as sess:
        saved = await sess.plugin_states()
    assert saved == {
        "hooks[0]:Patience": {"version": 2, "state": {"bad_steps": 3}},
        "hooks[1]:Patience": {"version": 2, "state": {"bad_steps": 5}},
    }
    again = [Patience(), Patience()]
    async with monitored.MonitoredSession(TrainState(), hooks=again) as sess:
        await sess.load_plugin_states(saved)
        assert [h.bad_steps for h in again] == [3, 5]
        newer = {"hooks[0]:Patience": {"version": 3, "state": {}}}
        with pytest.raises(
            monitored.PluginError, match="state version 3 .* reads versions up to 2"
        ):
            await sess.load_plugin_states(newer)


async def test_plugin_state_versions_load_plugin_state_learns_the_saved_version(
    state: TrainState,
) -> None:
    """A plugin migrates the state an older version of it saved (docs/plugins.md's example)."""

    class Patience:
        plugin_name = "patience"
        plugin_state_version = 2  # version 1 saved {"left": patience - wait}

        def __init__(self) -> None:
            self.wait = 0
            self.versions: list[int] = []

        def plugin_state(self) -> dict[str, int]:
            return {"wait": self.wait}

        def load_plugin_state(self, state: dict[str, int], version: int) -> None:
            self.versions.append(version)
            self.wait = 5 - state["left"] if version == 1 else state["wait"]

    hook = Patience()
    async with monitored.MonitoredSession(state, hooks=[hook]) as sess:
        await sess.load_plugin_states({"patience": {"version": 1, "state": {"left": 2}}})
        assert hook.wait == 3
        await sess.load_plugin_states({"patience": {"state": {"left": 4}}})  # no version: 1
        assert hook.wait == 1
        await sess.load_plugin_states(await sess.plugin_states())
        assert hook.wait == 1
    assert hook.versions == [1, 1, 2]


async def test_no_saved_state_starts_fresh_at_creation_and_keeps_the_state_later(
    state: TrainState, caplog: pytest.LogCaptureFixture
) -> None:
    """After a NaN rollback the log said "it starts fresh" though the counter carried on."""

    class Counter:
        plugin_name = "counter"

        def __init__(self) -> None:
            self.count = 4

        def plugin_state(self) -> dict[str, int]:
            return {"count": self.count}

        def load_plugin_state(self, state: dict[str, int]) -> None:
            self.count = state["count"]

    class Restorer:
        async def restore_state(self, session: Any) -> str:
            await session.load_plugin_states({})  # a checkpoint without the counter
            return "somewhere"

    counter = Counter()
    caplog.set_level(logging.INFO, logger="monitored")
    async with monitored.MonitoredSession(state, hooks=[Restorer(), counter]) as sess:
        at_creation = [m for m in caplog.messages if "No saved state" in m]
        await sess.load_plugin_states({})  # a rollback's restore
        later = [m for m in caplog.messages if "No saved state" in m][len(at_creation) :]
    assert counter.count == 4
    assert at_creation == [
        "No saved state for hook 'counter' "
        f"({Counter.__module__}.{Counter.__qualname__}) in what was restored; it starts fresh"
    ]
    assert later == [at_creation[0].replace("it starts fresh", "it keeps the state it has")]


async def test_a_tf1_style_load_plugin_state_without_the_version_still_works(
    state: TrainState,
) -> None:
    class Positional(monitored.SessionRunHook):
        plugin_name = "positional"

        def __init__(self) -> None:
            self.got: list[Any] = []

        def plugin_state(self, sess: Any) -> dict[str, int]:
            return {"n": 1}

        def load_plugin_state(self, sess: Any, saved: Any) -> None:
            self.got.append(saved)

    hook = Positional()
    async with monitored.MonitoredSession(state, hooks=[hook]) as sess:
        await sess.load_plugin_states({"positional": {"version": 1, "state": {"n": 7}}})
    assert hook.got == [{"n": 7}]


async def test_a_stop_from_a_private_helper_names_the_public_method_that_called_it(
    state: TrainState, caplog: pytest.LogCaptureFixture
) -> None:
    class Watcher:
        def after_run(self, run_context: Any, run_values: Any) -> None:
            self._decide(run_context)

        def _decide(self, run_context: Any) -> None:
            run_context.request_stop()

    with caplog.at_level(logging.INFO, logger="monitored"):
        async with monitored.MonitoredSession(state, hooks=[Watcher()]) as sess:
            await sess.run(counting_step)
    assert any(
        m.endswith("stop requested by " + Watcher.after_run.__qualname__) for m in caplog.messages
    )


async def test_only_plugins_holding_state_are_said_to_start_fresh(
    state: TrainState, caplog: pytest.LogCaptureFixture
) -> None:
    class Holder:
        def __init__(self, plugin_name: str, state: dict[str, int] | None) -> None:
            self.plugin_name = plugin_name
            self._state = state
            self.loaded: list[dict[str, int]] = []

        def plugin_state(self) -> dict[str, int] | None:
            return self._state

        def load_plugin_state(self, state: dict[str, int]) -> None:
            self.loaded.append(state)

    busy, idle = Holder("busy", {"wait": 2}), Holder("idle", None)
    async with monitored.MonitoredSession(state, hooks=[busy, idle]) as sess:
        with caplog.at_level(logging.DEBUG, logger="monitored"):
            await sess.load_plugin_states({})
    said = [(r.levelno, r.getMessage()) for r in caplog.records if "No saved state" in r.message]
    assert [level for level, _ in said] == [logging.INFO, logging.DEBUG]
    assert "hook 'busy'" in said[0][1]
    assert "hook 'idle'" in said[1][1]
    assert busy.loaded == idle.loaded == []


@pytest.mark.parametrize(
    ("entry", "shown"),
    [
        ([1, 2], "a list"),
        ({"version": 1}, "a mapping {'version': int}"),
        ({"version": 1, "state": [3]}, "'state': list"),
        ({"version": "2", "state": {}}, "'version': str"),
        ({"version": True, "state": {}}, "'version': bool"),
        ({"version": 0, "state": {}}, "'version': int"),
    ],
)
async def test_a_malformed_saved_state_names_the_plugin(
    state: TrainState, entry: Any, shown: str
) -> None:
    class Keeper:
        plugin_name = "keeper"

        def plugin_state(self) -> dict[str, int]:
            return {}

        def load_plugin_state(self, state: dict[str, int]) -> None:
            pytest.fail("a malformed entry must not reach the plugin")

    async with monitored.MonitoredSession(state, hooks=[Keeper()]) as sess:
        with pytest.raises(monitored.PluginError, match="saved state of hook 'keeper'") as info:
            await sess.load_plugin_states({"keeper": entry})
    assert shown in str(info.value)
    assert info.value.plugin == "keeper"


async def test_fetch_and_write_summaries(state: TrainState) -> None:
    written = []

    class Sink:
        def write_summaries(self, step: int, summaries: dict[str, Any]) -> None:
            written.append((step, dict(summaries)))

    async with monitored.MonitoredSession(state, hooks=[Sink()]) as sess:
        await sess.run(counting_step)
        assert sess.has_summary_sinks
        assert sess.fetch({"loss": "loss", "step": "global_step"}) == {"loss": 3.0, "step": 1}
        await sess.write_summaries(1, {"loss": 3.0})
    assert written == [(1, {"loss": 3.0})]


def test_run_signature_is_positional_only_for_the_step() -> None:
    params = inspect.signature(monitored.MonitoredSession.run).parameters
    assert params["step_fn"].kind is inspect.Parameter.POSITIONAL_ONLY


# --- the event loop ----------------------------------------------------------------------


async def test_background_tasks_run_during_a_loop_of_sync_steps(state: TrainState) -> None:
    ticks = []

    async def ticker() -> None:
        while True:
            ticks.append(state.global_step)
            await anyio.lowlevel.checkpoint()

    class Starter:
        def after_create_session(self, coord: monitored.Coordinator) -> None:
            coord.start_soon(ticker)

    async with monitored.MonitoredSession(state, hooks=[Starter()]) as sess:
        deadline = time.monotonic() + 0.1
        while time.monotonic() < deadline:
            await sess.run(counting_step)
    assert len(ticks) > 3
    assert ticks[-1] > 0  # it ran while steps were being taken


async def test_a_cancel_scope_around_a_sync_loop_takes_effect(state: TrainState, log: list) -> None:
    with anyio.move_on_after(0.05) as scope:
        async with monitored.MonitoredSession(state, hooks=[Recorder("r", log)]) as sess:
            while not sess.should_stop():
                await sess.run(counting_step)
    assert scope.cancelled_caught
    assert state.global_step > 0
    assert ("r", "end") not in log  # a cancellation is not a normal end


async def test_plugin_name_keeps_a_hooks_state_key_stable(state: TrainState) -> None:
    class Named:
        plugin_name = "early-stopping"

        def plugin_state(self) -> dict[str, int]:
            return {"bad": 1}

    async with monitored.MonitoredSession(state, hooks=[Recorder("r", []), Named()]) as sess:
        assert await sess.plugin_states() == {"early-stopping": {"version": 1, "state": {"bad": 1}}}


async def test_plugin_name_must_be_a_string(state: TrainState) -> None:
    class Bad:
        plugin_name = 3

        def end(self) -> None:
            pass

    with pytest.raises(monitored.PluginError, match="plugin_name must be a non-empty string"):
        async with monitored.MonitoredSession(state, hooks=[Bad()]):
            pass


async def test_close_raises_a_background_failure_without_calling_end(
    state: TrainState, log: list
) -> None:
    sess = monitored.MonitoredSession(state, hooks=[Recorder("r", log)])
    await sess.__aenter__()
    sess.coord.request_stop(OSError("writer failed"))
    with pytest.raises(OSError, match="writer failed"):
        await sess.close()
    assert ("r", "end") not in log


# --- StopIteration inside steps and hooks (PEP 479) ----------------------------------------


async def test_stop_iteration_from_a_sync_step_is_a_normal_end(
    state: TrainState, log: list
) -> None:
    batches = iter([1, 2])

    def step(state: TrainState) -> dict[str, Any]:
        state.global_step += next(batches)
        return {}

    async with monitored.MonitoredSession(state, hooks=[Recorder("r", log)]) as sess:
        while not sess.should_stop():
            await sess.run(step)
    assert state.global_step == 3
    assert log[-1] == ("r", "end")


async def test_stop_iteration_from_a_feed_fn_hook_is_a_normal_end(
    state: TrainState, log: list
) -> None:
    batches = iter([{"x": 1}])
    hooks = [monitored.FeedFnHook(lambda: next(batches)), Recorder("r", log)]
    async with monitored.MonitoredSession(state, hooks=hooks) as sess:
        while not sess.should_stop():
            await sess.run(counting_step)
    assert state.global_step == 1
    assert log[-1] == ("r", "end")


async def test_stop_iteration_from_after_run_and_from_run_step_fn(
    state: TrainState, log: list
) -> None:
    class Exhausted:
        def after_run(self) -> None:
            raise StopIteration

    async with monitored.MonitoredSession(state, hooks=[Exhausted()]) as sess:
        with pytest.raises(
            monitored.OutOfRangeError, match=r"hook 'after_run' of hook 'hooks\[0\]"
        ):
            await sess.run(counting_step)

    def step_fn(ctx: monitored.StepContext) -> None:
        raise StopIteration

    async with monitored.MonitoredSession(TrainState(), hooks=[Recorder("r", log)]) as sess:
        await sess.run_step_fn(step_fn)
    assert log[-1] == ("r", "end")


# --- re-entrancy ------------------------------------------------------------------------------


async def test_run_from_inside_a_hook_is_refused(state: TrainState) -> None:
    class Reentrant:
        async def after_run(self, run_context: Any) -> None:
            await run_context.session.run(counting_step)

    with pytest.raises(RuntimeError, match="run called from inside a hook or a step"):
        async with monitored.MonitoredSession(state, hooks=[Reentrant()]) as sess:
            await sess.run(counting_step)
    assert state.global_step == 1


async def test_run_from_after_create_session_is_refused(state: TrainState) -> None:
    class Eager:
        async def after_create_session(self, session: monitored.MonitoredSession) -> None:
            await session.run(counting_step)

    with pytest.raises(RuntimeError, match="run called from inside a hook"):
        async with monitored.MonitoredSession(state, hooks=[Eager()]):
            pass


async def test_a_hook_object_implementing_nothing_is_an_error(state: TrainState) -> None:
    class Typo:
        def after_runs(self, run_context: Any) -> None:
            pass

    with pytest.raises(
        monitored.PluginValidationError,
        match="look like misspelled hook names; did you mean 'after_run' for 'after_runs'",
    ):
        async with monitored.MonitoredSession(state, hooks=[Typo()]):
            pass


async def test_static_and_class_methods_are_hooks(state: TrainState) -> None:
    seen = []

    class Static:
        @staticmethod
        def before_run() -> None:
            seen.append("static")

        @classmethod
        def after_run(cls) -> None:
            seen.append("class")

    async with monitored.MonitoredSession(state, hooks=[Static()]) as sess:
        await sess.run(counting_step)
    assert seen == ["static", "class"]


async def test_recovery_cancels_the_background_tasks_of_the_old_incarnation(
    state: TrainState,
) -> None:
    failures = [monitored.AbortedError("x")]
    started = []

    async def heartbeat() -> None:
        await anyio.sleep(60)

    class Starter:
        def after_create_session(self, coord: monitored.Coordinator) -> None:
            coord.start_soon(heartbeat)
            started.append(1)

    def step(state: TrainState) -> dict[str, Any]:
        if failures:
            raise failures.pop()
        return counting_step(state)

    async with monitored.MonitoredSession(state, hooks=[Starter()]) as sess:
        await anyio.lowlevel.checkpoint()
        await sess.run(step)
        await anyio.sleep(0.01)
        assert sess.coord.running_tasks == 1
    assert started == [1, 1]


async def test_a_numpy_global_step_becomes_an_int_and_an_array_is_refused(
    state: TrainState,
) -> None:
    def numpy_step(state: TrainState) -> None:
        state.global_step = np.int64(state.global_step + 1)

    def array_step(state: TrainState) -> None:
        state.global_step = np.asarray(state.global_step + 1)

    async with monitored.MonitoredSession(state) as sess:
        await sess.run(numpy_step)
        assert type(state.global_step) is int
        with pytest.raises(TypeError, match="step function 'array_step' left state.global_step"):
            await sess.run(array_step)


async def test_two_hooks_with_one_plugin_name_are_an_error(state: TrainState) -> None:
    class Named:
        plugin_name = "early-stopping"

        def end(self) -> None:
            pass

    with pytest.raises(
        monitored.PluginValidationError, match="'early-stopping' is already registered"
    ):
        async with monitored.MonitoredSession(state, hooks=[Named(), Named()]):
            pass


async def test_implements_tells_which_hooks_are_present(state: TrainState) -> None:
    class Saver:
        def after_save(self) -> None:
            pass

    async with monitored.MonitoredSession(state, hooks=[Saver()]) as sess:
        assert sess.implements("after_save")
        assert not sess.implements("write_summaries")
        assert not sess.has_summary_sinks


async def test_implementers_are_the_hook_objects_in_call_order(state: TrainState) -> None:
    class Sink:
        def write_summaries(self, session: object, step: int, summaries: object) -> None:
            pass

    class Saver:
        def after_save(self) -> None:
            pass

    first, second = Sink(), Sink()
    async with monitored.MonitoredSession(state, hooks=[first, Saver(), second]) as sess:
        assert sess.implementers("write_summaries") == (first, second)
        assert sess.implementers("restore_state") == ()


# -- work deferred until every hook has run -------------------------------------------------
async def test_call_after_hooks_runs_after_every_after_run_in_order(state: TrainState) -> None:
    seen: list[str] = []

    class Early:
        def after_run(self, run_context: Any, run_values: Any) -> None:
            seen.append("early.after_run")

            async def later() -> None:
                seen.append("deferred 1")

            run_context.session.call_after_hooks(later)
            run_context.session.call_after_hooks(lambda: seen.append("deferred 2"))

    class Late:
        def after_run(self, run_context: Any, run_values: Any) -> None:
            seen.append("late.after_run")

    async with monitored.MonitoredSession(state, hooks=[Early(), Late()]) as sess:
        await sess.run(counting_step)
        assert seen == ["early.after_run", "late.after_run", "deferred 1", "deferred 2"]
        seen.clear()
        await sess.run(counting_step)
        assert seen == ["early.after_run", "late.after_run", "deferred 1", "deferred 2"]


async def test_call_after_hooks_in_after_create_session_runs_after_every_hook(
    state: TrainState,
) -> None:
    seen: list[str] = []

    class First:
        def after_create_session(self, session: Any, coord: Any) -> None:
            session.call_after_hooks(lambda: seen.append("deferred"))

    class Second:
        def after_create_session(self, session: Any, coord: Any) -> None:
            seen.append("second")

    async with monitored.MonitoredSession(state, hooks=[First(), Second()]):
        assert seen == ["second", "deferred"]


async def test_a_deferred_stop_request_stops_after_this_step(state: TrainState) -> None:
    class Hook:
        def after_run(self, run_context: Any, run_values: Any) -> None:
            run_context.session.call_after_hooks(run_context.request_stop)

    async with monitored.MonitoredSession(state, hooks=[Hook()]) as sess:
        await sess.run(counting_step)
        assert sess.should_stop()


async def test_call_after_hooks_outside_an_event_runs_at_once(state: TrainState) -> None:
    """A deferral requested outside an event (in ``begin``, or from a hook's method
    called directly, as TF1 users' hook tests do) has nothing to wait for."""
    seen: list[str] = []

    class Hook:
        def begin(self, session: Any) -> None:
            assert session.call_after_hooks(lambda: seen.append("in begin")) is None
            seen.append("begin returns")

    async def later() -> str:
        seen.append("async")
        return "done"

    async with monitored.MonitoredSession(state, hooks=[Hook()]) as sess:
        assert seen == ["in begin", "begin returns"]
        assert sess.call_after_hooks(lambda: 42) == 42
        pending = sess.call_after_hooks(later)
        assert seen == ["in begin", "begin returns"]  # an awaitable, for the caller
        assert await pending == "done"
        assert seen[-1] == "async"


async def test_a_failing_deferred_callback_names_itself_and_the_step(state: TrainState) -> None:
    def save() -> None:
        raise OSError("disk full")

    class Hook:
        def after_run(self, run_context: Any, run_values: Any) -> None:
            run_context.session.call_after_hooks(save)

    with pytest.raises(OSError, match="disk full") as info:
        async with monitored.MonitoredSession(state, hooks=[Hook()]) as sess:
            await sess.run(counting_step)
    assert any("save, deferred with call_after_hooks at step 1" in n for n in info.value.__notes__)


# -- a global step that never moves -----------------------------------------------------------
def forgetful_step(state: TrainState) -> None:
    state["w"] += 1  # forgets state.global_step += 1


async def test_a_global_step_that_never_moves_is_warned_about_once(
    state: TrainState, caplog: pytest.LogCaptureFixture
) -> None:
    from monitored._core._session import STALLED_STEPS_WARNING

    async with monitored.MonitoredSession(state) as sess:
        await run_steps(sess, STALLED_STEPS_WARNING - 1, forgetful_step)
        assert not [r for r in caplog.records if "has not been increased" in r.getMessage()]
        await run_steps(sess, 3 * STALLED_STEPS_WARNING, forgetful_step)
    warnings = [r for r in caplog.records if "has not been increased" in r.getMessage()]
    assert len(warnings) == 1
    assert warnings[0].levelname == "WARNING"
    assert "forgetful_step" in warnings[0].getMessage()
    assert "state.global_step += 1" in warnings[0].getMessage()


async def test_a_moving_global_step_is_not_warned_about(
    state: TrainState, caplog: pytest.LogCaptureFixture
) -> None:
    async with monitored.MonitoredSession(state) as sess:
        await run_steps(sess, 50)
    assert not [r for r in caplog.records if "has not been increased" in r.getMessage()]


async def test_evaluation_steps_after_training_steps_are_not_warned_about(
    state: TrainState, caplog: pytest.LogCaptureFixture
) -> None:
    # Issue 22: a validation or test pass in the managed session leaves the global
    # step alone; once this session's steps have moved it, that is not the trap.
    from monitored._core._session import STALLED_STEPS_WARNING

    async with monitored.MonitoredSession(state) as sess:
        await run_steps(sess, 5)
        for _ in range(3):  # three "epochs": a validation pass after each
            await run_steps(sess, 3 * STALLED_STEPS_WARNING, forgetful_step)
            await run_steps(sess, 5)
    assert not [r for r in caplog.records if "has not been increased" in r.getMessage()]


async def test_a_restored_session_whose_step_never_moves_is_warned_about(
    state: TrainState, caplog: pytest.LogCaptureFixture
) -> None:
    # "Advanced" means in this session: a state that starts at step 40 (restored)
    # and whose steps never move it is the trap the warning is for.
    from monitored._core._session import STALLED_STEPS_WARNING

    state.global_step = 40
    async with monitored.MonitoredSession(state) as sess:
        await run_steps(sess, 2 * STALLED_STEPS_WARNING, forgetful_step)
    warnings = [r for r in caplog.records if "has not been increased" in r.getMessage()]
    assert len(warnings) == 1
    assert "still 40" in warnings[0].getMessage()


# -- TF1's session.run(fetches) -----------------------------------------------------------------
@pytest.mark.parametrize("fetches", ["loss", ["loss", "w"], {"cost": "loss"}, ("w",)])
async def test_run_given_names_to_read_says_to_use_fetch(state: TrainState, fetches: Any) -> None:
    # Issue 22: session.run(m.lr), TF1's way to read a value, was a bare
    # "'str' object is not callable" from inside the step.
    async with monitored.MonitoredSession(state) as sess:
        await sess.run(counting_step)
        with pytest.raises(
            TypeError, match=r"run takes a step function, not values to read"
        ) as info:
            await sess.run(fetches)
        assert f"session.fetch({fetches!r})" in str(info.value)
        assert "SessionRunArgs" in str(info.value)
        assert sess.fetch(fetches) is not None  # what the message says works
        assert state.global_step == 1  # nothing ran


async def test_run_given_a_name_on_a_traced_step_says_to_use_fetch(state: TrainState) -> None:
    class Tracer:
        def before_run(self, run_context: Any) -> SessionRunArgs:
            return SessionRunArgs(options=monitored.RunOptions(trace=True))

    async with monitored.MonitoredSession(state, hooks=[Tracer()]) as sess:
        with pytest.raises(TypeError, match=r"session.fetch\('w'\)") as info:
            await sess.run("w")
        assert info.value.__context__ is None or info.value.__suppress_context__


async def test_run_given_something_else_that_is_not_callable_says_what_run_takes(
    state: TrainState,
) -> None:
    async with monitored.MonitoredSession(state) as sess:
        with pytest.raises(TypeError, match=r"MonitoredSession.run: got int, not a step function"):
            await sess.run(3)


async def test_a_raw_session_given_a_name_says_to_use_fetch(state: TrainState) -> None:
    async with monitored.SingularMonitoredSession(state) as sess:
        raw = sess.raw_session()
        assert raw is not None
        with pytest.raises(TypeError, match=r"RawSession.run\('w'\): run takes a step function"):
            await raw.run("w")


# -- saying what is going on ----------------------------------------------------------------------
async def test_session_start_logs_the_loaded_plugins(
    state: TrainState, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="monitored")
    async with monitored.MonitoredSession(state, disable_plugins=["checkpoint"]):
        pass
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Loaded plugins")]
    assert "checkpoint" not in line


async def test_the_loaded_plugins_line_says_what_each_plugin_said_it_does(
    state: TrainState, caplog: pytest.LogCaptureFixture, fake_plugin: Any
) -> None:
    fake_plugin(
        "tracker",
        """
        def plugin_status(session):
            return "off:   set TRACKER_URI" + chr(10) + "  to log"  # folded onto one line
        """,
    )
    fake_plugin("quiet", "def plugin_status(session):\n    return None\n")
    fake_plugin("long", "def plugin_status(session):\n    return 'x' * 500\n")
    caplog.set_level(logging.INFO, logger="monitored")
    async with monitored.MonitoredSession(state):
        pass
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Loaded plugins")]
    assert "tracker (monitored-tracker 1.0; off: set TRACKER_URI to log)" in line
    assert "quiet (monitored-quiet 1.0)" in line
    assert f"long (monitored-long 1.0; {'x' * 119}…)" in line


async def test_a_plugin_status_that_is_not_text_is_an_error_naming_the_plugin(
    state: TrainState, fake_plugin: Any
) -> None:
    fake_plugin("tracker", "def plugin_status(session):\n    return {'on': True}\n")
    with pytest.raises(PluginError, match=r"plugin_status' of plugin 'tracker'.*returned dict"):
        async with monitored.MonitoredSession(state):
            pass


async def test_a_stop_request_is_logged_with_who_asked_and_the_step(
    state: TrainState, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="monitored")
    async with monitored.MonitoredSession(
        state, hooks=[monitored.StopAtStepHook(last_step=3)]
    ) as sess:
        await run_steps(sess, 3)
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Stopping")]
    assert line == "Stopping after step 3: stop requested by StopAtStepHook.after_run"


async def test_a_coordinator_stop_is_logged_with_who_asked(
    state: TrainState, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="monitored")

    def stopper(state: TrainState, coord: monitored.Coordinator) -> None:
        state.global_step += 1
        coord.request_stop()

    async with monitored.MonitoredSession(state) as sess:
        await sess.run(stopper, sess.coord)
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Stopping")]
    assert line.endswith(
        "stop requested by test_a_coordinator_stop_is_logged_with_who_asked.<locals>.stopper"
    )


async def test_a_step_context_stop_is_logged(
    state: TrainState, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="monitored")

    def step_fn(step_context: monitored.StepContext) -> None:
        step_context.request_stop()

    async with monitored.MonitoredSession(state) as sess:
        await sess.run_step_fn(step_fn)
    assert "Stopping after step 0: stop requested by step function step_fn" in caplog.messages


async def test_a_sync_hook_calling_session_run_is_refused_at_once(state: TrainState) -> None:
    """TF1 hooks called ``run_context.session.run(...)``; the coroutine was silently dropped."""

    class TF1Habit(monitored.SessionRunHook):
        def after_run(self, run_context: Any, run_values: Any) -> None:
            run_context.session.run(counting_step)  # no await: TF1's habit

    with pytest.raises(RuntimeError, match="run called from inside a hook or a step") as info:
        async with monitored.MonitoredSession(state, hooks=[TF1Habit()]) as sess:
            await sess.run(counting_step)
    assert any("TF1Habit" in note for note in info.value.__notes__)
    assert state.global_step == 1


# --- TF1 habits: a run that is never awaited, `with` instead of `async with` ------------------
async def test_run_without_await_in_a_should_stop_loop_is_an_error(state: TrainState) -> None:
    with pytest.raises(
        RuntimeError,
        match=r"called without await.*`await sess.run\(step_fn.*Jupyter, `await main\(\)`",
    ):
        async with monitored.MonitoredSession(
            state, hooks=[monitored.StopAtStepHook(last_step=5)]
        ) as sess:
            for _ in range(3):  # a `while not sess.should_stop()` loop that would never end
                if sess.should_stop():
                    break
                sess.run(counting_step)  # forgot await
    assert state.global_step == 0


async def test_two_runs_without_await_are_caught_at_the_second(state: TrainState) -> None:
    async with monitored.MonitoredSession(state) as sess:
        sess.run(counting_step)
        with pytest.raises(RuntimeError, match="called without await"):
            sess.run(counting_step)
        await sess.run(counting_step)
    assert state.global_step == 1


async def test_a_run_never_awaited_before_the_block_ends_is_an_error(state: TrainState) -> None:
    log: list = []
    with pytest.raises(RuntimeError, match="called without await"):
        async with monitored.MonitoredSession(state, hooks=[Recorder("r", log)]) as sess:
            sess.run(counting_step)
    assert ("r", "end") not in log


async def test_an_awaited_run_created_before_should_stop_is_fine(state: TrainState) -> None:
    async with monitored.MonitoredSession(state) as sess:
        pending = sess.run(counting_step)
        await pending
        assert not sess.should_stop()
    assert state.global_step == 1


async def test_with_instead_of_async_with_says_what_to_write(state: TrainState) -> None:
    sess = monitored.MonitoredTrainingSession(state)
    with (
        pytest.raises(
            TypeError,
            match=r"async context manager: write `async with .*anyio.run.*Jupyter: `await main\(\)`",
        ),
        sess,
    ):
        pass


# --- fetches are values after the step ----------------------------------------------------------
async def test_a_fetched_state_entry_is_its_value_after_the_step(state: TrainState) -> None:
    """A deliberate difference from TF1, whose read of a variable in the same run as its
    update saw the value before it (in practice): see docs/tf1-migration.md."""
    hook = Recorder("r", [], fetches=["global_step", "w"])
    async with monitored.MonitoredSession(state, hooks=[hook]) as sess:
        await run_steps(sess, 2)
    assert [int(step) for step, _ in hook.results] == [1, 2]
    np.testing.assert_array_equal(hook.results[0][1], [1, 1, 1])


def test_a_hook_class_instead_of_an_instance_is_refused_up_front(state: TrainState) -> None:
    class LogEvery(monitored.SessionRunHook):
        pass

    with pytest.raises(TypeError, match=r"hooks\[1\] is the class LogEvery.*LogEvery\(\.\.\.\)"):
        monitored.MonitoredSession(state, hooks=[LogEvery(), LogEvery])


class ClosingWatcher:
    """Records what ``before_close`` is told, and whether the coordinator's threads ran then."""

    def __init__(self, fail: bool = False) -> None:
        self.errors: list[BaseException | None] = []
        self.fail = fail
        self.ended = False

    def end(self, session: Any) -> None:
        self.ended = True

    def before_close(self, session: Any, error: BaseException | None) -> None:
        self.errors.append(error)
        if self.fail:
            raise OSError("the tracker is gone")


async def test_before_close_hears_a_normal_end_after_end(state: TrainState) -> None:
    watcher = ClosingWatcher()
    async with monitored.MonitoredSession(state, hooks=[watcher], stop_grace_period_secs=7) as sess:
        assert sess.stop_grace_period_secs == 7
        await run_steps(sess, 2)
    assert watcher.ended
    assert watcher.errors == [None]


async def test_before_close_hears_the_error_that_ended_the_session(state: TrainState) -> None:
    watcher = ClosingWatcher()
    with pytest.raises(ValueError, match="bad step"):
        async with monitored.MonitoredSession(state, hooks=[watcher]) as sess:
            await run_steps(sess, 1)
            raise ValueError("bad step")
    assert not watcher.ended
    [error] = watcher.errors
    assert isinstance(error, ValueError)


async def test_before_close_hears_an_end_hook_that_failed(state: TrainState) -> None:
    class FailingEnd:
        def end(self, session: Any) -> None:
            raise KeyError("end failed")

    watcher = ClosingWatcher()
    with pytest.raises(KeyError, match="end failed"):
        async with monitored.MonitoredSession(state, hooks=[FailingEnd(), watcher]) as sess:
            await run_steps(sess, 1)
    [error] = watcher.errors
    assert isinstance(error, KeyError)


async def test_before_close_failing_after_an_error_is_logged_not_raised_over_it(
    state: TrainState, caplog: Any
) -> None:
    with pytest.raises(ValueError, match="bad step"):
        async with monitored.MonitoredSession(state, hooks=[ClosingWatcher(fail=True)]) as sess:
            await run_steps(sess, 1)
            raise ValueError("bad step")
    assert any(
        "a before_close hook failed too" in r.getMessage()
        and "the tracker is gone" in r.getMessage()
        for r in caplog.records
    )


async def test_before_close_failing_after_a_normal_end_is_raised(state: TrainState) -> None:
    with pytest.raises(OSError, match="the tracker is gone"):
        async with monitored.MonitoredSession(state, hooks=[ClosingWatcher(fail=True)]) as sess:
            await run_steps(sess, 1)


class _SignalStopper:
    """A hook that stops the session as a signal handler would, and says so."""

    def __init__(self, at_step: int) -> None:
        self.at_step = at_step
        self.preempted_by: str | None = None

    def after_run(self, run_context: monitored.SessionRunContext, run_values: Any) -> None:
        if run_context.session.state.global_step == self.at_step:
            self.preempted_by = "SIGTERM"
            run_context.request_stop()


async def test_stopped_by_signal_names_the_signal_a_hook_stopped_the_session_on() -> None:
    quiet = _SignalStopper(at_step=-1)
    state = TrainState({"w": np.zeros(2)})
    hooks: list[object] = [quiet, monitored.StopAtStepHook(5)]
    async with monitored.MonitoredSession(state, hooks=hooks) as session:
        assert session.stopped_by_signal is None
        while not session.should_stop():
            await session.run(counting_step)
    assert session.stopped_by_signal is None, "a stop at the last step is no signal"

    stopper = _SignalStopper(at_step=3)
    odd = _SignalStopper(at_step=-1)
    odd.preempted_by = 15  # type: ignore[assignment]  # not a name: not taken for one
    hooks = [odd, stopper, monitored.StopAtStepHook(100)]
    async with monitored.MonitoredSession(TrainState({"w": np.zeros(2)}), hooks=hooks) as session:
        while not session.should_stop():
            await session.run(counting_step)
    assert session.state.global_step == 3
    assert session.stopped_by_signal == "SIGTERM", "still known after the session closed"


async def test_tf1_feed_dict_is_explained() -> None:
    state = monitored.TrainState({"w": np.zeros(1)})

    def step(state: monitored.TrainState, batch: Any = None) -> None:
        state.global_step += 1

    async with monitored.MonitoredSession(state) as sess:
        with pytest.raises(TypeError, match=r"feed_dict=.*await sess.run\(step, batch, lr\)"):
            await sess.run(step, feed_dict={"x": 1})
