"""Supervisors whose sessions live side by side and stop in any order.

TensorFlow's ``supervisor_test.py`` makes a chief and a worker Supervisor on one
server and stops them in the order they were made (``testReadyForLocalInitOp``,
``testReadyForLocalInitOpRestoreFromCheckpoint``): each session is an object with
its own lifetime, not a block of the task that opened it. TF's scenario and
numbers are kept. TF's server shares the global variables between the two
sessions and keeps the local ones apart; here the two Supervisors share one
``TrainState`` (the "server"), ``v`` is the global variable and ``w`` the local
one, made by ``local_init_op`` from ``v`` once ``ready_for_local_init_op`` finds
``v`` initialized.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from monitored import MonitoredSession, Supervisor, TrainState


def uninitialized(names: list[str]) -> Callable[[TrainState], str | None]:
    """TF's ``report_uninitialized_variables(names)`` as a readiness check."""

    def report(state: TrainState) -> str | None:
        missing = [name for name in names if name not in state]
        return f"uninitialized: {missing}" if missing else None

    return report


def v_initializer(state: TrainState) -> None:
    state["v"] = np.asarray(1.0)


def w_from_v(state: TrainState) -> None:
    """The local variable ``w``, initialized from ``v`` (TF's ``VariableV1(v, ...)``)."""
    state["w"] = np.array(state["v"])


def vadd(state: TrainState) -> dict[str, Any]:
    """TF's ``v.assign_add(1)``: the step returns the new value."""
    state["v"] += 1
    return {"v": state["v"]}


def assert_closed(*sessions: MonitoredSession) -> None:
    for sess in sessions:
        with pytest.raises(RuntimeError, match="the session is closed"):
            sess.run(vadd)


async def get_session(
    state: TrainState, logdir: Path, *, is_chief: bool, init_op: Any = Supervisor.USE_DEFAULT
) -> tuple[Supervisor, MonitoredSession]:
    sv = Supervisor(
        state,
        logdir=logdir,
        is_chief=is_chief,
        recovery_wait_secs=1,
        init_op=init_op,
        local_init_op=w_from_v,
        ready_for_local_init_op=uninitialized(["v"]),
    )
    sess = await sv.prepare_or_wait_for_session()
    return sv, sess


@pytest.mark.parametrize("order", ["as_made", "reversed"])
async def test_SupervisorTest_testReadyForLocalInitOp(tmp_path: Path, order: str) -> None:
    state = TrainState()
    sv0, sess0 = await get_session(state, tmp_path, is_chief=True, init_op=v_initializer)
    sv1, sess1 = await get_session(state, tmp_path, is_chief=False, init_op=v_initializer)

    assert sess0.fetch("w") == 1
    assert (await sess1.run(vadd))["v"] == 2
    assert sess1.fetch("w") == 1
    assert sess0.fetch("v") == 2

    first, second = (sv0, sv1) if order == "as_made" else (sv1, sv0)
    await first.stop()
    await second.stop()
    assert_closed(sess0, sess1)


@pytest.mark.parametrize("order", ["as_made", "reversed"])
async def test_SupervisorTest_testReadyForLocalInitOpRestoreFromCheckpoint(
    tmp_path: Path, order: str
) -> None:
    # Create a checkpoint.
    sv = Supervisor(TrainState({"v": np.asarray(10.0)}), logdir=tmp_path)
    await sv.prepare_or_wait_for_session()
    await sv.stop()

    # v starts at 1.0 in TF's graph; the chief restores 10 over it.
    state = TrainState({"v": np.asarray(1.0)})
    sv0, sess0 = await get_session(state, tmp_path, is_chief=True)
    sv1, sess1 = await get_session(state, tmp_path, is_chief=False)

    assert sess0.fetch("w") == 10
    assert (await sess1.run(vadd))["v"] == 11
    assert sess1.fetch("w") == 10
    assert sess0.fetch("v") == 11

    first, second = (sv0, sv1) if order == "as_made" else (sv1, sv0)
    await first.stop()
    await second.stop()
    assert_closed(sess0, sess1)
