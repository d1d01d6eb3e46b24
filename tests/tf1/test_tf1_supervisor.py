"""TensorFlow's ``supervisor_test.py`` and ``basic_loops_test.py``, ported to
:class:`monitored.Supervisor` with the checkpoint and summaries plugins (skipped
without them).

TF's graph becomes a :class:`~monitored.TrainState`; ops become functions of the
state (``init_op``, ``local_init_op``, ``ready_op`` returning what is missing, as
``report_uninitialized_variables``); ``sess.run(my_op)`` is ``await sess.run(step)``;
a merged summary op's result is ``{tag: value}`` given to ``summary_computed``.
TF's two-process tests share a variable through a local server: here the worker's
state holds the chief's array itself (the same NumPy array), its local entries
its own. Graph and meta-graph events do not exist here (no graph): the event
sequences are TF's without them. TF's sleeps, waiting for a timer thread to
write, are not needed: the services write when they start.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from _tf1 import do_step

import monitored
from monitored import Supervisor, TrainState, UnsupportedArgumentError

ckpt = pytest.importorskip("monitored_checkpoint")
summaries = pytest.importorskip("monitored_summaries")

from tensorboardX.proto.event_pb2 import SessionLog  # noqa: E402

SUMMARY = {"c1": 1.0, "c2": 2.0, "c3": 3.0}


async def wait_for_checkpoint(prefix: str, timeout_secs: float = 60.0) -> None:
    """TF's ``_wait_for_glob``: the service writes in the background."""
    for _ in range(int(timeout_secs / 0.05)):
        if ckpt.checkpoint_exists(prefix):
            return
        await anyio.sleep(0.05)
    raise AssertionError(f"no checkpoint {prefix} after {timeout_secs}s")


def events(path: Path) -> list[Any]:
    return list(summaries.summary_iterator(path))


def event_files(logdir: Path) -> list[Path]:
    return sorted(logdir.glob("events.out.tfevents.*"))


def last_events(logdir: Path) -> list[Any]:
    return events(event_files(logdir)[-1])


def values(event: Any) -> dict[str, float]:
    return {value.tag: value.simple_value for value in event.summary.value}


def assert_summary_event(event: Any, expected: dict[str, float] = SUMMARY) -> None:
    assert values(event) == pytest.approx(expected)


def uninitialized(names: Sequence[str]) -> Callable[[TrainState], str | None]:
    """TF's ``report_uninitialized_variables``."""

    def report(state: TrainState) -> str | None:
        missing = [name for name in names if name not in state]
        return f"Variables not initialized: {', '.join(missing)}" if missing else None

    return report


def no_variables(state: TrainState) -> None:
    """TF's ``ready_op`` over a graph without global variables: always ready."""
    return


def served(state: TrainState) -> TrainState:
    """A worker's view of the server's state, which a chief has initialized already
    (TF's server has no variables to wait for in these tests)."""
    state.initialized = True
    return state


def setter(**values: Any) -> Callable[[TrainState], None]:
    def init(state: TrainState) -> None:
        for name, value in values.items():
            state[name] = np.asarray(value(state) if callable(value) else value)

    return init


def read(name: str) -> Callable[[TrainState], dict[str, Any]]:
    def step(state: TrainState) -> dict[str, Any]:
        return {name: state[name]}

    return step


def add_one(state: TrainState) -> dict[str, Any]:
    state["v"] += 1
    return {"v": state["v"]}


async def run_value(sess: Any, fn: Callable[[TrainState], dict[str, Any]]) -> Any:
    outputs = await sess.run(fn)
    [value] = outputs.values()
    return value


# -- SupervisorTest -----------------------------------------------------------------------------
async def test_SupervisorTest_testBasics(tmp_path: Path) -> None:
    sv = Supervisor(TrainState(), logdir=tmp_path / "basics")
    sess = await sv.prepare_or_wait_for_session("")
    for _ in range(10):
        await sess.run(do_step)
    await sess.close()
    await sv.stop()


