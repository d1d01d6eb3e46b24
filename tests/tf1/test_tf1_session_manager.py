"""TensorFlow's ``session_manager_test.py``, ported to ``monitored.SessionManager``.

TF's variables become state entries: a variable is "initialized" when its entry
is in the :class:`~monitored.TrainState`; ``report_uninitialized_variables()``
becomes a ``ready_fn`` naming the missing entries; init ops and local init ops
become ``init_fn`` and ``local_init_fn``. A :class:`~monitored.TrainState` is
passed where TF passes a master address. The saver is a small NumPy one, so the
core's tests need no plugin.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import monitored
from monitored import Scaffold, SessionManager, TrainState


class NpzSaver:
    """Saves every entry of a state to ``<path>.npz``; restores them all."""

    def save(self, state: TrainState, path: str) -> str:
        np.savez(path, **dict(state))
        return path + ".npz"

    def restore(self, state: TrainState, path: str) -> None:
        with np.load(path) as data:
            for name in data.files:
                state[name] = data[name]

    def latest_checkpoint(self, checkpoint_dir: str) -> str | None:
        found = sorted(Path(checkpoint_dir).glob("*.npz"), key=os.path.getmtime)
        return str(found[-1]) if found else None


def uninitialized(names: Sequence[str]) -> Callable[[TrainState], str | None]:
    """TF's ``report_uninitialized_variables(names)`` as a readiness check."""

    def report(state: TrainState) -> str | None:
        missing = [name for name in names if name not in state]
        return f"uninitialized: {missing}" if missing else None

    return report


def setter(**values: Any) -> Callable[[TrainState], None]:
    def init(state: TrainState) -> None:
        for name, value in values.items():
            state[name] = np.asarray(value(state) if callable(value) else value)

    return init


# --- SessionManagerTest ---------------------------------------------------------------------


async def _prepare_session_succeeds(ready: Any) -> None:
    state = TrainState()
    sm = SessionManager(Scaffold(init_fn=setter(v=[1.0, 2.0, 3.0]), ready_fn=ready(["v"])))
    await sm.prepare_session(state)
    np.testing.assert_allclose(state["v"], [1.0, 2.0, 3.0])


async def test_SessionManagerTest_testPrepareSessionSucceeds() -> None:
    await _prepare_session_succeeds(uninitialized)


async def _prepare_session_succeeds_with_init_feed_dict(ready: Any) -> None:
    # TF feeds a placeholder to the init op; here the init function takes the value.
    def init_fn(state: TrainState, p: list[float]) -> None:
        state["v"] = np.asarray(p)

    state = TrainState()
    sm = SessionManager(
        Scaffold(init_fn=partial(init_fn, p=[1.0, 2.0, 3.0]), ready_fn=ready(["v"]))
    )
    await sm.prepare_session(state)
    np.testing.assert_allclose(state["v"], [1.0, 2.0, 3.0])


async def test_SessionManagerTest_testPrepareSessionSucceedsWithInitFeedDict() -> None:
    await _prepare_session_succeeds_with_init_feed_dict(uninitialized)


async def _prepare_session_succeeds_with_init_fn(ready: Any) -> None:
    state = TrainState()
    sm = SessionManager(Scaffold(init_fn=setter(v=[125]), ready_fn=ready(["v"])))
    await sm.prepare_session(state)
    np.testing.assert_allclose(state["v"], [125])


async def test_SessionManagerTest_testPrepareSessionSucceedsWithInitFn() -> None:
    await _prepare_session_succeeds_with_init_fn(uninitialized)


async def test_SessionManagerTest_testPrepareSessionSucceedsWithLocalInitFeedDict() -> None:
    def local_init_fn(state: TrainState, p: list[float]) -> None:
        state["v"] = np.asarray(p)

    state = TrainState()
    sm = SessionManager(
        Scaffold(
            local_init_fn=partial(local_init_fn, p=[1.0, 2.0, 3.0]), ready_fn=uninitialized(["v"])
        )
    )
    await sm.prepare_session(state)
    np.testing.assert_allclose(state["v"], [1.0, 2.0, 3.0])


