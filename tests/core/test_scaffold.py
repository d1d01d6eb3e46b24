"""Scaffold and SessionManager: init, restore, readiness and workers waiting."""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import pytest

import monitored
from monitored import TrainState


async def test_init_fn_runs_on_a_fresh_chief_only(state: TrainState) -> None:
    calls = []

    async def init_fn(state: TrainState) -> None:
        calls.append("init")
        state["b"] = np.zeros(1)

    scaffold = monitored.Scaffold(init_fn=init_fn, local_init_fn=lambda s: calls.append("local"))
    async with monitored.MonitoredSession(state, scaffold=scaffold) as sess:
        assert sess.restored_from is None
    assert calls == ["init", "local"]
    assert "b" in state


async def test_a_restore_hook_replaces_init(state: TrainState) -> None:
    class Restorer:
        def restore_state(self, session: Any) -> str:
            session.state.global_step = 5
            return "ckpt-5"

    scaffold = monitored.Scaffold(init_fn=lambda s: pytest.fail("must not init"))
    async with monitored.MonitoredSession(state, scaffold=scaffold, hooks=[Restorer()]) as sess:
        assert sess.restored_from == "ckpt-5"
    assert state.global_step == 5


async def test_not_ready_after_init_is_a_clear_error(state: TrainState) -> None:
    scaffold = monitored.Scaffold(ready_fn=lambda s: "entry 'emb' is missing")
    with pytest.raises(
        RuntimeError, match="no init_fn or local_init_fn was given: entry 'emb' is missing"
    ):
        async with monitored.MonitoredSession(state, scaffold=scaffold):
            pass


async def test_a_worker_waits_for_the_chief(state: TrainState) -> None:
    manager = monitored.SessionManager(recovery_wait_secs=0.01)
    order = []

    async def worker() -> None:
        async with monitored.MonitoredSession(state, is_chief=False, session_manager=manager):
            order.append("worker ready")

    async def chief() -> None:
        await anyio.sleep(0.05)
        order.append("chief starts")
        async with monitored.MonitoredSession(state):
            pass

    async with anyio.create_task_group() as tg:
        tg.start_soon(worker)
        tg.start_soon(chief)
    assert order == ["chief starts", "worker ready"]


async def test_a_worker_gives_up_after_max_wait_secs(state: TrainState) -> None:
    manager = monitored.SessionManager(recovery_wait_secs=0.01)
    with pytest.raises(monitored.DeadlineExceededError, match=r"worker waited 0.05s for the chief"):
        async with monitored.MonitoredSession(
            state, is_chief=False, session_manager=manager, max_wait_secs=0.05
        ):
            pass


async def test_the_checkpoint_restored_is_logged_escaped(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 34 §2: the path of the checkpoint found in a directory (whose name a crafted
    directory chose) is logged on one line, its control characters escaped."""
    import logging
    import os

    from _hostile import HOSTILE_NAME, assert_safe_line

    checkpoint = pytest.importorskip("monitored_checkpoint")
    directory = os.path.join(tmp_path, HOSTILE_NAME)
    saved = TrainState({"w": np.ones(2)})
    saved.global_step = 3
    checkpoint.Saver().save(saved, os.path.join(directory, "model.ckpt"))
    state = TrainState({"w": np.zeros(2)})
    manager = monitored.SessionManager(saver=checkpoint.Saver())
    with caplog.at_level(logging.INFO, logger="monitored"):
        restored, ready = await manager.recover_session(state, checkpoint_dir=directory)
    assert ready
    assert state.global_step == 3
    assert restored == os.path.join(directory, "model.ckpt-3")  # the value stays exact
    (line,) = [r.getMessage() for r in caplog.records if "Restored the state" in r.getMessage()]
    assert_safe_line(line)
