"""Supervisor: managed_session, its services, recovery, pre-trained models and its errors."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from _helpers import hide_plugins, show_installed

import monitored
from monitored import MissingPluginError, Supervisor, UnsupportedArgumentError
from monitored.data import FIFOQueue, QueueRunner, add_queue_runner
from monitored.supervisor import SummaryFunctionError


def new_state() -> monitored.TrainState:
    return monitored.TrainState({"w": np.zeros(3, dtype=np.float32)}, seed=0)


def step(state: monitored.TrainState) -> dict[str, Any]:
    state["w"] += 1
    state.global_step += 1
    return {"loss": state["w"].sum()}


async def train(sv: Supervisor, steps: int, pause: float = 0.0) -> None:
    async with sv.managed_session() as sess:
        while not sv.should_stop() and sv.state.global_step < steps:
            await sess.run(step)
            if pause:
                await anyio.sleep(pause)


def checkpoints(directory: Path) -> list[int]:
    return sorted(int(p.name[len("model.ckpt-") : -5]) for p in directory.glob("model.ckpt-*.json"))


def listing(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir())


def tags(directory: Path) -> dict[str, list[int]]:
    import monitored_summaries

    found: dict[str, list[int]] = {}
    for path in sorted(directory.glob("events.out.tfevents.*")):
        for event in monitored_summaries.summary_iterator(path):
            for value in event.summary.value:
                found.setdefault(value.tag, []).append(event.step)
    return found


@pytest.fixture
def no_plugin(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``no_plugin("monitored_checkpoint")`` makes that plugin look uninstalled."""

    def hide(module: str) -> None:
        hide_plugins(monkeypatch, module.removeprefix("monitored_"))

    return hide


# -- the managed session --------------------------------------------------------------------------
async def test_managed_session_trains_checkpoints_and_saves_a_last_checkpoint(
    tmp_path: Path,
) -> None:
    sv = Supervisor(new_state(), logdir=tmp_path, save_model_secs=600)
    await train(sv, 7)
    assert sv.state.global_step == 7
    assert checkpoints(tmp_path) == [0, 7], "one when created, one at the normal end"
    assert sv.save_path == str(tmp_path / "model.ckpt")
    assert sv.should_stop()


async def test_a_restart_recovers_from_the_newest_checkpoint_and_skips_init_fn(
    tmp_path: Path,
) -> None:
    inits: list[int] = []
    await train(Supervisor(new_state(), logdir=tmp_path, init_fn=lambda s: inits.append(1)), 5)
    assert inits == [1]
    state = new_state()
    sv = Supervisor(state, logdir=tmp_path, init_fn=lambda s: inits.append(2))
    async with sv.managed_session() as sess:
        assert sess.restored_from == str(tmp_path / "model.ckpt-5")
        assert state.global_step == 5
        np.testing.assert_array_equal(state["w"], [5, 5, 5])
        await sess.run(step)
    assert inits == [1], "init_fn runs only when no checkpoint exists"
    assert checkpoints(tmp_path)[-1] == 6


async def test_init_op_runs_before_init_fn_and_local_init_op_every_time(tmp_path: Path) -> None:
    calls: list[str] = []
    sv = Supervisor(
        new_state(),
        logdir=None,
        init_op=lambda s: calls.append("init_op"),
        init_fn=lambda s: calls.append("init_fn"),
        local_init_op=lambda s: calls.append("local_init_op"),
    )
    await train(sv, 1)
    assert calls == ["init_op", "init_fn", "local_init_op"]


async def test_async_init_functions_are_awaited() -> None:
    calls: list[str] = []

    async def init_op(state: monitored.TrainState) -> None:
        calls.append("init_op")

    async def init_fn(state: monitored.TrainState) -> None:
        calls.append("init_fn")

    await train(Supervisor(new_state(), init_op=init_op, init_fn=init_fn), 1)
    assert calls == ["init_op", "init_fn"]