async def _prepare_session_fails(tmp_path: Path, ready: Any) -> None:
    checkpoint_dir, checkpoint_dir2 = tmp_path / "prepare_session", tmp_path / "prepare_session2"
    checkpoint_dir.mkdir()
    saver = NpzSaver()
    state = TrainState()
    sm = SessionManager(
        Scaffold(init_fn=setter(v=[1.0, 2.0, 3.0]), ready_fn=ready(["v"])), recovery_wait_secs=0.01
    )
    await sm.prepare_session(state, saver=saver, checkpoint_dir=str(checkpoint_dir))
    np.testing.assert_allclose(state["v"], [1.0, 2.0, 3.0])
    saver.save(state, str(checkpoint_dir / "prepare_session_checkpoint"))
    # A new state and manager: the checkpoint directory is renamed away.
    os.rename(checkpoint_dir, checkpoint_dir2)
    checkpoint_dir.mkdir()
    state = TrainState()
    sm = SessionManager(Scaffold(ready_fn=ready(["v"])), recovery_wait_secs=0.01)
    # No checkpoint appears within max_wait_secs (TF: 2 s).
    with pytest.raises(RuntimeError, match="no init_fn or local_init_fn was given"):
        await sm.prepare_session(
            state,
            saver=saver,
            checkpoint_dir=str(checkpoint_dir),
            wait_for_checkpoint=True,
            max_wait_secs=0.05,
        )
    # With the checkpoint back, it succeeds.
    checkpoint_dir.rmdir()
    os.rename(checkpoint_dir2, checkpoint_dir)
    state = TrainState()
    await sm.prepare_session(
        state,
        saver=saver,
        checkpoint_dir=str(checkpoint_dir),
        wait_for_checkpoint=True,
        max_wait_secs=0.05,
    )
    assert "v" in state


async def test_SessionManagerTest_testPrepareSessionFails(tmp_path: Path) -> None:
    await _prepare_session_fails(tmp_path, uninitialized)


async def _recovered_variable(
    checkpoint_dir: str | None = None, checkpoint_filename_with_path: str | None = None
) -> None:
    state = TrainState()
    assert "v" not in state
    sm2 = SessionManager(Scaffold(ready_fn=uninitialized(["v"])))
    _, initialized = await sm2.recover_session(
        state,
        saver=NpzSaver(),
        checkpoint_dir=checkpoint_dir,
        checkpoint_filename_with_path=checkpoint_filename_with_path,
    )
    assert initialized
    assert state["v"] == 1


async def _recover_session(tmp_path: Path, ready: Any, with_path: bool) -> None:
    checkpoint_dir = str(tmp_path / "recover_session")
    os.makedirs(checkpoint_dir)
    saver = NpzSaver()
    state = TrainState()
    sm = SessionManager(Scaffold(ready_fn=ready(["v"])))
    _, initialized = await sm.recover_session(state, saver=saver, checkpoint_dir=checkpoint_dir)
    assert not initialized
    state["v"] = np.asarray(1)
    assert state["v"] == 1
    saver.save(state, os.path.join(checkpoint_dir, "recover_session_checkpoint"))
    await _recovered_variable(checkpoint_dir=checkpoint_dir)
    if with_path:
        latest = saver.latest_checkpoint(checkpoint_dir)
        await _recovered_variable(checkpoint_filename_with_path=latest)
        # Not both checkpoint_dir and checkpoint_filename_with_path.
        with pytest.raises(ValueError):
            await _recovered_variable(
                checkpoint_dir=checkpoint_dir, checkpoint_filename_with_path=latest
            )


async def test_SessionManagerTest_testRecoverSession(tmp_path: Path) -> None:
    await _recover_session(tmp_path, uninitialized, with_path=True)


async def _wait_for_session_times_out(ready: Any) -> None:
    state = TrainState({"v": np.asarray(1)})  # never marked ready by a chief
    sm = SessionManager(Scaffold(ready_fn=ready(["v"])), recovery_wait_secs=0.01)
    # max_wait_secs allows a few tries (TF: 3 s with 1 s between tries).
    with pytest.raises(monitored.DeadlineExceededError):
        await sm.wait_for_session(state, max_wait_secs=0.05)


async def test_SessionManagerTest_testWaitForSessionReturnsNoneAfterTimeout() -> None:
    await _wait_for_session_times_out(uninitialized)


async def test_SessionManagerTest_testInitWithNoneLocalInitOpError() -> None:
    with pytest.raises(
        ValueError,
        match="If you pass a ready_for_local_init_fn you must also pass a local_init_fn",
    ):
        SessionManager(Scaffold(ready_for_local_init_fn=uninitialized(["v"]), local_init_fn=None))


async def _checkpoint_v_equal_1(checkpoint_dir: str) -> None:
    saver = NpzSaver()
    state = TrainState()
    sm = SessionManager(Scaffold(ready_fn=uninitialized(["v"])))
    _, initialized = await sm.recover_session(state, saver=saver, checkpoint_dir=checkpoint_dir)
    assert not initialized
    state["v"] = np.asarray(1)
    saver.save(state, os.path.join(checkpoint_dir, "recover_session_checkpoint"))


