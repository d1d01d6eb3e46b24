"""evaluate_once, evaluate_repeatedly and evaluation inside training."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from _helpers import StandInCluster, hide_plugins, install_cluster

import monitored
from monitored import data
from monitored import metrics as m
from monitored._core._watchdog import BLOCKED_LOOP_ENV
from monitored.evaluation import (
    EvaluationFailedError,
    EvaluationHook,
    EvaluationSession,
    NoCheckpointError,
    NoMetricUpdatesError,
    evaluate_once,
    evaluate_repeatedly,
)
from monitored.evaluation._evaluate import _Checkpoints, default_summary_dir
from monitored_checkpoint import Saver

DATA = [(np.array([1.0, 2.0]), np.array([2.0, 4.0])), (np.array([3.0]), np.array([6.0]))]


def eval_step(state: monitored.TrainState, batch: Any, metrics: Any) -> dict[str, Any]:
    x, y = batch
    pred = state["w"][0] * x
    metrics["mse"].update(y, pred)
    metrics["mean_pred"].update(pred)
    return {"pred": pred}


def _metrics() -> dict[str, m.Metric]:
    return {"mse": m.MeanSquaredError(), "mean_pred": m.Mean()}


def _save(directory: Path, w: float, step: int) -> str:
    state = monitored.TrainState({"w": np.array([w])}, global_step=step)
    return Saver().save(state, str(directory / "model.ckpt"))


async def test_evaluates_a_given_state_until_the_input_ends(caplog: Any) -> None:
    state = monitored.TrainState({"w": np.array([2.0])}, global_step=7)
    with caplog.at_level(logging.WARNING, logger="monitored"):
        result = await evaluate_once(eval_step, _metrics(), input=DATA * 6, state=state)
    assert result.metrics == {"mse": 0.0, "mean_pred": 4.0}
    assert result.global_step == 7
    assert result.steps == 12
    assert result.as_dict()["global_step"] == 7
    assert "global step has not been increased" not in caplog.text


class _OtherHalf(StandInCluster):
    """A cluster of two whose other process evaluates a shard of 3 batches (one more
    than ``DATA``) with the mean at 10."""

    other_batches = 3

    def __init__(self) -> None:
        super().__init__()
        self.merged: list[list[str]] = []
        self.asked_for_input = 0

    def merge_metrics(self, metrics: Any) -> None:
        self.merged.append([metric.name for metric in metrics])
        if [metric.name for metric in metrics] == ["processes with input"]:
            # Before each eval step: does the other process still have a batch?
            self.asked_for_input += 1
            if self.asked_for_input <= self.other_batches:
                metrics[0].update(np.ones(1))
            return
        for metric in metrics:
            if isinstance(metric, m.Mean):
                other = m.Mean()
                other.update(np.full(3, 10.0))
                metric.merge(other)


@pytest.mark.parametrize("sharded", [False, True])
async def test_a_sharded_evaluation_merges_the_metrics_through_the_cluster(
    monkeypatch: pytest.MonkeyPatch, sharded: bool
) -> None:
    cluster = _OtherHalf()
    install_cluster(monkeypatch, cluster)
    votes = cluster.votes

    class FetchesEachStep:
        """An eval hook fetching a value only real eval steps make."""

        def __init__(self) -> None:
            self.seen: list[float] = []

        def before_run(self, run_context: Any) -> monitored.SessionRunArgs:
            return monitored.SessionRunArgs("mse_now")

        def after_run(self, run_context: Any, run_values: Any) -> None:
            self.seen.append(float(run_values.results))

    def step_with_output(state: monitored.TrainState, batch: Any, metrics: Any) -> Any:
        eval_step(state, batch, metrics)
        return {"mse_now": metrics["mse"].result()}

    fetching = FetchesEachStep()
    state = monitored.TrainState({"w": np.array([2.0])})
    result = await evaluate_once(
        step_with_output, _metrics(), input=DATA, state=state, sharded=sharded, hooks=[fetching]
    )
    assert fetching.seen == [0.0, 0.0], "hooks run on this process's own steps only"
    if sharded:
        # This shard's 2 batches; while the other process evaluates its third, this
        # one only votes in that step's agreement (no step, no hooks); a fourth
        # question finds no input anywhere; then the merge.
        assert cluster.merged == [["processes with input"]] * 4 + [["mean_squared_error", "mean"]]
        # Created, 2 steps, the one sat out, the close.
        assert votes == [False, False, False, False, True]
        assert result.steps == 2
        assert result.metrics["mean_pred"] == pytest.approx((2 + 4 + 6 + 3 * 10) / 6)
    else:
        assert cluster.merged == []
        assert result.steps == 2
        assert result.metrics["mean_pred"] == 4.0


async def test_a_sharded_evaluation_alone_changes_nothing() -> None:
    state = monitored.TrainState({"w": np.array([2.0])})
    result = await evaluate_once(eval_step, _metrics(), input=DATA, state=state, sharded=True)
    assert result.metrics == {"mse": 0.0, "mean_pred": 4.0}


class _Worker(StandInCluster):
    """This process is not the chief; the chief's state and plugin states are ``shared``."""

    is_chief = False

    def __init__(self, shared: dict[str, Any] | None) -> None:
        super().__init__()
        self.shared = shared

    async def share_state(self, session: Any, max_wait_secs: float) -> None:
        session.state.add("w", np.array([3.0]))
        session.state.global_step = 2
        session.state.initialized = True
        if self.shared is not None:  # else a cluster that shares no plugin states
            await session.load_plugin_states(self.shared)