async def test_ready_op_that_reports_a_problem_fails_the_session() -> None:
    sv = Supervisor(new_state(), ready_op=lambda s: "w is not loaded", init_fn=lambda s: None)
    with pytest.raises(RuntimeError, match="w is not loaded"):
        await train(sv, 1)


async def test_logdir_none_disables_checkpoints_and_summaries(tmp_path: Path) -> None:
    inits: list[int] = []
    for _ in range(2):
        sv = Supervisor(new_state(), init_fn=lambda s: inits.append(1), save_summaries_secs=1)
        await train(sv, 3)
        assert sv.saver is None
        assert sv.summary_writer is None
        assert sv.save_path is None
    assert inits == [1, 1], "nothing to recover from: init_fn runs every time"
    with pytest.raises(RuntimeError, match="requires a summary writer"):
        sv.summary_computed(None, {"x": 1.0})


async def test_an_exception_in_the_body_is_reported_raised_and_saves_no_last_checkpoint(
    tmp_path: Path,
) -> None:
    sv = Supervisor(new_state(), logdir=tmp_path)
    boom = ValueError("bad batch")
    with pytest.raises(ValueError, match="bad batch"):
        async with sv.managed_session() as sess:
            for _ in range(4):
                await sess.run(step)
            raise boom
    assert sv.coord.exception is boom
    assert sv.should_stop()
    assert checkpoints(tmp_path) == [0], "a failed session does not checkpoint its end"


async def test_end_of_input_in_the_body_is_a_normal_end(tmp_path: Path) -> None:
    sv = Supervisor(new_state(), logdir=tmp_path)
    async with sv.managed_session() as sess:
        for _ in range(3):
            await sess.run(step)
        raise monitored.OutOfRangeError("epoch done")
    assert checkpoints(tmp_path) == [0, 3]
    assert sv.coord.exception is None


async def test_a_hook_stop_request_is_seen_by_should_stop(tmp_path: Path) -> None:
    sv = Supervisor(new_state(), hooks=[monitored.StopAtStepHook(last_step=4)])
    await train(sv, 100)
    assert sv.state.global_step == 4


async def test_request_stop_and_stop_on_exception() -> None:
    sv = Supervisor(new_state())
    async with sv.managed_session() as sess:
        await sess.run(step)
        sv.request_stop()
        assert sv.should_stop()
    sv = Supervisor(new_state())
    with pytest.raises(KeyError, match="lost"):
        async with sv.managed_session() as sess:
            with sv.stop_on_exception():
                raise KeyError("lost")
            assert sv.should_stop()
            await sess.run(step)


async def test_save_model_secs_zero_restores_but_saves_nothing(tmp_path: Path) -> None:
    await train(Supervisor(new_state(), logdir=tmp_path), 2)
    sv = Supervisor(new_state(), logdir=tmp_path, save_model_secs=0)
    await train(sv, 5)
    assert checkpoints(tmp_path) == [0, 2]
    assert sv.state.global_step == 5


async def test_saver_none_runs_without_checkpoints(tmp_path: Path) -> None:
    await train(Supervisor(new_state(), logdir=tmp_path, saver=None, save_summaries_secs=0), 2)
    assert checkpoints(tmp_path) == []


async def test_checkpoint_basename_and_a_given_saver_are_used(tmp_path: Path) -> None:
    from monitored_checkpoint import Saver

    sv = Supervisor(
        new_state(),
        logdir=tmp_path,
        saver=Saver(max_to_keep=1),
        checkpoint_basename="net",
        save_model_secs=1e-9,
    )
    await train(sv, 4)
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith("net")) == [
        "net-4.json",
        "net-4.safetensors",
    ]


async def test_the_checkpoint_service_saves_every_save_model_secs(tmp_path: Path) -> None:
    await train(Supervisor(new_state(), logdir=tmp_path, save_model_secs=1e-9), 3)
    assert checkpoints(tmp_path) == [0, 1, 2, 3]


