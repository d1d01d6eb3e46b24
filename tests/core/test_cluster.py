"""The cluster seam: ClusterSpec, a supplied cluster's roles and stop decision."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import monitored
from monitored import ClusterSpec


def test_cluster_spec_describes_jobs_of_tasks() -> None:
    spec = ClusterSpec({"worker": ["w0:1", "w1:1"], "ps": {0: "p0:1", 2: "p2:1"}})
    assert spec.jobs == ["ps", "worker"]
    assert spec.num_tasks("worker") == 2
    assert spec.task_indices("ps") == [0, 2]
    assert spec.job_tasks("ps") == ["p0:1", None, "p2:1"]
    assert spec.task_address("worker", 1) == "w1:1"
    assert spec.as_dict() == {"worker": ["w0:1", "w1:1"], "ps": {0: "p0:1", 2: "p2:1"}}
    assert ClusterSpec(spec) == spec
    assert hash(ClusterSpec(spec)) == hash(spec)
    assert list(spec) == ["ps", "worker"]
    assert not ClusterSpec({})


@pytest.mark.parametrize(
    ("cluster", "error", "message"),
    [
        ("worker", TypeError, "mapping of job names"),
        ({"": ["a"]}, ValueError, "job names must be non-empty"),
        ({"w": "a:1"}, TypeError, "tasks of job 'w' must be a list"),
        ({"w": {-1: "a"}}, ValueError, "task index -1"),
        ({"w": [1]}, TypeError, "task 0 of job 'w' has address 1"),
    ],
)
def test_cluster_spec_refuses_malformed_input(cluster: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        ClusterSpec(cluster)


def test_cluster_spec_names_a_missing_job_or_task() -> None:
    spec = ClusterSpec({"worker": ["a"]})
    with pytest.raises(ValueError, match=r"no such job 'ps' \(jobs: \['worker'\]\)"):
        spec.num_tasks("ps")
    with pytest.raises(ValueError, match="job 'worker' has no task 3"):
        spec.task_address("worker", 3)


class _Voting:
    """A cluster of two where the other process asks to stop after step 4."""

    def __init__(self, is_chief: bool) -> None:
        self._is_chief = is_chief
        self.shared = 0
        self.failed: list[BaseException] = []
        self.session: Any = None

    @property
    def is_chief(self) -> bool:
        return self._is_chief

    def agree_to_stop(self, local: bool) -> bool:
        return local or self.session.state.global_step >= 4

    async def share_state(self, session: Any, max_wait_secs: float) -> None:
        self.session = session
        self.shared += 1
        session.state.initialized = True

    def fail(self, failure: BaseException) -> None:
        self.failed.append(failure)


def _step(state: monitored.TrainState) -> None:
    state.global_step += 1


async def test_the_clusters_decision_stops_the_loop_and_it_shares_the_state() -> None:
    cluster = _Voting(is_chief=False)
    async with monitored.MonitoredSession(monitored.TrainState(), cluster=cluster) as sess:
        assert not sess.is_chief
        assert sess.cluster is cluster
        while not sess.should_stop():
            await sess.run(_step)
    assert sess.state.global_step == 4
    assert cluster.shared == 1
    assert cluster.failed == []


async def test_alone_the_session_trains_in_a_local_cluster() -> None:
    async with monitored.MonitoredSession(monitored.TrainState()) as sess:
        assert isinstance(sess.cluster, monitored.LocalCluster)
        assert sess.cluster.is_chief


async def test_a_failure_is_handed_to_the_cluster() -> None:
    cluster = _Voting(is_chief=True)
    with pytest.raises(ZeroDivisionError):
        async with monitored.MonitoredSession(monitored.TrainState(), cluster=cluster) as sess:
            await sess.run(lambda state: 1 / 0)
    assert [type(f) for f in cluster.failed] == [ZeroDivisionError]


async def test_an_end_of_input_meets_the_others_stop_decision() -> None:
    votes: list[bool] = []
    cluster = _Voting(is_chief=True)
    cluster.agree_to_stop = lambda local: votes.append(local) or local  # type: ignore[method-assign]
    async with monitored.MonitoredSession(monitored.TrainState(), cluster=cluster) as sess:
        raise monitored.OutOfRangeError("done")
    assert votes == [False, True]  # once created (nothing to stop yet), then at the close
    assert sess.state.global_step == 0


async def test_a_worker_leaves_out_chief_only_hooks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Seen:
        def __init__(self) -> None:
            self.begun = False

        def begin(self) -> None:
            self.begun = True

    chief_only, everywhere = Seen(), Seen()
    cluster = _Voting(is_chief=False)

    async def supply(self: Any, available: Any) -> None:
        self._cluster = cluster

    monkeypatch.setattr(monitored.MonitoredSession, "_find_cluster", supply)
    async with monitored.MonitoredTrainingSession(
        monitored.TrainState({"w": np.zeros(1)}),
        chief_only_hooks=[chief_only],
        hooks=[everywhere],
        disable_plugins=["checkpoint", "summaries", "progress"],
    ) as sess:
        assert not sess.is_chief
        assert sess.training_config is not None
        assert not sess.training_config.is_chief
        names = [info.name for info in sess.plugins]
    assert everywhere.begun
    assert not chief_only.begun
    assert not any("StepCounterHook" in name for name in names)


class _EndFails:
    def end(self, session: Any) -> None:
        raise KeyError("end hook broke")


async def test_an_exception_raised_while_closing_is_handed_to_the_cluster_once() -> None:
    cluster = _Voting(is_chief=True)
    with pytest.raises(KeyError, match="end hook broke"):
        async with monitored.MonitoredSession(
            monitored.TrainState(), cluster=cluster, hooks=[_EndFails()]
        ) as sess:
            await sess.run(_step)
    assert [str(f) for f in cluster.failed] == ["'end hook broke'"]


async def test_a_stop_decision_failing_at_close_is_handed_to_the_cluster_once() -> None:
    cluster = _Voting(is_chief=False)

    def timeout(local: bool) -> bool:
        raise monitored.DeadlineExceededError("the stop decision timed out")

    cluster.agree_to_stop = timeout  # type: ignore[method-assign]
    with pytest.raises(monitored.DeadlineExceededError, match="the stop decision timed out"):
        async with monitored.MonitoredSession(monitored.TrainState(), cluster=cluster):
            raise monitored.OutOfRangeError("input ended before any step")
    assert [type(f) for f in cluster.failed] == [monitored.DeadlineExceededError]


async def test_a_stop_asked_while_the_session_is_created_is_agreed_before_the_first_step() -> None:
    # StopAtStepHook of a run resumed at its last step asks in after_create_session:
    # with other processes, should_stop() answers only agreed stops, so the session
    # agrees on it at once, and no process runs an extra step.
    votes: list[bool] = []
    cluster = _Voting(is_chief=True)
    cluster.agree_to_stop = lambda local: votes.append(local) or local  # type: ignore[method-assign]
    state = monitored.TrainState(global_step=6)
    hooks = [monitored.StopAtStepHook(last_step=6)]
    async with monitored.MonitoredSession(state, hooks=hooks, cluster=cluster) as sess:
        assert sess.should_stop()
        while not sess.should_stop():
            await sess.run(_step)  # pragma: no cover - never runs
    assert state.global_step == 6
    assert votes == [True]


async def test_with_other_processes_an_aborted_error_is_a_failure_not_a_recovery() -> None:
    # Alone the session would be re-created; the other processes cannot follow.
    cluster = _Voting(is_chief=True)
    calls = []

    def aborted(state: monitored.TrainState) -> None:
        calls.append(state.global_step)
        raise monitored.AbortedError("peer restarted")

    with pytest.raises(monitored.AbortedError) as caught:
        async with monitored.MonitoredSession(monitored.TrainState(), cluster=cluster) as sess:
            await sess.run(aborted)
    assert calls == [0]
    assert cluster.shared == 1, "the session must not be re-created"
    assert [type(f) for f in cluster.failed] == [monitored.AbortedError]
    assert "Not recovered: this process trains with others" in "".join(caught.value.__notes__)


async def test_with_other_processes_a_coordinators_aborted_error_is_a_failure() -> None:
    cluster = _Voting(is_chief=True)
    with pytest.raises(monitored.AbortedError, match="input service gone"):
        async with monitored.MonitoredSession(monitored.TrainState(), cluster=cluster) as sess:
            await sess.run(_step)
            sess.coord.request_stop(monitored.AbortedError("input service gone"))
            await sess.run(_step)
    assert cluster.shared == 1