async def test_a_worker_evaluates_the_checkpoint_the_chief_picked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This worker sees only step 1; the chief picked step 2, which it evaluates.
    _save(tmp_path, 2.0, 1)
    picked = str(tmp_path / "model.ckpt-2")
    shared = {"evaluation-pick": {"version": 1, "state": {"path": picked, "nothing": ""}}}
    install_cluster(monkeypatch, _Worker(shared))
    result = await evaluate_once(eval_step, _metrics(), input=DATA, checkpoint_dir=tmp_path)
    assert (result.checkpoint_path, result.global_step) == (picked, 2)
    assert result.metrics["mean_pred"] == pytest.approx(3.0 * 2.0)  # w * mean of x 1, 2, 3


async def test_a_worker_raises_the_chiefs_no_checkpoint_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _save(tmp_path, 2.0, 1)  # this worker sees one; the chief found none usable
    state = {"path": None, "nothing": "the chief's reason"}
    install_cluster(monkeypatch, _Worker({"evaluation-pick": {"version": 1, "state": state}}))
    with pytest.raises(NoCheckpointError, match="^the chief's reason$"):
        await evaluate_once(eval_step, _metrics(), input=DATA, checkpoint_dir=tmp_path)


@pytest.mark.parametrize(
    ("shared", "match"),
    [
        (None, "_Worker did not share the chief's plugin states"),
        ({"path": 3, "nothing": ""}, "the chief's pick of a checkpoint is malformed"),
        ({"path": None}, "the chief's pick of a checkpoint is malformed"),
    ],
)
async def test_a_worker_without_the_chiefs_pick_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shared: Any, match: str
) -> None:
    _save(tmp_path, 2.0, 1)
    given = None if shared is None else {"evaluation-pick": {"version": 1, "state": shared}}
    install_cluster(monkeypatch, _Worker(given))
    with pytest.raises((RuntimeError, ValueError), match=match):
        await evaluate_once(eval_step, _metrics(), input=DATA, checkpoint_dir=tmp_path)


async def test_eval_steps_and_final_ops() -> None:
    state = monitored.TrainState({"w": np.array([1.0])})
    result = await evaluate_once(
        eval_step, _metrics(), input=DATA, state=state, eval_steps=1, final_ops="w"
    )
    assert result.steps == 1
    assert result.metrics["mse"] == pytest.approx((1 + 4) / 2)
    np.testing.assert_array_equal(result.final_ops_values, [1.0])


async def test_restores_the_newest_checkpoint_and_reports_its_step(tmp_path: Path) -> None:
    _save(tmp_path, 1.0, 10)
    path = _save(tmp_path, 2.0, 20)
    result = await evaluate_once(eval_step, _metrics(), input=DATA, checkpoint_dir=tmp_path)
    assert result.global_step == 20
    assert result.checkpoint_path == path
    assert result.metrics["mse"] == 0.0


async def test_summaries_go_to_the_eval_directory_through_the_sink(tmp_path: Path) -> None:
    _save(tmp_path, 2.0, 5)
    written: list[tuple[str | None, int, dict[str, float]]] = []

    class Sink:
        def write_summaries(self, session: Any, step: int, summaries: Any) -> None:
            config = session.training_config
            written.append((config.summary_dir, step, dict(summaries)))

    await evaluate_once(eval_step, _metrics(), input=DATA, checkpoint_dir=tmp_path, hooks=[Sink()])
    assert written == [(str(tmp_path / "eval"), 5, {"mse": 0.0, "mean_pred": 4.0})]