async def test_SessionManagerTest_testRecoverSessionWithReadyForLocalInitOp(
    tmp_path: Path,
) -> None:
    checkpoint_dir = str(tmp_path)
    await _checkpoint_v_equal_1(checkpoint_dir)
    state = TrainState()
    assert "v" not in state
    assert "w" not in state
    sm2 = SessionManager(
        Scaffold(
            ready_fn=uninitialized(["v", "w"]),
            ready_for_local_init_fn=uninitialized(["v"]),
            local_init_fn=setter(w=lambda s: s["v"]),
        )
    )
    _, initialized = await sm2.recover_session(
        state, saver=NpzSaver(), checkpoint_dir=checkpoint_dir
    )
    assert initialized
    assert "v" in state
    assert "w" in state
    assert state["v"] == 1
    assert state["w"] == 1


async def test_SessionManagerTest_testRecoverSessionWithReadyForLocalInitOpFailsToReadyLocal(
    tmp_path: Path,
) -> None:
    # ready_for_local_init_fn reports every entry, w included: local_init_fn never
    # runs and recover_session says the state is not ready.
    checkpoint_dir = str(tmp_path)
    await _checkpoint_v_equal_1(checkpoint_dir)
    state = TrainState()
    sm2 = SessionManager(
        Scaffold(
            ready_fn=uninitialized(["v", "w"]),
            ready_for_local_init_fn=uninitialized(["v", "w"]),
            local_init_fn=setter(w=lambda s: s["v"]),
        )
    )
    _, initialized = await sm2.recover_session(
        state, saver=NpzSaver(), checkpoint_dir=checkpoint_dir
    )
    assert not initialized
    assert "v" in state
    assert "w" not in state
    assert state["v"] == 1


async def test_SessionManagerTest_testRecoverSessionNoChkptStillRunsLocalInitOp() -> None:
    state = TrainState()
    assert "w" not in state
    sm2 = SessionManager(
        Scaffold(
            ready_fn=uninitialized(["w"]), ready_for_local_init_fn=None, local_init_fn=setter(w=1)
        )
    )
    # Nothing to recover from: recover_session still runs local_init_fn.
    _, initialized = await sm2.recover_session(state, saver=None, checkpoint_dir=None)
    assert not initialized
    assert "w" in state
    assert state["w"] == 1


async def test_SessionManagerTest_testRecoverSessionFailsStillRunsLocalInitOp(
    tmp_path: Path,
) -> None:
    checkpoint_dir = str(tmp_path / "empty")
    os.makedirs(checkpoint_dir)
    state = TrainState()
    sm2 = SessionManager(
        Scaffold(
            ready_fn=uninitialized(["v", "w"]),
            ready_for_local_init_fn=None,
            local_init_fn=setter(w=1),
        )
    )
    _, initialized = await sm2.recover_session(
        state, saver=NpzSaver(), checkpoint_dir=checkpoint_dir, wait_for_checkpoint=False
    )
    assert not initialized
    assert "v" not in state
    assert "w" in state
    assert state["w"] == 1


def _chief_initialized_v() -> TrainState:
    """A state whose chief initialized ``v`` (TF: another session ran v.initializer)."""
    state = TrainState({"v": np.asarray(1)})
    state.initialized = True
    return state


async def test_SessionManagerTest_testWaitForSessionLocalInit() -> None:
    state = _chief_initialized_v()
    sm = SessionManager(
        Scaffold(
            ready_fn=uninitialized(["v", "w"]),
            ready_for_local_init_fn=uninitialized(["v"]),
            local_init_fn=setter(w=lambda s: s["v"]),
        ),
        recovery_wait_secs=0.01,
    )
    await sm.wait_for_session(state, max_wait_secs=0.05)
    assert "v" in state
    assert "w" in state
    assert state["v"] == 1
    assert state["w"] == 1


async def test_SessionManagerTest_testWaitForSessionWithReadyForLocalInitOpFailsToReadyLocal() -> (
    None
):
    state = _chief_initialized_v()
    sm = SessionManager(
        Scaffold(
            ready_fn=uninitialized(["v", "w"]),
            ready_for_local_init_fn=uninitialized(["v", "w"]),
            local_init_fn=setter(w=lambda s: s["v"]),
        ),
        recovery_wait_secs=0.01,
    )
    # Times out: the overly strict ready_for_local_init_fn never lets w be set.
    with pytest.raises(monitored.DeadlineExceededError):
        await sm.wait_for_session(state, max_wait_secs=0.05)


async def test_SessionManagerTest_testWaitForSessionInsufficientReadyForLocalInitCheck() -> None:
    state = TrainState()  # v is never initialized
    sm = SessionManager(
        Scaffold(
            ready_fn=uninitialized(["v", "w"]),
            ready_for_local_init_fn=None,
            local_init_fn=setter(w=1),
        ),
        recovery_wait_secs=0.01,
    )
    with pytest.raises(
        monitored.DeadlineExceededError, match="Session was not ready after waiting"
    ):
        await sm.wait_for_session(state, max_wait_secs=0.05)


