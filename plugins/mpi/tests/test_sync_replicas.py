"""``SyncReplicasOptimizer``: TF's synchronous replicas on MPI, and what it refuses."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import monitored
import monitored_mpi
from monitored_mpi import _world


@pytest.fixture(autouse=True)
def _alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_world, "_probed", False)
    monkeypatch.setattr(_world, "_world", None)
    for name in _world.LAUNCHER_ENV:
        monkeypatch.delenv(name, raising=False)


def _optimizer(**kwargs: Any) -> monitored_mpi.SyncReplicasOptimizer:
    return monitored_mpi.SyncReplicasOptimizer(monitored.GradientDescentOptimizer(0.5), **kwargs)


async def test_one_replica_alone_trains_as_the_wrapped_optimizer() -> None:
    opt = _optimizer(replicas_to_aggregate=1)
    state = monitored.TrainState({"w": np.ones(2)})
    async with monitored.MonitoredSession(
        state, hooks=[opt.make_session_run_hook(True), monitored.StopAtStepHook(last_step=2)]
    ) as sess:
        while not sess.should_stop():
            await sess.run(lambda state: opt.apply_gradients(state, {"w": state["w"]}))
    np.testing.assert_array_equal(state["w"], [0.25, 0.25])
    assert state.global_step == 2
    assert opt.learning_rate == 0.5  # the wrapped optimizer's attributes


async def test_more_replicas_than_ranks_is_refused_when_the_session_begins() -> None:
    opt = _optimizer(replicas_to_aggregate=2)
    state = monitored.TrainState({"w": np.ones(2)})
    with pytest.raises(monitored.UnsupportedArgumentError, match=r"has 1 rank; .*mpiexec -n 2"):
        async with monitored.MonitoredSession(state, hooks=[opt.make_session_run_hook(True)]):
            pass


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"replicas_to_aggregate": 2, "total_num_replicas": 3}, "backup workers"),
        ({"replicas_to_aggregate": 3, "total_num_replicas": 2}, "more gradients per step"),
        ({"replicas_to_aggregate": 1, "variable_averages": object()}, "ExponentialMovingAverage"),
        ({"replicas_to_aggregate": 1, "use_locking": True}, "no shared variables"),
    ],
)
def test_what_has_no_counterpart_is_refused_with_what_to_do(kwargs: Any, match: str) -> None:
    with pytest.raises(monitored.UnsupportedArgumentError, match=match):
        _optimizer(**kwargs)


def test_bad_counts_and_tf_queue_calls() -> None:
    with pytest.raises(ValueError, match="replicas_to_aggregate=0"):
        _optimizer(replicas_to_aggregate=0)
    opt = _optimizer(replicas_to_aggregate=1)
    with pytest.raises(monitored.UnsupportedArgumentError, match="no token queue"):
        opt.make_session_run_hook(True, num_tokens=4)
    with pytest.raises(monitored.UnsupportedArgumentError, match="make_session_run_hook"):
        opt.get_chief_queue_runner()
    assert "replicas_to_aggregate=1" in repr(opt)


def test_the_distributed_optimizer_names_itself_for_a_missing_attribute() -> None:
    opt = monitored_mpi.DistributedOptimizer(monitored.GradientDescentOptimizer(0.5))
    with pytest.raises(
        AttributeError, match=r"DistributedOptimizer \(wrapping Gradient.*SyncReplicasOptimizer"
    ):
        opt.make_session_run_hook(True)  # type: ignore[operator]


def test_two_ranks_average_their_shards_as_tf_synchronous_replicas(run_mpi: Any) -> None:
    proc, results = run_mpi(2, "sync_replicas.py", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert results[0]["step"] == results[1]["step"] == 20
    assert results[0]["w"] == results[1]["w"]
    np.testing.assert_allclose(results[0]["w"], results[0]["whole"], rtol=1e-12)


def test_a_job_of_two_ranks_for_three_replicas_is_refused_before_a_step(run_mpi: Any) -> None:
    """Both ranks refuse at ``begin``; the first to fail ends the job (the plugin's rule),
    often before any rank writes its result: the job's output says why."""
    proc, results = run_mpi(2, "sync_replicas.py", "3")
    output = proc.stdout + proc.stderr
    assert "this job has 2 ranks" in output, output
    assert "mpiexec -n 3" in output
    assert all("step" not in result for result in results.values()), "no rank trained"