async def test_an_evaluation_claims_no_run_directory_and_is_not_refused(tmp_path: Path) -> None:
    # An evaluation writes beside a run it reads, as evaluators may (one writer per
    # run is the training's): it asks no hook for run_directories and claims
    # nothing, not even while a training owns the directory it writes to.
    asked: list[str] = []

    class Writes:
        def run_directories(self, session: Any) -> list[str]:
            asked.append("run_directories")
            return [str(tmp_path / "eval")]

    owner = monitored.claim_run(tmp_path / "eval")
    assert owner is not None
    try:
        state = monitored.TrainState({"w": np.array([2.0])}, global_step=7)
        result = await evaluate_once(
            eval_step, _metrics(), input=DATA, state=state, hooks=[Writes()]
        )
        assert result.metrics == {"mse": 0.0, "mean_pred": 4.0}
        assert asked == []
        owner.check()  # still the newest claim: the evaluation took nothing over
    finally:
        owner.release()
    # A training session with the same hook does claim it (and is refused meanwhile).
    blocker = monitored.claim_run(tmp_path / "eval")
    assert blocker is not None
    try:
        with pytest.raises(monitored.RunOwnedError):
            async with monitored.MonitoredSession(monitored.TrainState(), hooks=[Writes()]):
                pass
    finally:
        blocker.release()


async def test_a_checkpoint_dir_that_does_not_exist_is_named_as_such(tmp_path: Path) -> None:
    missing = tmp_path / "does" / "not" / "exist"
    with pytest.raises(NoCheckpointError) as info:
        await evaluate_once(eval_step, _metrics(), input=DATA, checkpoint_dir=missing)
    assert str(info.value) == f"checkpoint directory {missing} does not exist"
    with pytest.raises(
        NoCheckpointError, match=r"holds no checkpoint to evaluate \(has training written one yet"
    ):
        await evaluate_once(eval_step, _metrics(), input=DATA, checkpoint_dir=tmp_path)
    # Nothing evaluated, nothing written: no summary directory made, none created.
    assert not missing.exists()
    assert not (tmp_path / "eval").exists()


async def test_a_follower_writes_summaries_only_of_what_it_evaluated(tmp_path: Path) -> None:
    # The hooks of an evaluation session run only for a checkpoint picked: the
    # follower's end (no new checkpoint) makes no session, so no summary writer
    # marks a new start at step 1, which would hide the evaluations in TensorBoard.
    _save(tmp_path, 2.0, 5)
    seen: list[tuple[str, int]] = []

    class Seen:
        def after_create_session(self, session: Any, coord: Any) -> None:
            seen.append(("created", session.state.global_step))

        def write_summaries(self, session: Any, step: int, summaries: Any) -> None:
            seen.append(("summaries", step))

    results = await _follow(tmp_path, hooks=[Seen()])
    assert [r.global_step for r in results] == [5]
    assert seen == [("created", 5), ("summaries", 5)]


async def test_bad_input_is_refused_clearly(tmp_path: Path) -> None:
    state = monitored.TrainState({"w": np.array([1.0])})
    with pytest.raises(ValueError, match="eval_steps must be a positive int"):
        await evaluate_once(eval_step, _metrics(), input=DATA, state=state, eval_steps=0)
    with pytest.raises(NoCheckpointError, match=str(tmp_path)):
        await evaluate_once(eval_step, _metrics(), input=DATA, checkpoint_dir=tmp_path)
    with pytest.raises(ValueError, match="evaluate_once needs at least one metric"):
        await evaluate_once(eval_step, {}, input=DATA, state=state)
    with pytest.raises(TypeError, match=r"evaluate_once: metrics\['mse'\] is int"):
        await evaluate_once(eval_step, {"mse": 3}, input=DATA, state=state)  # type: ignore[dict-item]

    def lazy_step(state: Any, batch: Any, metrics: Any) -> None:
        return None

    with pytest.raises(NoMetricUpdatesError, match="lazy_step updated none"):
        await evaluate_once(lazy_step, _metrics(), input=DATA, state=state)

    def bad_shapes(state: Any, batch: Any, metrics: Any) -> None:
        metrics["mse"].update(np.zeros(3), np.zeros(2))

    with pytest.raises(m.MetricShapeError, match=r"\(3,\).*\(2,\)"):
        await evaluate_once(bad_shapes, _metrics(), input=DATA, state=state)