async def test_prepare_or_wait_for_session_and_stop(tmp_path: Path) -> None:
    sv = Supervisor(new_state(), logdir=tmp_path)
    sess = await sv.prepare_or_wait_for_session()
    assert sv.session is sess
    await sess.run(step)
    with pytest.raises(RuntimeError, match="already manages an open session"):
        await sv.prepare_or_wait_for_session()
    await sv.stop()
    assert checkpoints(tmp_path) == [0, 1]
    assert sv.should_stop()


async def test_stop_raises_what_a_service_reported(tmp_path: Path) -> None:
    sv = Supervisor(new_state())
    sess = await sv.prepare_or_wait_for_session()
    await sess.run(step)
    sv.request_stop(OSError("disk gone"))
    with pytest.raises(OSError, match="disk gone"):
        await sv.stop()


async def test_wait_for_checkpoint_waits_then_initializes_when_none_appears(
    tmp_path: Path,
) -> None:
    inits: list[int] = []
    sv = Supervisor(
        new_state(), logdir=tmp_path, init_fn=lambda s: inits.append(1), recovery_wait_secs=0.01
    )
    sess = await sv.prepare_or_wait_for_session(wait_for_checkpoint=True, max_wait_secs=0.05)
    await sv.stop()
    assert inits == [1]
    assert sess.restored_from is None


async def test_wait_for_checkpoint_restores_one_that_appears(tmp_path: Path) -> None:
    await train(Supervisor(new_state(), logdir=tmp_path), 3)
    sv = Supervisor(new_state(), logdir=tmp_path, recovery_wait_secs=0.01)
    sess = await sv.prepare_or_wait_for_session(wait_for_checkpoint=True, max_wait_secs=5)
    assert sv.state.global_step == 3
    await sess.close()


async def test_start_standard_services_false_still_restores(tmp_path: Path) -> None:
    await train(Supervisor(new_state(), logdir=tmp_path), 2)
    first = tags(tmp_path)["global_step/sec"]
    sv = Supervisor(new_state(), logdir=tmp_path, save_model_secs=1e-9)
    async with sv.managed_session(start_standard_services=False) as sess:
        assert sv.state.global_step == 2
        await sess.run(step)
    assert checkpoints(tmp_path) == [0, 2], "no checkpoint service"
    assert tags(tmp_path)["global_step/sec"] == first, "no step counter service"


async def test_a_worker_waits_for_the_chief_and_runs_no_services(tmp_path: Path) -> None:
    state = new_state()
    await train(Supervisor(state, logdir=tmp_path), 1)
    worker = Supervisor(state, logdir=tmp_path, is_chief=False, save_model_secs=1e-9)
    assert worker.saver is None
    assert worker.summary_writer is None
    async with worker.managed_session() as sess:
        await sess.run(step)
        with pytest.raises(RuntimeError, match="Only chief"):
            worker.start_standard_services(sess)
    assert checkpoints(tmp_path) == [0, 1]


async def test_a_session_manager_replaces_the_init_arguments() -> None:
    calls: list[str] = []
    manager = monitored.SessionManager(monitored.Scaffold(init_fn=lambda s: calls.append("sm")))
    sv = Supervisor(new_state(), session_manager=manager)
    assert sv.session_manager is manager
    await train(sv, 1)
    assert calls == ["sm"]
    with pytest.raises(ValueError, match="either session_manager or init_fn"):
        Supervisor(new_state(), session_manager=manager, init_fn=lambda s: None)
    with pytest.raises(TypeError, match="SessionManager"):
        Supervisor(new_state(), session_manager=object())  # type: ignore[arg-type]