async def test_SupervisorTest_testManagedSession(tmp_path: Path) -> None:
    sv = Supervisor(TrainState(), logdir=tmp_path / "managed_session")
    async with sv.managed_session("") as sess:
        for _ in range(10):
            await sess.run(do_step)
    # The Supervisor has been stopped.
    assert sv.should_stop()


async def test_SupervisorTest_testManagedSessionUserError(tmp_path: Path) -> None:
    sv = Supervisor(TrainState(), logdir=tmp_path / "managed_user_error")
    last_step = None
    with pytest.raises(RuntimeError, match="failing here"):
        async with sv.managed_session("") as sess:
            for step in range(10):
                last_step = step
                if step == 1:
                    raise RuntimeError("failing here")
                await sess.run(do_step)
    assert sv.should_stop()
    assert last_step == 1


async def test_SupervisorTest_testManagedSessionIgnoreOutOfRangeError(tmp_path: Path) -> None:
    sv = Supervisor(TrainState(), logdir=tmp_path / "managed_out_of_range")
    last_step = None
    async with sv.managed_session("") as sess:
        for step in range(10):
            last_step = step
            if step == 3:
                raise monitored.OutOfRangeError("all done")
            await sess.run(do_step)
    # Stopped; the OutOfRangeError was not raised.
    assert sv.should_stop()
    assert last_step == 3


async def test_SupervisorTest_testManagedSessionDoNotKeepSummaryWriter(tmp_path: Path) -> None:
    logdir = tmp_path / "managed_not_keep_summary_writer"
    sv = Supervisor(TrainState(), logdir=logdir, summary_op=None)
    for _ in range(2):
        async with sv.managed_session(
            "", close_summary_writer=True, start_standard_services=False
        ) as sess:
            sv.summary_computed(sess, SUMMARY)
    paths = event_files(logdir)
    assert len(paths) == 2
    # The two event files have the same contents: the summary once, then STOP.
    for path in paths:
        found = events(path)
        assert found[0].file_version == "brain.Event:2"
        assert_summary_event(found[1])
        assert found[2].session_log.status == SessionLog.STOP
        assert len(found) == 3


async def test_SupervisorTest_testManagedSessionKeepSummaryWriter(tmp_path: Path) -> None:
    logdir = tmp_path / "managed_keep_summary_writer"
    sv = Supervisor(TrainState(), logdir=logdir)
    for _ in range(2):
        async with sv.managed_session(
            "", close_summary_writer=False, start_standard_services=False
        ) as sess:
            sv.summary_computed(sess, SUMMARY)
    # Close the writer to flush the events.
    sv.summary_writer.close()
    # The same writer across the two sessions: the summary twice, no STOP.
    found = last_events(logdir)
    assert found[0].file_version == "brain.Event:2"
    assert_summary_event(found[1])
    assert_summary_event(found[2])
    assert len(found) == 3


def write_csv(logdir: Path) -> Path:
    """TF's ``_csv_data``: a small data file with 3 CSV records."""
    logdir.mkdir(parents=True)
    data_path = logdir / "data.csv"
    data_path.write_text("1,2,3\n4,5,6\n7,8,9\n")
    return data_path


def csv_runner(logdir: Path, num_epochs: int) -> monitored.data.FIFOQueue:
    """TF's ``string_input_producer([data.csv], num_epochs=3)`` + ``TextLineReader`` +
    ``decode_csv``: a queue runner putting the file's records, 3 times."""
    data_path = write_csv(logdir)
    records = iter(
        [[int(x) for x in line.split(",")] for line in data_path.read_text().splitlines()]
        * num_epochs
    )

    def read_record() -> np.ndarray[Any, Any]:
        return np.asarray(next(records))  # StopIteration: the end of input

    queue = monitored.data.FIFOQueue(32)
    monitored.data.add_queue_runner(monitored.data.QueueRunner(queue, [read_record]))
    return queue


def dequeue_step(queue: monitored.data.FIFOQueue, n: int = 1) -> Any:
    async def step(state: TrainState) -> dict[str, Any]:
        rec = np.stack(await queue.dequeue_many(n))
        state.global_step += 1
        return {"rec": rec}

    return step