async def test_evaluation_sessions_leave_training_only_plugins_out(fake_plugin: Any) -> None:
    fake_plugin(
        "trainer",
        """
        import monitored
        training_only = True
        def declare_options():
            return [monitored.Option("watch", "", "what to watch")]
        def end(): pass
        """,
    )
    fake_plugin("everywhere", "def end(): pass\n")
    options = {"trainer": {"watch": "loss"}}  # set for training: ignored where not loaded
    state = monitored.TrainState({"w": np.array([1.0])})
    async with monitored.MonitoredSession(state, plugin_options=options) as sess:
        assert [p.name for p in sess.plugins] == ["everywhere", "trainer"]
    async with EvaluationSession(state, plugin_options=options) as sess:
        assert [p.name for p in sess.plugins] == ["everywhere"]


async def test_without_the_checkpoint_plugin_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hide_plugins(monkeypatch, "checkpoint")
    with pytest.raises(monitored.MissingPluginError, match="pip install monitored-checkpoint"):
        await evaluate_once(eval_step, _metrics(), input=DATA, checkpoint_dir=tmp_path)


async def test_evaluate_repeatedly_evaluates_each_checkpoint_once(tmp_path: Path) -> None:
    _save(tmp_path, 2.0, 10)
    seen: list[int] = []

    def on_result(result: Any) -> None:
        seen.append(result.global_step)
        if result.global_step == 10:
            _save(tmp_path, 3.0, 20)

    results = await evaluate_repeatedly(
        tmp_path,
        eval_step,
        _metrics(),
        input_fn=lambda: DATA,
        eval_interval_secs=0,
        timeout=0.5,
        poll_secs=0.05,
        on_result=on_result,
    )
    assert seen == [10, 20]
    assert [r.metrics["mean_pred"] for r in results] == [4.0, 6.0]


async def test_evaluate_repeatedly_stops_after_max_number_of_evaluations(tmp_path: Path) -> None:
    _save(tmp_path, 2.0, 10)
    results = await evaluate_repeatedly(
        tmp_path,
        eval_step,
        _metrics(),
        input_fn=lambda: DATA,
        max_number_of_evaluations=1,
        poll_secs=0.05,
    )
    assert len(results) == 1


def _files(directory: Path, step: int) -> tuple[Path, Path]:
    return directory / f"model.ckpt-{step}.json", directory / f"model.ckpt-{step}.safetensors"


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def _follow(directory: Path, **kwargs: Any) -> Any:
    kwargs.setdefault("input_fn", lambda: DATA)
    kwargs.setdefault("eval_interval_secs", 0)
    kwargs.setdefault("timeout", 0.3)
    kwargs.setdefault("poll_secs", 0.05)
    return evaluate_repeatedly(directory, eval_step, _metrics(), **kwargs)


def _logged(caplog: Any, level: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == level]