# -- summaries ------------------------------------------------------------------------------------
async def test_summary_services_write_the_function_step_records_and_step_rate(
    tmp_path: Path,
) -> None:
    import monitored_summaries

    def recording_step(state: monitored.TrainState) -> dict[str, Any]:
        monitored_summaries.scalar("recorded", state["w"][0])
        return step(state)

    sv = Supervisor(
        new_state(),
        logdir=tmp_path,
        save_summaries_secs=0.01,
        summary_op=lambda s: {"w_sum": s["w"].sum(), "w": s["w"]},
    )
    async with sv.managed_session() as sess:
        while sv.state.global_step < 20:
            await sess.run(recording_step)
            await anyio.sleep(0.003)
    found = tags(tmp_path)
    assert {"w_sum", "w", "recorded", "global_step/sec"} <= set(found)
    assert found["w_sum"][0] == 0, "the summary function runs when the services start"
    assert sv.summary_writer.closed, "closed at the end (close_summary_writer)"


async def test_close_summary_writer_false_keeps_the_writer_open(tmp_path: Path) -> None:
    """The session's summary hook releases the shared writer at its end; the
    Supervisor still holds it (TF1: the event file stays open for more summaries)."""
    sv = Supervisor(new_state(), logdir=tmp_path, save_summaries_secs=0.01)
    async with sv.managed_session(close_summary_writer=False) as sess:
        await sess.run(step)
    writer = sv.summary_writer
    assert writer is not None
    assert not writer.closed
    writer.close()


async def test_summary_op_none_leaves_summaries_to_summary_computed(tmp_path: Path) -> None:
    import monitored_summaries

    def recording_step(state: monitored.TrainState) -> dict[str, Any]:
        monitored_summaries.scalar("recorded", state["w"][0])
        return step(state)

    sv = Supervisor(new_state(), logdir=tmp_path, summary_op=None, save_summaries_secs=0.01)
    async with sv.managed_session() as sess:
        while sv.state.global_step < 10:
            await sess.run(recording_step)
            if sv.state.global_step % 5 == 0:
                sv.summary_computed(sess, {"mine": sess.state["w"][0]})
            await anyio.sleep(0.003)
    found = tags(tmp_path)
    assert found["mine"] == [5, 10]
    assert "recorded" not in found, "no summary service"
    assert "global_step/sec" in found, "the step counter still runs (as TF1)"


async def test_summary_computed_takes_a_summary_proto_and_a_step(tmp_path: Path) -> None:
    from tensorboardX.proto.summary_pb2 import Summary

    sv = Supervisor(new_state(), logdir=tmp_path, save_summaries_secs=0)
    async with sv.managed_session() as sess:
        proto = Summary(value=[Summary.Value(tag="proto", simple_value=1.5)])
        sv.summary_computed(sess, proto, global_step=42)
        sv.summary_computed(sess, proto.SerializeToString(), global_step=43)
        with pytest.raises(SummaryFunctionError, match="'bad'.*str"):
            sv.summary_computed(sess, {"bad": "text"})
    assert tags(tmp_path) == {"proto": [42, 43]}


async def test_save_summaries_secs_zero_and_global_step_none_switch_services_off(
    tmp_path: Path,
) -> None:
    await train(Supervisor(new_state(), logdir=tmp_path / "a", save_summaries_secs=0), 3, 0.01)
    assert "global_step/sec" not in tags(tmp_path / "a")
    sv = Supervisor(new_state(), logdir=tmp_path / "b", save_summaries_secs=0.01, global_step=None)
    await train(sv, 5, 0.01)
    assert "global_step/sec" not in tags(tmp_path / "b")


async def test_a_summary_function_returning_garbage_stops_training_naming_it(
    tmp_path: Path,
) -> None:
    def summaries(state: monitored.TrainState) -> Any:
        return [1, 2]

    sv = Supervisor(new_state(), logdir=tmp_path, summary_op=summaries)
    with pytest.raises(SummaryFunctionError, match="summary function .*summaries returned list"):
        await train(sv, 1000, 0.001)
    assert sv.state.global_step < 1000