async def test_SupervisorTest_testManagedEndOfInputOneQueue(tmp_path: Path) -> None:
    logdir = tmp_path / "managed_end_of_input_one_queue"
    queue = csv_runner(logdir, num_epochs=3)
    sv = Supervisor(TrainState(), logdir=logdir)
    async with sv.managed_session("") as sess:
        while not sv.should_stop():
            await sess.run(dequeue_step(queue))
    assert sv.state.global_step == 9


def shuffled_records(logdir: Path) -> monitored.data.Pipeline:
    """TF's second queue, ``shuffle_batch(rec, 1, 6, 4)`` over the file read 3 times."""
    lines = write_csv(logdir).read_text().splitlines()
    records = np.asarray([[int(x) for x in line.split(",")] for line in lines])
    return monitored.data.shuffle_batch(
        records, 1, capacity=6, min_after_dequeue=4, enqueue_many=True, num_epochs=3, seed=0
    )


def batch_step(batches: Any) -> Any:
    async def step(state: TrainState) -> dict[str, Any]:
        try:
            rec = await anext(batches)
        except StopAsyncIteration:
            raise monitored.OutOfRangeError("shuffle_batch: end of input") from None
        state.global_step += 1
        return {"rec": rec}

    return step


async def test_SupervisorTest_testManagedEndOfInputTwoQueues(tmp_path: Path) -> None:
    logdir = tmp_path / "managed_end_of_input_two_queues"
    pipeline = shuffled_records(logdir)
    sv = Supervisor(TrainState(), logdir=logdir)
    async with pipeline:
        step = batch_step(aiter(pipeline))
        async with sv.managed_session("") as sess:
            while not sv.should_stop():
                await sess.run(step)
    assert sv.state.global_step == 9


async def test_SupervisorTest_testManagedMainErrorTwoQueues(tmp_path: Path) -> None:
    logdir = tmp_path / "managed_main_error_two_queues"
    pipeline = shuffled_records(logdir)
    sv = Supervisor(TrainState(), logdir=logdir)
    with pytest.raises(RuntimeError, match="fail at step 3"):
        async with pipeline:
            step_fn = batch_step(aiter(pipeline))
            async with sv.managed_session("") as sess:
                for step in range(9):
                    if sv.should_stop():
                        break
                    if step == 3:
                        raise RuntimeError("fail at step 3")
                    await sess.run(step_fn)


async def test_SupervisorTest_testSessionConfig(tmp_path: Path) -> None:
    """Deliberate difference: ``config=`` (a ``ConfigProto``) is refused, naming what to do."""
    sv = Supervisor(TrainState(), logdir=tmp_path / "session_config")
    with pytest.raises(UnsupportedArgumentError, match="config"):
        await sv.prepare_or_wait_for_session("", config=object())  # type: ignore[arg-type]
    sess = await sv.prepare_or_wait_for_session("")
    for _ in range(10):
        await sess.run(do_step)
    await sess.close()
    await sv.stop()


async def test_SupervisorTest_testChiefCanWriteEvents(tmp_path: Path) -> None:
    logdir = tmp_path / "can_write"
    # TF's graph has no global step, so no global_step/sec service: global_step=None.
    sv = Supervisor(TrainState(), is_chief=True, logdir=logdir, summary_op=None, global_step=None)
    sess = await sv.prepare_or_wait_for_session("")
    sv.summary_computed(sess, SUMMARY)
    await sess.close()
    await sv.stop()
    found = last_events(logdir)
    assert found[0].file_version == "brain.Event:2"
    assert_summary_event(found[1])
    # A stop message, as the Supervisor closed cleanly.
    assert found[2].session_log.status == SessionLog.STOP
    assert len(found) == 3


async def test_SupervisorTest_testNonChiefCannotWriteEvents() -> None:
    sv = Supervisor(served(TrainState()), is_chief=False, ready_op=no_variables)
    sess = await sv.prepare_or_wait_for_session("")
    with pytest.raises(RuntimeError):
        sv.summary_computed(sess, {"c1": 1.0, "c2": 2.0})
    await sv.stop()
    sv = Supervisor(served(TrainState()), is_chief=False, ready_op=no_variables)
    sess = await sv.prepare_or_wait_for_session("")
    with pytest.raises(RuntimeError):
        sv.start_standard_services(sess)
    await sv.stop()