async def test_SessionManagerTest_testPrepareSessionWithReadyForLocalInitOp() -> None:
    state = TrainState()
    assert not {"v", "w", "x"} & set(state)
    sm2 = SessionManager(
        Scaffold(
            init_fn=setter(v=1),
            ready_fn=uninitialized(["v", "w", "x"]),
            ready_for_local_init_fn=uninitialized(["v"]),
            local_init_fn=setter(w=lambda s: s["v"], x=lambda s: 3 * s["v"]),
        )
    )
    await sm2.prepare_session(state)
    assert {"v", "w", "x"} <= set(state)
    assert (state["v"], state["w"], state["x"]) == (1, 1, 3)


async def test_SessionManagerTest_testPrepareSessionWithPartialInitOp() -> None:
    # w and x take their values from v's initial value (1), not from v itself.
    state = TrainState()
    sm2 = SessionManager(Scaffold(local_init_fn=setter(w=1, x=3, w_res=1, x_res=3)))
    await sm2.prepare_session(state)
    assert "v" not in state
    assert "v_res" not in state
    assert (state["w"], state["x"]) == (1, 3)
    assert (state["w_res"], state["x_res"]) == (1, 3)


async def _did_not_init_local_variable(init_fn: Any) -> None:
    state = TrainState()
    sm2 = SessionManager(Scaffold(init_fn=init_fn, ready_fn=uninitialized(["v", "w"])))
    with pytest.raises(RuntimeError, match="Init operations did not make model ready.*"):
        await sm2.prepare_session(state)


async def test_SessionManagerTest_testPrepareSessionDidNotInitLocalVariable() -> None:
    await _did_not_init_local_variable(setter(v=1))


async def test_SessionManagerTest_testPrepareSessionDidNotInitLocalVariableList() -> None:
    # TF passes the init op in a list; the port runs a list of init functions.
    inits = [setter(v=1)]

    def init_fn(state: TrainState) -> None:
        for init in inits:
            init(state)

    await _did_not_init_local_variable(init_fn)


async def test_SessionManagerTest_testPrepareSessionWithReadyNotReadyForLocal() -> None:
    state = TrainState()
    sm2 = SessionManager(
        Scaffold(
            ready_fn=uninitialized(["v", "w"]),
            ready_for_local_init_fn=uninitialized(["v"]),
            local_init_fn=setter(w=lambda s: s["v"]),
        )
    )
    with pytest.raises(
        RuntimeError, match="Init operations did not make model ready for local_init"
    ):
        await sm2.prepare_session(state)


async def test_SessionManagerTest_testPrepareSessionWithInsufficientReadyForLocalInitCheck() -> (
    None
):
    state = TrainState()
    sm2 = SessionManager(
        Scaffold(
            ready_fn=uninitialized(["v", "w"]),
            ready_for_local_init_fn=None,
            local_init_fn=setter(w=1),
        )
    )
    with pytest.raises(RuntimeError, match="Init operations did not make model ready.*"):
        await sm2.prepare_session(state)


# --- ObsoleteSessionManagerTest ---------------------------------------------------------------
# TF's obsolete variants use assert_variables_initialized() as the ready op: a check
# that fails instead of listing names. Here readiness has one convention (a message
# or None), so the scenarios run with a ready_fn that names only the first missing entry.


def asserting(names: Sequence[str]) -> Callable[[TrainState], str | None]:
    def check(state: TrainState) -> str | None:
        for name in names:
            if name not in state:
                return f"Attempting to use uninitialized value {name}"
        return None

    return check


async def test_ObsoleteSessionManagerTest_testPrepareSessionSucceeds() -> None:
    await _prepare_session_succeeds(asserting)


async def test_ObsoleteSessionManagerTest_testPrepareSessionSucceedsWithInitFeedDict() -> None:
    await _prepare_session_succeeds_with_init_feed_dict(asserting)


async def test_ObsoleteSessionManagerTest_testPrepareSessionSucceedsWithInitFn() -> None:
    await _prepare_session_succeeds_with_init_fn(asserting)


async def test_ObsoleteSessionManagerTest_testPrepareSessionFails(tmp_path: Path) -> None:
    await _prepare_session_fails(tmp_path, asserting)


async def test_ObsoleteSessionManagerTest_testRecoverSession(tmp_path: Path) -> None:
    await _recover_session(tmp_path, asserting, with_path=False)


async def test_ObsoleteSessionManagerTest_testWaitForSessionReturnsNoneAfterTimeout() -> None:
    await _wait_for_session_times_out(asserting)