async def test_a_failing_service_stops_the_loop_and_is_raised_from_managed_session(
    tmp_path: Path,
) -> None:
    def summaries(state: monitored.TrainState) -> Any:
        raise ZeroDivisionError("bad summary")

    sv = Supervisor(new_state(), logdir=tmp_path, summary_op=summaries)
    with pytest.raises(ZeroDivisionError, match="bad summary") as raised:
        async with sv.managed_session() as sess:
            while not sv.should_stop():
                await sess.run(step)
                await anyio.sleep(0.001)
    assert "Supervisor's summary service" in "\n".join(raised.value.__notes__)
    assert checkpoints(tmp_path) == [0], "no checkpoint of a failed session's end"


# -- loop and queue runners -----------------------------------------------------------------------
async def test_loop_runs_a_function_in_a_looper_thread_until_the_stop() -> None:
    calls: list[int] = []
    sv = Supervisor(new_state())
    async with sv.managed_session() as sess:
        thread = sv.loop(0.001, calls.append, args=(1,))
        assert isinstance(thread, monitored.LooperThread)
        while len(calls) < 3:
            await sess.run(step)
            await anyio.sleep(0.001)
    assert thread is not None
    assert not thread.is_alive()


async def test_loop_runs_an_async_function_as_a_task() -> None:
    seen: list[int] = []
    sv = Supervisor(new_state())

    async def watch(label: str) -> None:
        seen.append(sv.state.global_step)

    with pytest.raises(RuntimeError, match="inside `async with sv.managed_session"):
        sv.loop(0.001, watch, args=("x",))
    async with sv.managed_session() as sess:
        assert sv.loop(0.001, watch, kwargs={"label": "x"}) is None
        while len(seen) < 3:
            await sess.run(step)
            await anyio.sleep(0.002)


async def test_a_failing_loop_target_is_raised_from_managed_session() -> None:
    def fail() -> None:
        raise LookupError("looper failed")

    sv = Supervisor(new_state())
    with pytest.raises(LookupError, match="looper failed"):
        async with sv.managed_session() as sess:
            sv.loop(0.001, fail)
            while not sv.should_stop():
                await sess.run(step)
                await anyio.sleep(0.001)


async def test_queue_runners_of_the_collection_start_with_the_session() -> None:
    queue = FIFOQueue(4)
    items = iter(range(5))

    def produce() -> int:
        return next(items)

    add_queue_runner(QueueRunner(queue, [produce]))
    got: list[int] = []

    async def consume(state: monitored.TrainState) -> None:
        got.append(await queue.dequeue())
        state.global_step += 1

    sv = Supervisor(new_state())
    async with sv.managed_session() as sess:
        while not sv.should_stop():
            await sess.run(consume)
    assert got == [0, 1, 2, 3, 4]


async def test_start_queue_runners_with_a_list() -> None:
    queue = FIFOQueue(2)
    runner = QueueRunner(queue, [lambda: 7])
    sv = Supervisor(new_state())
    async with sv.managed_session(start_standard_services=False) as sess:
        threads = sv.start_queue_runners(sess, [runner])
        assert len(threads) == 1
        assert isinstance(threads[0], threading.Thread)
        assert threads[0] in sv.coord.registered_threads
        assert await queue.dequeue() == 7
    assert not threads[0].is_alive()


# -- arguments and plugins ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"graph": object()}, "graph=.*no graph"),
        ({"init_feed_dict": {"x": 1}}, "init_feed_dict=.*no feeds"),
        ({"local_init_run_options": object()}, "local_init_run_options"),
        ({"global_step": object()}, "state.global_step"),
        ({"init_op": "init_all"}, r"init_op=.*not a function"),
        ({"ready_op": 3}, r"ready_op=.*not a function"),
        ({"summary_op": object()}, r"summary_op=.*not a function"),
        ({"logdir": "x", "saver": object()}, "monitored_checkpoint.Saver"),
        ({"logdir": "x", "summary_writer": object()}, "monitored_summaries.FileWriter"),
    ],
)
def test_graph_only_arguments_are_refused_with_what_to_do(
    kwargs: dict[str, Any], match: str
) -> None:
    with pytest.raises(UnsupportedArgumentError, match=match):
        Supervisor(new_state(), **kwargs)