async def test_SupervisorTest_testNoLogdirButWantSummary() -> None:
    sv = Supervisor(TrainState(), logdir="", summary_op=None)
    sess = await sv.prepare_or_wait_for_session("")
    with pytest.raises(RuntimeError, match="requires a summary writer"):
        sv.summary_computed(sess, SUMMARY)
    await sv.stop()


async def test_SupervisorTest_testLogdirButExplicitlyNoSummaryWriter(tmp_path: Path) -> None:
    logdir = tmp_path / "explicit_no_summary_writer"
    state = TrainState({"foo": np.asarray([1.0])})
    sv = Supervisor(state, logdir=logdir, summary_writer=None)
    sess = await sv.prepare_or_wait_for_session("")
    # A checkpoint is still written.
    await wait_for_checkpoint(f"{sv.save_path}-0")
    with pytest.raises(RuntimeError, match="requires a summary writer"):
        sv.summary_computed(sess, SUMMARY)
    await sv.stop()


async def test_SupervisorTest_testNoLogdirButExplicitSummaryWriter(tmp_path: Path) -> None:
    logdir = tmp_path / "explicit_summary_writer"
    sw = summaries.FileWriter(str(logdir))
    sv = Supervisor(TrainState(), logdir="", summary_op=None, summary_writer=sw)
    sess = await sv.prepare_or_wait_for_session("")
    sv.summary_computed(sess, SUMMARY)
    await sess.close()
    await sv.stop()
    # The summary was written to logdir.
    found = last_events(logdir)
    assert found[0].file_version == "brain.Event:2"
    assert_summary_event(found[1])
    assert found[2].session_log.status == SessionLog.STOP
    assert len(found) == 3