async def test_evaluate_repeatedly_skips_a_checkpoint_deleted_before_it_is_read(
    tmp_path: Path, caplog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _save(tmp_path, 2.0, 1)
    restore = _Checkpoints.restore

    def rotated_first(self: _Checkpoints, state: monitored.TrainState, path: str) -> Any:
        # Between the listing and the read, the trainer saves step 2 and rotates
        # step 1 away, manifest first.
        if path.endswith("-1"):
            _save(tmp_path, 3.0, 2)
            for file in _files(tmp_path, 1):
                file.unlink()
        return restore(self, state, path)

    monkeypatch.setattr(_Checkpoints, "restore", rotated_first)
    with caplog.at_level(logging.INFO, logger="monitored"):
        results = await _follow(tmp_path)
    assert [r.global_step for r in results] == [2]
    [warning] = _logged(caplog, "WARNING")
    assert f"skipping checkpoint {tmp_path}/model.ckpt-1: it was deleted before it" in warning
    assert not any("trying it again" in m for m in _logged(caplog, "INFO"))  # not retried


async def test_evaluate_repeatedly_tries_a_damaged_checkpoint_twice_then_goes_on(
    tmp_path: Path, caplog: Any
) -> None:
    _save(tmp_path, 2.0, 1)
    _save(tmp_path, 3.0, 2)
    _flip_last_byte(_files(tmp_path, 2)[1])
    with caplog.at_level(logging.INFO, logger="monitored"):
        results = await _follow(tmp_path)
    assert [r.global_step for r in results] == [1]  # the one before it, not yet evaluated
    [warning] = _logged(caplog, "WARNING")
    assert f"skipping checkpoint {tmp_path}/model.ckpt-2: " in warning
    assert "checksum mismatch" in warning
    [retry] = [m for m in _logged(caplog, "INFO") if "trying it again" in m]
    assert "model.ckpt-2" in retry


async def test_evaluate_repeatedly_evaluates_a_checkpoint_that_arrives_while_it_waits(
    tmp_path: Path, caplog: Any
) -> None:
    _save(tmp_path, 2.0, 1)
    data = _files(tmp_path, 1)[1]
    whole = data.read_bytes()
    data.write_bytes(whole[:-8])  # copied in place, not all there yet

    async def complete() -> None:
        await anyio.sleep(0.1)
        data.write_bytes(whole)

    with caplog.at_level(logging.INFO, logger="monitored"):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(complete)
            results = await _follow(tmp_path, poll_secs=0.5, timeout=0.1)
    assert [r.global_step for r in results] == [1]
    assert results[0].metrics["mean_pred"] == 4.0
    assert _logged(caplog, "WARNING") == []
    assert any("trying it again" in m for m in _logged(caplog, "INFO"))


async def test_a_skipped_checkpoint_is_evaluated_once_its_files_change(
    tmp_path: Path, caplog: Any
) -> None:
    _save(tmp_path, 2.0, 1)
    data = _files(tmp_path, 1)[1]
    whole = data.read_bytes()
    data.write_bytes(whole[:-8])
    timeouts: list[int] = []

    def timeout_fn() -> bool:  # the copy completes after the evaluator gave up on it
        timeouts.append(1)
        data.write_bytes(whole)
        return len(timeouts) > 1

    with caplog.at_level(logging.WARNING, logger="monitored"):
        results = await _follow(tmp_path, timeout_fn=timeout_fn)
    assert [r.global_step for r in results] == [1]
    [warning] = _logged(caplog, "WARNING")
    assert "model.ckpt-1" in warning
    assert "truncated or was replaced" in warning


async def test_evaluate_repeatedly_still_fails_on_what_is_not_the_trainers_doing(
    tmp_path: Path,
) -> None:
    from monitored_checkpoint import CheckpointMismatchError

    _save(tmp_path, 2.0, 1)
    with pytest.raises(CheckpointMismatchError, match="shape"):
        await _follow(tmp_path, state_fn=lambda: monitored.TrainState({"w": np.zeros(3)}))
    with pytest.raises(TypeError, match=r"unknown arguments \['eval_step'\].*eval_steps"):
        await _follow(tmp_path, eval_step=3)
    with pytest.raises(ValueError, match="eval_steps must be a positive int"):
        await _follow(tmp_path, eval_steps=0)


async def test_evaluate_once_of_a_directory_evaluates_the_newest_that_restores(
    tmp_path: Path, caplog: Any
) -> None:
    _save(tmp_path, 2.0, 1)
    _save(tmp_path, 3.0, 2)
    _flip_last_byte(_files(tmp_path, 2)[1])
    with caplog.at_level(logging.WARNING, logger="monitored"):
        result = await evaluate_once(eval_step, _metrics(), input=DATA, checkpoint_dir=tmp_path)
    assert result.global_step == 1
    [warning] = _logged(caplog, "WARNING")
    assert f"skipping checkpoint {tmp_path}/model.ckpt-2: " in warning
    _flip_last_byte(_files(tmp_path, 1)[1])
    with pytest.raises(NoCheckpointError, match=r"skipped, unusable: .*model.ckpt-1"):
        await evaluate_once(eval_step, _metrics(), input=DATA, checkpoint_dir=tmp_path)


async def test_a_checkpoint_named_by_path_is_not_skipped_but_fails_naming_it(
    tmp_path: Path,
) -> None:
    from monitored_checkpoint import CheckpointNotFoundError, CorruptCheckpointError

    path = _save(tmp_path, 2.0, 1)
    _flip_last_byte(_files(tmp_path, 1)[1])
    with pytest.raises(CorruptCheckpointError, match="checksum mismatch"):
        await evaluate_once(eval_step, _metrics(), input=DATA, checkpoint_path=path)
    for file in _files(tmp_path, 1):
        file.unlink()
    with pytest.raises(CheckpointNotFoundError, match="model.ckpt-1 does not exist"):
        await evaluate_once(eval_step, _metrics(), input=DATA, checkpoint_path=path)


def test_summaries_of_a_model_directory_go_to_its_eval_directory_where_writable(
    tmp_path: Path,
) -> None:
    assert default_summary_dir(str(tmp_path)) == str(tmp_path / "eval")
    assert default_summary_dir(str(tmp_path / "new" / "run"), "eval_x") == str(
        tmp_path / "new" / "run" / "eval_x"
    )
    (tmp_path / "file").write_text("")  # not a directory: the summaries plugin names it
    assert default_summary_dir(str(tmp_path / "file")) == str(tmp_path / "file" / "eval")
    assert default_summary_dir("memory://run") == "memory://run/eval"


def train_step(state: monitored.TrainState) -> None:
    state["w"] = state["w"] + 1.0
    state.global_step += 1


async def test_evaluation_inside_training_reaches_the_training_plugins() -> None:
    reported: list[tuple[int, dict[str, float]]] = []

    class EarlyStopper:
        def after_evaluate(self, session: Any, step: int, metrics: Any) -> None:
            reported.append((step, dict(metrics)))

    hook = EvaluationHook(eval_step, _metrics(), input_fn=lambda: DATA, every_n_steps=2)
    state = monitored.TrainState({"w": np.array([0.0])})
    async with monitored.MonitoredSession(
        state, hooks=[hook, EarlyStopper(), monitored.StopAtStepHook(last_step=4)]
    ) as sess:
        while not sess.should_stop():
            await sess.run(train_step)
    assert [step for step, _ in reported] == [1, 3]
    assert reported[0][1]["mean_pred"] == pytest.approx(1.0 * 2)


@pytest.mark.parametrize("training_watches", [0.3, None])
async def test_an_eval_step_holding_the_loop_inside_training_is_named_once(
    caplog: pytest.LogCaptureFixture, training_watches: float | None
) -> None:
    # The training session's watchdog names an eval step that holds the loop: its
    # evaluation sessions start no watchdog thread of their own. A training that
    # does not watch leaves the evaluations their own (the 0.3 s of the environment).
    watchdogs: list[int] = []

    def slow_eval_step(state: Any, batch: Any, metrics: Any) -> None:
        watchdogs.append(
            sum(thread.name == "monitored loop watchdog" for thread in threading.enumerate())
        )
        if state.global_step == 3 and len(watchdogs) == 3:
            time.sleep(1.0)
        eval_step(state, batch, metrics)

    hook = EvaluationHook(slow_eval_step, _metrics(), input_fn=lambda: DATA, every_n_steps=2)
    state = monitored.TrainState({"w": np.array([0.0])})
    with caplog.at_level(logging.WARNING, logger="monitored"), pytest.MonkeyPatch.context() as env:
        env.setenv(BLOCKED_LOOP_ENV, "0.3")
        async with monitored.MonitoredSession(
            state,
            hooks=[hook, monitored.StopAtStepHook(last_step=4)],
            blocked_loop_warning_secs=training_watches,
        ) as sess:
            while not sess.should_stop():
                await sess.run(train_step)
    # Two evaluations of two batches; until the warning (said once), one watchdog
    # thread: the training's, or else the evaluation's own.
    assert len(watchdogs) == 4
    assert watchdogs[:3] == [1, 1, 1]
    [message] = [r.getMessage() for r in caplog.records if "held the event loop" in r.getMessage()]
    assert message.startswith("step function tests.evaluation.test_evaluation.")
    assert "slow_eval_step (line" in message


async def test_inside_a_training_alone_evaluations_ask_no_plugin_for_a_cluster(
    fake_plugin: Any,
) -> None:
    # A cluster supplier that supplies none (monitored-mpi in one process) is asked
    # once, by the training session: its evaluations train alone as it does.
    import importlib

    module = importlib.import_module(
        fake_plugin(
            "lonely",
            """
            asked = []
            def cluster(session):
                asked.append(type(session).__name__)
                return None
            """,
        )
    )
    hook = EvaluationHook(eval_step, _metrics(), input_fn=lambda: DATA, every_n_steps=2)
    state = monitored.TrainState({"w": np.array([0.0])})
    async with monitored.MonitoredSession(
        state, hooks=[hook, monitored.StopAtStepHook(last_step=4)]
    ) as sess:
        while not sess.should_stop():
            await sess.run(train_step)
    assert [r.global_step for r in hook.results] == [1, 3]
    assert module.asked == ["MonitoredSession"]
    # On its own, an evaluation asks, as any session does.
    await evaluate_once(eval_step, _metrics(), input=DATA, state=state)
    assert module.asked == ["MonitoredSession", "EvaluationSession"]


async def test_an_evaluation_that_raises_stops_training() -> None:
    ended: list[int] = []

    class Watch:
        def end(self, session: Any) -> None:
            ended.append(session.state.global_step)

    def broken(state: Any, batch: Any, metrics: Any) -> None:
        raise RuntimeError("eval model is broken")

    hook = EvaluationHook(broken, _metrics(), input_fn=lambda: DATA, every_n_steps=3)
    state = monitored.TrainState({"w": np.array([0.0])})
    with pytest.raises(EvaluationFailedError, match="training step 1.*training stops") as info:
        async with monitored.MonitoredSession(state, hooks=[hook, Watch()]) as sess:
            while not sess.should_stop():
                await sess.run(train_step)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert state.global_step == 1
    assert ended == []


@pytest.mark.parametrize("fails", [False, True])
async def test_the_final_evaluation_comes_before_other_hooks_end(fails: bool) -> None:
    events: list[str] = []

    class Watch:
        def after_evaluate(self, session: Any, step: int, metrics: Any) -> None:
            events.append(f"evaluated {step}")

        def end(self, session: Any) -> None:
            events.append(f"end {session.state.global_step}")

    def final_may_fail(state: Any, batch: Any, metrics: Any) -> None:
        if fails and state.global_step == 2:
            raise RuntimeError("eval model is broken")
        eval_step(state, batch, metrics)

    hook = EvaluationHook(
        final_may_fail, _metrics(), input_fn=lambda: DATA, every_n_steps=10, at_end=True
    )
    state = monitored.TrainState({"w": np.array([0.0])})

    async def train(hooks: list[object]) -> None:
        async with monitored.MonitoredSession(state, hooks=hooks) as sess:
            while state.global_step < 2:
                await sess.run(train_step)

    if not fails:
        await train([Watch(), hook])  # listed after Watch, evaluating before its end
        assert events == ["evaluated 1", "evaluated 2", "end 2"]
        return
    with pytest.raises(EvaluationFailedError, match="training step 2") as info:
        await train([hook, Watch()])
    assert isinstance(info.value.__cause__, RuntimeError)
    assert events == ["evaluated 1", "end 2"]  # the failure waited for the other hooks' end


async def test_async_input_and_a_step_ending_the_input() -> None:
    async def batches() -> Any:
        for batch in DATA:
            yield batch

    state = monitored.TrainState({"w": np.array([2.0])})
    result = await evaluate_once(eval_step, _metrics(), input=batches(), state=state)
    assert result.steps == 2

    calls: list[int] = []

    def until_three(state: Any, metrics: Any) -> None:
        if len(calls) == 3:
            raise monitored.OutOfRangeError("done")
        calls.append(1)
        metrics["mean_pred"].update(np.ones(2))

    result = await evaluate_once(until_three, {"mean_pred": m.Mean()}, state=state)
    assert result.steps == 3
    assert result.metrics == {"mean_pred": 1.0}


async def test_steps_counts_the_step_an_eval_hook_stops_after() -> None:
    class StopAtSecond:
        seen = 0

        def after_run(self, run_context: Any, run_values: Any) -> None:
            self.seen += 1
            if self.seen == 2:
                run_context.request_stop()

    state = monitored.TrainState({"w": np.array([2.0])})
    result = await evaluate_once(
        eval_step, _metrics(), input=DATA * 3, state=state, hooks=[StopAtSecond()]
    )
    assert result.steps == 2
    assert result.metrics["mean_pred"] == pytest.approx((2 + 4 + 6) / 3)
    result = await evaluate_once(eval_step, _metrics(), input=DATA * 3, state=state, eval_steps=5)
    assert result.steps == 5


async def test_in_training_evaluation_summaries_go_to_the_training_eval_dir(
    tmp_path: Path,
) -> None:
    written: list[tuple[str | None, int]] = []

    class Sink:
        def write_summaries(self, session: Any, step: int, summaries: Any) -> None:
            written.append((session.training_config.summary_dir, step))

    hook = EvaluationHook(
        eval_step, _metrics(), input_fn=lambda: DATA, every_n_steps=100, hooks=[Sink()]
    )
    state = monitored.TrainState({"w": np.array([0.0])})
    async with monitored.MonitoredTrainingSession(
        state,
        hooks=[hook, monitored.StopAtStepHook(last_step=1)],
        summary_dir=str(tmp_path),
        save_summaries_steps=None,
        log_step_count_steps=None,
    ) as sess:
        while not sess.should_stop():
            await sess.run(train_step)
    assert written == [(str(tmp_path / "eval"), 1)]


@pytest.mark.parametrize("fed", [False, True])
async def test_a_sharded_evaluation_reads_its_whole_shard_from_a_pipeline_in_its_hooks(
    monkeypatch: pytest.MonkeyPatch, fed: bool
) -> None:
    # An input pipeline alone in a job would stop every process at the end of the
    # shortest shard; in a sharded evaluation the evaluation decides instead, so the
    # other process's extra batch is waited for and nothing is left out.
    cluster = _OtherHalf()
    install_cluster(monkeypatch, cluster)
    pipeline = data.prefetch(DATA, name="eval", feed="batch" if fed else False)
    state = monitored.TrainState({"w": np.array([2.0])})
    result = await evaluate_once(
        eval_step,
        _metrics(),
        input=None if fed else pipeline,
        hooks=[pipeline],
        state=state,
        sharded=True,
    )
    assert result.steps == 2
    assert cluster.merged == [["processes with input"]] * 4 + [["mean_squared_error", "mean"]]
    assert result.metrics["mean_pred"] == pytest.approx((2 + 4 + 6 + 3 * 10) / 6)


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({"shard": True}, TypeError, r"unknown arguments 'shard' \(did you mean 'sharded'\?\)"),
        ({"input_fn": DATA}, TypeError, "input_fn must be a function .* got list"),
        ({"metrics": {}}, ValueError, "EvaluationHook needs at least one metric"),
        ({"metrics": {"m": 1.0}}, TypeError, r"EvaluationHook: metrics\['m'\] is float"),
        ({"eval_steps": 0}, ValueError, "EvaluationHook: eval_steps must be a positive int"),
        (
            {"checkpoint_path": "a", "checkpoint_dir": "b"},
            ValueError,
            "EvaluationHook: give checkpoint_path or checkpoint_dir, not both",
        ),
    ],
)
def test_an_evaluation_hook_checks_its_arguments_when_made_not_at_its_first_evaluation(
    arguments: dict[str, Any], error: type[Exception], message: str
) -> None:
    given: dict[str, Any] = {"metrics": _metrics(), "every_n_steps": 1000, **arguments}
    with pytest.raises(error, match=message):
        EvaluationHook(eval_step, **given)