@pytest.mark.parametrize("kwargs", [{"master": "grpc://x"}, {"config": object()}])
async def test_managed_session_refuses_master_and_config(kwargs: dict[str, Any]) -> None:
    with pytest.raises(UnsupportedArgumentError):
        async with Supervisor(new_state()).managed_session(**kwargs):
            pass


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"save_model_secs": -1}, ValueError, "save_model_secs"),
        ({"save_summaries_secs": "2"}, ValueError, "save_summaries_secs"),
        ({"checkpoint_basename": "a/b"}, ValueError, "plain file name"),
        ({"state": {"w": 1}}, TypeError, "TrainState"),
    ],
)
def test_bad_values_are_refused(kwargs: dict[str, Any], exc: type[Exception], match: str) -> None:
    kwargs.setdefault("state", new_state())
    with pytest.raises(exc, match=match):
        Supervisor(**kwargs)


def test_a_logdir_without_the_checkpoint_plugin_names_the_package(no_plugin: Any) -> None:
    no_plugin("monitored_checkpoint")
    with pytest.raises(
        MissingPluginError, match=r"pip install monitored-checkpoint.*saver=None"
    ) as e:
        Supervisor(new_state(), logdir="runs/x")
    assert e.value.distribution == "monitored-checkpoint"
    Supervisor(new_state(), logdir="runs/x", saver=None)  # explicitly without checkpoints


async def test_default_summaries_are_off_without_their_plugin(
    tmp_path: Path, no_plugin: Any
) -> None:
    no_plugin("monitored_summaries")
    sv = Supervisor(new_state(), logdir=tmp_path)
    await train(sv, 2)
    assert checkpoints(tmp_path) == [0, 2]
    assert not [name for name in os.listdir(tmp_path) if name.startswith("events")]
    with pytest.raises(MissingPluginError, match="monitored-summaries"):
        _ = sv.summary_writer


@pytest.mark.parametrize("kwargs", [{"save_summaries_secs": 5}, {"summary_op": lambda s: {}}])
def test_summaries_asked_for_without_their_plugin_name_the_package(
    tmp_path: Path, no_plugin: Any, kwargs: dict[str, Any]
) -> None:
    no_plugin("monitored_summaries")
    with pytest.raises(MissingPluginError, match="pip install monitored-summaries") as e:
        Supervisor(new_state(), logdir=tmp_path, **kwargs)
    assert e.value.plugin == "summaries"


def test_a_given_summary_writer_is_used(tmp_path: Path) -> None:
    from monitored_summaries import FileWriter

    writer = FileWriter(tmp_path)
    try:
        sv = Supervisor(new_state(), logdir=tmp_path, summary_writer=writer)
        assert sv.summary_writer is writer
        none = Supervisor(new_state(), logdir=tmp_path, summary_writer=None)
        assert none.summary_writer is None
    finally:
        writer.close()


def test_properties_and_tf1_use_default() -> None:
    fn = lambda s: {}  # noqa: E731
    sv = Supervisor(new_state(), init_op=Supervisor.USE_DEFAULT, summary_op=fn)
    assert sv.summary_op is fn
    assert sv.save_model_secs == 600
    assert sv.save_summaries_secs == 120
    assert sv.is_chief
    assert sv.logdir is None
    assert sv.session is None
    assert not sv.should_stop()


@pytest.mark.parametrize(
    ("summary", "match"),
    [
        ({"": 1.0}, "non-empty strings"),
        ({3: 1.0}, "non-empty strings"),
        ({"flag": True}, "'flag' is bool"),
        ({"names": np.array(["a"])}, "'names' is ndarray"),
        ([("x", 1.0)], "returned list"),
    ],
)
def test_summary_computed_refuses_what_is_not_tag_to_number(
    tmp_path: Path, summary: Any, match: str
) -> None:
    sv = Supervisor(new_state(), logdir=tmp_path, saver=None)
    try:
        with pytest.raises(SummaryFunctionError, match=match):
            sv.summary_computed(None, summary)
    finally:
        sv.summary_writer.close()