async def test_SupervisorTest_testNoLogdirSucceeds(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    sv = Supervisor(TrainState({"v": np.asarray([1.0, 2.0, 3.0])}), logdir="", summary_op=None)
    sess = await sv.prepare_or_wait_for_session("")
    await sess.close()
    await sv.stop()
    assert os.listdir(tmp_path) == []  # no logdir: nothing written


async def test_SupervisorTest_testUseSessionManager() -> None:
    sm = monitored.SessionManager()
    # The session manager given, its Scaffold is used.
    sv = Supervisor(TrainState({"v": np.asarray([1.0, 2.0, 3.0])}), logdir="", session_manager=sm)
    await sv.prepare_or_wait_for_session("")
    await sv.stop()


async def test_SupervisorTest_testInitOp(tmp_path: Path) -> None:
    state = TrainState()
    sv = Supervisor(state, logdir=tmp_path / "default_init_op", init_op=setter(v=[1.0, 2.0, 3.0]))
    sess = await sv.prepare_or_wait_for_session("")
    np.testing.assert_allclose([1.0, 2.0, 3.0], await run_value(sess, read("v")))
    await sv.stop()


async def test_SupervisorTest_testInitFn(tmp_path: Path) -> None:
    sv = Supervisor(
        TrainState(),
        logdir=tmp_path / "default_init_op",
        init_op=None,
        init_fn=setter(v=[1.0, 2.0, 3.0]),
    )
    sess = await sv.prepare_or_wait_for_session("")
    np.testing.assert_allclose([1.0, 2.0, 3.0], await run_value(sess, read("v")))
    await sv.stop()


async def test_SupervisorTest_testInitOpWithFeedDict(tmp_path: Path) -> None:
    """Deliberate difference: no feeds; ``init_feed_dict=`` is refused, the value goes in
    ``init_fn``."""
    with pytest.raises(UnsupportedArgumentError, match="init_feed_dict"):
        Supervisor(TrainState(), init_feed_dict={"p": [1.0, 2.0, 3.0]})  # type: ignore[arg-type]
    p = [1.0, 2.0, 3.0]
    sv = Supervisor(TrainState(), logdir=tmp_path / "feed_dict_init_op", init_op=setter(v=p))
    sess = await sv.prepare_or_wait_for_session("")
    np.testing.assert_allclose([1.0, 2.0, 3.0], await run_value(sess, read("v")))
    await sv.stop()


async def _two_sessions(logdir: Path, chief_state: TrainState, init_op: Any) -> Any:
    """TF's ``get_session(True)`` then ``get_session(False)``: the worker shares ``v``."""
    local = {
        "local_init_op": setter(w=lambda s: s["v"].copy()),
        "ready_for_local_init_op": uninitialized(["v"]),
        "ready_op": uninitialized(["v", "w"]),
        "recovery_wait_secs": 0.05,
    }
    sv0 = Supervisor(chief_state, logdir=logdir, is_chief=True, init_op=init_op, **local)
    sess0 = await sv0.prepare_or_wait_for_session("")
    worker_state = served(TrainState({"v": chief_state["v"]}))  # the server's variable
    sv1 = Supervisor(worker_state, logdir=logdir, is_chief=False, **local)
    sess1 = await sv1.prepare_or_wait_for_session("")
    return sv0, sess0, sv1, sess1


async def test_SupervisorTest_testReadyForLocalInitOp(tmp_path: Path) -> None:
    logdir = tmp_path / "default_ready_for_local_init_op"
    sv0, sess0, sv1, sess1 = await _two_sessions(logdir, TrainState(), setter(v=1))
    assert await run_value(sess0, read("w")) == 1
    assert await run_value(sess1, add_one) == 2
    assert await run_value(sess1, read("w")) == 1
    assert await run_value(sess0, read("v")) == 2
    await sv0.stop()
    await sv1.stop()


async def test_SupervisorTest_testReadyForLocalInitOpRestoreFromCheckpoint(
    tmp_path: Path,
) -> None:
    logdir = tmp_path / "ready_for_local_init_op_restore"
    # A checkpoint, and an event file.
    sv = Supervisor(TrainState({"v": np.asarray(10.0)}), logdir=logdir)
    await sv.prepare_or_wait_for_session("")
    await wait_for_checkpoint(f"{sv.save_path}-0")
    await sv.stop()
    assert event_files(logdir)

    sv0, sess0, sv1, sess1 = await _two_sessions(
        logdir, TrainState({"v": np.asarray(1.0)}), USE_DEFAULT_INIT
    )
    assert await run_value(sess0, read("w")) == 10
    assert await run_value(sess1, add_one) == 11
    assert await run_value(sess1, read("w")) == 10
    assert await run_value(sess0, read("v")) == 11
    await sv0.stop()
    await sv1.stop()


USE_DEFAULT_INIT = Supervisor.USE_DEFAULT


async def test_SupervisorTest_testLocalInitOp(tmp_path: Path) -> None:
    # Normal initialization off: the local entries come from local_init_op.
    sv = Supervisor(
        TrainState(),
        logdir=tmp_path / "default_local_init_op",
        init_op=None,
        local_init_op=setter(v=[1.0, 2.0, 3.0], w=[4, 5, 6]),
    )
    sess = await sv.prepare_or_wait_for_session("")
    np.testing.assert_allclose([1.0, 2.0, 3.0], await run_value(sess, read("v")))
    np.testing.assert_allclose([4, 5, 6], await run_value(sess, read("w")))
    await sv.stop()


async def test_SupervisorTest_testLocalInitOpForNonChief(tmp_path: Path) -> None:
    sv = Supervisor(
        served(TrainState()),
        logdir=tmp_path / "default_local_init_op_non_chief",
        init_op=None,
        is_chief=False,
        ready_op=no_variables,
        local_init_op=setter(v=[1.0, 2.0, 3.0]),
    )
    sess = await sv.prepare_or_wait_for_session("")
    np.testing.assert_allclose([1.0, 2.0, 3.0], await run_value(sess, read("v")))
    await sv.stop()


async def test_SupervisorTest_testInitOpFails(tmp_path: Path) -> None:
    sv = Supervisor(
        TrainState(),
        logdir=tmp_path / "default_init_op_fails",
        init_op=setter(v=[1.0, 2.0, 3.0]),  # w is not initialized
        ready_op=uninitialized(["v", "w"]),
    )
    with pytest.raises(RuntimeError, match="Variables not initialized: w"):
        await sv.prepare_or_wait_for_session("")


async def test_SupervisorTest_testInitOpFailsForTransientVariable(tmp_path: Path) -> None:
    sv = Supervisor(
        TrainState(),
        logdir=tmp_path / "default_init_op_fails_for_local_variable",
        local_init_op=setter(v=[1.0, 2.0, 3.0]),  # w is not initialized
        ready_op=uninitialized(["v", "w"]),
    )
    with pytest.raises(RuntimeError, match="Variables not initialized: w"):
        await sv.prepare_or_wait_for_session("")


async def test_SupervisorTest_testDefaultGlobalStep(tmp_path: Path) -> None:
    state = TrainState()
    state.global_step = 287
    sv = Supervisor(state, logdir=tmp_path / "default_global_step")
    await sv.prepare_or_wait_for_session("")
    assert sv.global_step == 287
    await sv.stop()


async def test_SupervisorTest_testRestoreFromMetaGraph(tmp_path: Path) -> None:
    """No meta graph: the second Supervisor is given a new saver over the same logdir."""
    logdir = tmp_path / "restore_from_meta_graph"
    sv = Supervisor(TrainState({"v0": np.asarray(1)}), logdir=logdir)
    sess = await sv.prepare_or_wait_for_session("")
    filename = sv.saver.save(sess, sv.save_path)
    await sv.stop()
    assert ckpt.checkpoint_exists(filename)
    sv2 = Supervisor(TrainState({"v0": np.asarray(0)}), logdir=logdir, saver=ckpt.Saver())
    sess = await sv2.prepare_or_wait_for_session("")
    assert await run_value(sess, read("v0")) == 1
    sv2.saver.save(sess, sv2.save_path)
    await sv2.stop()


async def test_SupervisorTest_testStandardServicesWithoutGlobalStep(tmp_path: Path) -> None:
    """Deliberate difference: a state always has a global step; ``global_step=None``
    switches off its service, as TF1's Supervisor without one. The summary
    service's hook marks its start (``SessionLog.START``, at the step the first run
    will write) and the checkpoint (``CHECKPOINT``), which TF writes only with a
    global step."""
    logdir = tmp_path / "standard_services_without_global_step"
    state = TrainState({"foo": np.asarray([1.0])})
    sv = Supervisor(state, logdir=logdir, global_step=None, summary_op=lambda s: {"v": s["foo"][0]})
    await sv.prepare_or_wait_for_session("")
    save_path = f"{sv.save_path}-0"
    await wait_for_checkpoint(save_path)
    await sv.stop()
    found = last_events(logdir)
    assert found[0].file_version == "brain.Event:2"
    statuses = [e.session_log.status for e in found if e.HasField("session_log")]
    assert statuses[0] == SessionLog.START
    assert statuses[-1] == SessionLog.STOP
    assert [values(e) for e in found if e.HasField("summary")] == [{"v": 1.0}]
    assert not any("global_step/sec" in values(e) for e in found)
    # The checkpoint holds foo.
    restored = TrainState({"foo": np.asarray([10.10])})
    ckpt.Saver().restore(restored, save_path)
    assert restored["foo"][0] == 1.0


async def test_SupervisorTest_testStandardServicesWithGlobalStep(tmp_path: Path) -> None:
    """The same with a global step: ``global_step/sec`` is written at the start (0.0, at
    step 123) and the checkpoint is ``model.ckpt-123``. Difference: the summary hook's
    START is at 124, the step the first run writes (TensorBoard's purge), TF's at 123."""
    logdir = tmp_path / "standard_services_with_global_step"
    state = TrainState()
    state.global_step = 123
    sv = Supervisor(state, logdir=logdir)
    await sv.prepare_or_wait_for_session("")
    save_path = f"{sv.save_path}-123"
    await wait_for_checkpoint(save_path)
    await sv.stop()
    found = last_events(logdir)
    assert found[0].file_version == "brain.Event:2"
    logs = [(e.step, e.session_log.status) for e in found if e.HasField("session_log")]
    assert logs[0] == (124, SessionLog.START)
    assert (123, SessionLog.CHECKPOINT) in logs
    assert logs[-1][1] == SessionLog.STOP
    rates = [(e.step, values(e)) for e in found if e.HasField("summary")]
    assert (123, {"global_step/sec": 0.0}) in rates
    restored = TrainState()
    ckpt.Saver().restore(restored, save_path)
    assert restored.global_step == 123


async def test_SupervisorTest_testNoQueueRunners(tmp_path: Path) -> None:
    sv = Supervisor(TrainState(), logdir=tmp_path / "no_queue_runners")
    sess = await sv.prepare_or_wait_for_session("", start_standard_services=False)
    assert len(sv.start_queue_runners(sess)) == 0
    await sv.stop()


@pytest.mark.parametrize("is_chief", [True, False], ids=["Chief", "NonChief"])
async def test_SupervisorTest_testPrepareSessionAfterStopFor(
    tmp_path: Path, is_chief: bool
) -> None:
    """``testPrepareSessionAfterStopForChief`` and ``...ForNonChief``."""
    logdir = tmp_path / f"prepare_after_stop_{is_chief}"
    state = TrainState({"v": np.asarray(1.0)})
    if not is_chief:
        served(state)
    sv = Supervisor(state, logdir=logdir, is_chief=is_chief, ready_op=no_variables)
    # A first session, then stop.
    sess = await sv.prepare_or_wait_for_session("")
    await sv.stop()
    await sess.close()
    assert sv.should_stop()
    # A second session does not stay stopped, until asked to stop again.
    sess2 = await sv.prepare_or_wait_for_session("")
    assert not sv.should_stop()
    await sv.stop()
    await sess2.close()
    assert sv.should_stop()


# -- basic_loops_test.py --------------------------------------------------------------------------
async def test_BasicTrainLoopTest_testBasicTrainLoop(tmp_path: Path) -> None:
    num_calls = [0]

    async def train_fn(sess: Any, sv: Supervisor, y: str, a: str) -> None:
        num_calls[0] += 1
        assert y == "y"
        assert a == "A"
        await sess.run(do_step)
        if num_calls[0] == 3:
            sv.request_stop()

    sv = Supervisor(TrainState(), logdir=tmp_path / "basic_train_loop")
    await monitored.basic_train_loop(sv, train_fn, args=(sv, "y"), kwargs={"a": "A"})
    assert num_calls[0] == 3


async def test_BasicTrainLoopTest_testBasicTrainLoopExceptionAborts(tmp_path: Path) -> None:
    counter = [0]

    def train_fn(sess: Any) -> None:
        counter[0] += 1
        if counter[0] == 3:
            raise RuntimeError("Failed")

    sv = Supervisor(TrainState(), logdir=tmp_path / "basic_train_loop_exception_aborts")
    with pytest.raises(RuntimeError, match="Failed"):
        await monitored.basic_train_loop(sv, train_fn)


async def test_BasicTrainLoopTest_testBasicTrainLoopRetryOnAborted(tmp_path: Path) -> None:
    class AbortAndRetry:
        def __init__(self) -> None:
            self.num_calls = 0
            self.retries_left = 2

        def train_fn(self, sess: Any) -> None:
            self.num_calls += 1
            if self.num_calls % 3 == 2:
                self.retries_left -= 1
            if self.retries_left > 0:
                raise monitored.AbortedError("Aborted here")
            raise RuntimeError("Failed Again")

    sv = Supervisor(TrainState(), logdir=tmp_path / "basic_train_loop_exception_aborts")
    aar = AbortAndRetry()
    with pytest.raises(RuntimeError, match="Failed Again"):
        await monitored.basic_train_loop(sv, aar.train_fn)
    assert aar.retries_left == 0


def test_tf1_port_names_are_unique() -> None:
    names = [n for n in globals() if n.startswith("test_SupervisorTest_")]
    assert len(names) == len(set(names)) == len({n.lower() for n in names})
    assert os.path.basename(__file__) == "test_tf1_supervisor.py"