def _no_raw_character(text: str) -> None:
    bad = sorted({char for char in text if not char.isprintable()})
    assert not bad, f"{bad!r} would reach the terminal raw in {text!r}"


async def test_checkpoint_names_an_evaluator_finds_are_printed_escaped(
    tmp_path: Path, caplog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 34 §2: a checkpoint whose name holds ESC, OSC and CSI sequences, in a
    directory whose name holds every control character and a newline, polled by an
    evaluator: every log line, warning and error that names it shows it escaped, on
    one line. (A newline in the checkpoint's own name makes it no checkpoint: such
    names are never listed.)"""
    from _hostile import HOSTILE_NAME, SEQUENCES, assert_safe_line

    directory = tmp_path / HOSTILE_NAME
    basename = f"model{SEQUENCES}.ckpt"
    # Our Saver refuses such a basename; another writer (an older version, a tool,
    # someone's hands) need not.
    with monkeypatch.context() as patched:
        patched.setattr("monitored_checkpoint._saver.check_basename", lambda name, _: name)
        for w, step in ((2.0, 1), (3.0, 2)):
            state = monitored.TrainState({"w": np.array([w])}, global_step=step)
            Saver().save(state, str(directory / basename))
    _flip_last_byte(directory / f"{basename}-2.safetensors")
    with caplog.at_level(logging.INFO, logger="monitored"):
        results = await _follow(directory)
    assert [r.global_step for r in results] == [1]
    named = [r.getMessage() for r in caplog.records if "pwned" in r.getMessage()]
    assert len(named) >= 3  # the retry, the skip warning, "Evaluating ..."
    for message in named:
        assert_safe_line(message)
    for record in caplog.records:
        _no_raw_character(record.getMessage())
    # Nothing usable left: the error lists what was skipped, escaped.
    _flip_last_byte(directory / f"{basename}-1.safetensors")
    with pytest.raises(NoCheckpointError) as info:
        await evaluate_once(eval_step, _metrics(), input=DATA, checkpoint_dir=directory)
    assert "skipped, unusable" in str(info.value)
    assert_safe_line(str(info.value))
    # A worker raises the chief's words (another process's) escaped too.
    shared = {"path": None, "nothing": f"gone: {HOSTILE_NAME}"}
    install_cluster(monkeypatch, _Worker({"evaluation-pick": {"version": 1, "state": shared}}))
    with pytest.raises(NoCheckpointError) as info:
        await evaluate_once(eval_step, _metrics(), input=DATA, checkpoint_dir=directory)
    assert_safe_line(str(info.value))