async def test_a_failing_writer_close_is_raised_after_a_normal_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sv = Supervisor(new_state(), logdir=tmp_path, saver=None)
    writer = sv.summary_writer
    real_close = writer.close

    def close() -> None:
        real_close()
        raise OSError("event file lost")

    monkeypatch.setattr(writer, "close", close)
    with pytest.raises(OSError, match="event file lost"):
        async with sv.managed_session() as sess:
            await sess.run(step)


async def test_a_failing_writer_close_does_not_hide_the_bodys_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    sv = Supervisor(new_state(), logdir=tmp_path, saver=None)
    writer = sv.summary_writer
    real_close = writer.close

    def close() -> None:
        real_close()
        raise OSError("event file lost")

    monkeypatch.setattr(writer, "close", close)
    with pytest.raises(ValueError, match="the real problem"):
        async with sv.managed_session():
            raise ValueError("the real problem")
    assert "the summary writer failed too" in caplog.text


async def test_services_that_fail_to_start_close_the_session(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sv = Supervisor(new_state())

    def fail(sess: Any) -> None:
        raise RuntimeError("cannot start")

    monkeypatch.setattr(sv, "start_standard_services", fail)
    with pytest.raises(RuntimeError, match="cannot start"):
        await sv.prepare_or_wait_for_session()
    assert sv.session is None, "the closed session is not handed out"
    assert sv.should_stop()
    with pytest.raises(RuntimeError, match=r"failed to start \(RuntimeError: cannot start\)"):
        await sv.prepare_or_wait_for_session()


async def test_a_failed_entry_leaves_no_session_and_a_second_call_names_the_failure(
    tmp_path: Path,
) -> None:
    def broken_init(state: monitored.TrainState) -> None:
        raise ValueError("no pre-trained model at runs/pre")

    state = new_state()
    sv = Supervisor(state, logdir=tmp_path, init_fn=broken_init)
    with pytest.raises(ValueError, match="no pre-trained model"):
        await sv.prepare_or_wait_for_session()
    assert sv.session is None
    assert sv.should_stop()
    with pytest.raises(RuntimeError, match="make a new Supervisor") as raised:
        await sv.prepare_or_wait_for_session()
    assert "ValueError: no pre-trained model at runs/pre" in str(raised.value)
    assert isinstance(raised.value.__cause__, ValueError)
    with pytest.raises(RuntimeError, match="failed to start"):
        async with sv.managed_session():
            pass  # pragma: no cover - not entered
    await sv.stop()  # nothing to close: no error
    # A new Supervisor on the same state trains.
    await train(Supervisor(state, logdir=tmp_path), 2)
    assert state.global_step == 2


async def test_stop_joins_the_threads_given() -> None:
    sv = Supervisor(new_state())
    await sv.prepare_or_wait_for_session()
    done = threading.Event()
    thread = threading.Thread(target=done.set)
    thread.start()
    await sv.stop(threads=[thread])
    assert done.is_set()
    assert not thread.is_alive()


# -- roles decided by a cluster plugin (MPI) ----------------------------------------------------
_CLUSTER_PLUGIN = """
class Cluster:
    def __init__(self, is_chief):
        self.is_chief = is_chief

    def agree_to_stop(self, local):
        return local

    async def share_state(self, session, max_wait_secs):
        session.state.initialized = True  # as if the chief's state arrived

    def fail(self, failure):
        pass

def cluster(session):
    return Cluster({is_chief})
"""


async def test_a_worker_made_by_a_cluster_plugin_saves_and_writes_nothing(
    tmp_path: Path, fake_plugin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    show_installed(monkeypatch, "checkpoint", "summaries")
    await train(Supervisor(new_state(), logdir=tmp_path), 3)
    before = listing(tmp_path)
    fake_plugin("fake-cluster", _CLUSTER_PLUGIN.format(is_chief=False))
    summarized: list[int] = []
    sv = Supervisor(
        new_state(),
        logdir=tmp_path,
        save_model_secs=0.01,
        save_summaries_secs=0.01,
        summary_op=lambda state: summarized.append(state.global_step) or {"w": 1.0},
    )
    assert sv.is_chief, "the constructor's role until the session is entered"
    async with sv.managed_session() as sess:
        assert not sess.is_chief
        assert not sv.is_chief, "the Supervisor agrees with the session"
        assert sess.restored_from is None, "a worker does not restore: the chief shares"
        names = [info.name for info in sess.plugins]
        assert not any("Checkpoint" in name or "Summary" in name for name in names), names
        while not sv.should_stop() and sess.state.global_step < 5:
            await sess.run(step)
            await anyio.sleep(0.02)
        assert sv.summary_writer is None
        with pytest.raises(RuntimeError, match="requires a summary writer"):
            sv.summary_computed(sess, {"x": 1.0})
        with pytest.raises(RuntimeError, match="Only chief supervisor"):
            sv.start_standard_services(sess)
    assert not sv.is_chief
    assert summarized == []
    assert listing(tmp_path) == before, "nothing written by a worker"


async def test_a_chief_made_by_a_cluster_plugin_runs_the_services(
    tmp_path: Path, fake_plugin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_plugin("fake-cluster", _CLUSTER_PLUGIN.format(is_chief=True))
    show_installed(monkeypatch, "checkpoint", "summaries")
    sv = Supervisor(new_state(), logdir=tmp_path, save_summaries_secs=0.01, summary_op=None)
    async with sv.managed_session() as sess:
        assert sess.is_chief
        assert sv.is_chief
        while not sv.should_stop() and sess.state.global_step < 3:
            await sess.run(step)
        assert sv.summary_writer is not None
        sv.summary_computed(sess, {"mine": 2.0})
    assert checkpoints(tmp_path) == [0, 3]
    assert tags(tmp_path)["mine"] == [3]
    assert len([name for name in listing(tmp_path) if name.startswith("events.out")]) == 1


def test_a_plain_with_says_to_write_async_with() -> None:
    sv = Supervisor(logdir=None)
    plain_with = pytest.raises(
        TypeError, match=r"write `async with sv.managed_session\(\).*Jupyter: `await main\(\)`"
    )
    with plain_with, sv.managed_session():
        pytest.fail("a plain with must not enter")


async def test_a_run_directory_named_with_control_characters_is_logged_escaped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 34 §2: waiting for, restoring and saving checkpoints of a logdir whose name
    holds every control character, OSC 52 and a newline: no log line carries one raw.
    (Valid UTF-8: the summaries plugin cannot yet record a checkpoint path with bytes
    that are not, in its SessionLog.)"""
    import logging

    from _hostile import HOSTILE, assert_safe_line

    logdir = tmp_path / HOSTILE.replace("\0", "")
    with caplog.at_level(logging.DEBUG, logger="monitored"):
        sv = Supervisor(new_state(), logdir=logdir, recovery_wait_secs=0.01)
        first = await sv.prepare_or_wait_for_session(wait_for_checkpoint=True, max_wait_secs=0.05)
        assert first.restored_from is None
        await sv.stop()
        await train(Supervisor(new_state(), logdir=logdir), 3)
        restarted = Supervisor(new_state(), logdir=logdir)
        async with restarted.managed_session() as sess:
            assert sess.restored_from == str(logdir / "model.ckpt-3")
    named = [r.getMessage() for r in caplog.records if "pwned" in r.getMessage()]
    assert any("Waiting for a checkpoint" in message for message in named)
    assert any("Restored" in message for message in named)
    for message in named:
        assert_safe_line(message)
