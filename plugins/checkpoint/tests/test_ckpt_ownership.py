"""One run, one writer: real training processes on one checkpoint directory.

Two trainers started together, a second session in the same loop, a trainer
SIGKILLed and its successor taking over, a trainer SIGSTOPped past its lease and
resumed after a takeover (it must fail to commit, not overwrite the new owner).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import anyio.lowlevel
import numpy as np
import pytest

from monitored import (
    MonitoredSession,
    RunOwnedError,
    Scaffold,
    TrainState,
)
from monitored_checkpoint import CheckpointSaverHook, restore_latest

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="POSIX signals")

#: Rounds of each race (each round starts two or three real processes).
RACE_ROUNDS = int(os.environ.get("MONITORED_OWNERSHIP_ROUNDS", "8"))
TAKEOVER_ROUNDS = max(2, RACE_ROUNDS // 2)

#: A trainer: ``python -c TRAINER DIR WHO [STEP_SLEEP [LIMIT]]``. Saves every step, prints ``started
#: <restored step>`` then ``step N`` lines, ``waiting`` after ``LIMIT`` steps; a line
#: on stdin ends it. Exit 3 on RunOwnedError, 4 on a write refused by fencing
#: (caused by RunOwnershipLostError); the error on stderr.
TRAINER = textwrap.dedent(
    """
    import sys, time
    import anyio, numpy as np
    import monitored
    from monitored import MonitoredSession, Scaffold, TrainState
    from monitored_checkpoint import CheckpointSaverHook, Saver

    directory, who = sys.argv[1], int(sys.argv[2])
    pause = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
    limit = int(sys.argv[4]) if len(sys.argv) > 4 else 10**9

    def init(state):
        state["w"] = np.zeros(4)
        state["who"] = np.zeros((), dtype=np.int64)

    def step(state):
        state["w"] += 1.0
        state["who"][...] = who
        state.global_step += 1

    async def main():
        state = TrainState(seed=1)
        hook = CheckpointSaverHook(
            directory, save_steps=1, saver=Saver(max_to_keep=2), handle_signals=False
        )
        async with MonitoredSession(state, hooks=[hook], scaffold=Scaffold(init_fn=init)) as s:
            print("started", state.global_step, flush=True)
            n = 0
            while n < limit:
                await s.run(step)
                n += 1
                print("step", state.global_step, flush=True)
                if pause:
                    time.sleep(pause)
            print("waiting", flush=True)
            await anyio.to_thread.run_sync(sys.stdin.readline)

    try:
        anyio.run(main)
    except monitored.RunOwnedError as exc:
        print("REFUSED", exc, file=sys.stderr, flush=True)
        sys.exit(3)
    except Exception as exc:
        # A background write that failed its fencing check: CheckpointWriteError,
        # caused by RunOwnershipLostError.
        if isinstance(exc.__cause__, monitored.RunOwnershipLostError):
            print("LOST", exc, file=sys.stderr, flush=True)
            sys.exit(4)
        raise
    """
)


_PROCS: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def _reap() -> Iterator[None]:
    """Every trainer started is killed if still running, and its pipes closed."""
    yield
    while _PROCS:
        proc = _PROCS.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def _start(
    directory: Path, who: int, *extra: str, lease: float | None = None
) -> subprocess.Popen[str]:
    env = dict(os.environ)
    if lease is not None:
        env["MONITORED_RUN_LEASE_SECS"] = str(lease)
    env.pop("MONITORED_PLUGIN_OPTIONS", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", TRAINER, str(directory), str(who), *extra],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    _PROCS.append(proc)
    return proc


def _read_until(proc: subprocess.Popen[str], prefix: str, deadline: float = 180.0) -> str:
    """The first stdout line of ``proc`` starting with ``prefix`` (fails if it exits first)."""
    assert proc.stdout is not None
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        line = proc.stdout.readline()
        if not line:
            err = proc.stderr.read() if proc.stderr is not None else ""
            pytest.fail(f"trainer exited ({proc.wait()}) before {prefix!r}: {err}")
        if line.startswith(prefix):
            return line
    pytest.fail(f"no {prefix!r} line within {deadline}s")


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    _out, err = proc.communicate("go\n", timeout=180)
    return proc.returncode, err


def _restored(directory: Path) -> TrainState:
    state = TrainState()
    state["w"] = np.zeros(4)
    state["who"] = np.zeros((), dtype=np.int64)
    state.finalize()
    restore_latest(state, str(directory))
    return state


def test_two_trainers_started_together_one_is_refused(tmp_path: Path) -> None:
    for round_ in range(RACE_ROUNDS):
        directory = tmp_path / f"run{round_}"
        first, second = _start(directory, 1, "0", "3"), _start(directory, 2, "0", "3")
        procs = {1: first, 2: second}
        # The refused one exits 3 before training; the owner trains 3 steps and waits.
        refused = None
        end = time.monotonic() + 180
        while refused is None and time.monotonic() < end:
            for who, proc in procs.items():
                if proc.poll() is not None:
                    refused = who
            time.sleep(0.05)
        assert refused is not None, "neither trainer was refused"
        loser, owner = procs[refused], procs[3 - refused]
        err = loser.stderr.read() if loser.stderr is not None else ""
        out = loser.stdout.read() if loser.stdout is not None else ""
        assert loser.returncode == 3, err
        assert "started" not in out  # refused before it restored anything
        assert str(directory) in err
        assert f"process {owner.pid}" in err
        _read_until(owner, "waiting")
        code, err = _finish(owner)
        assert code == 0, err
        state = _restored(directory)
        assert state.global_step == 3
        assert int(state["who"]) == 3 - refused
        np.testing.assert_array_equal(state["w"], np.full(4, 3.0))


async def _train(directory: Path, steps: int) -> TrainState:
    def init(state: TrainState) -> None:
        state["w"] = np.zeros(2)

    def step(state: TrainState) -> None:
        state["w"] += 1
        state.global_step += 1

    state = TrainState()
    hook = CheckpointSaverHook(directory, save_steps=1, handle_signals=False)
    async with MonitoredSession(state, hooks=[hook], scaffold=Scaffold(init_fn=init)) as sess:
        for _ in range(steps):
            await sess.run(step)
            await anyio.lowlevel.checkpoint()
    return state


@pytest.mark.anyio
async def test_two_sessions_in_one_loop_on_one_directory(tmp_path: Path) -> None:
    directory = tmp_path / "run"
    errors: list[BaseException] = []

    async def second() -> None:
        try:
            await _train(directory, 3)
        except RunOwnedError as exc:
            errors.append(exc)

    started = anyio.Event()

    async def first() -> None:
        def init(state: TrainState) -> None:
            state["w"] = np.zeros(2)

        state = TrainState()
        hook = CheckpointSaverHook(directory, save_steps=1, handle_signals=False)
        async with MonitoredSession(state, hooks=[hook], scaffold=Scaffold(init_fn=init)) as s:
            started.set()
            for _ in range(5):
                await s.run(lambda st: setattr(st, "global_step", st.global_step + 1))
                await anyio.sleep(0.01)

    async with anyio.create_task_group() as tg:
        tg.start_soon(first)
        await started.wait()
        tg.start_soon(second)
    assert len(errors) == 1
    assert "already owned by another session of this process" in str(errors[0])
    assert errors[0].directory == str(directory)
    # Once the first session closed, the directory is free again: a resume works.
    state = await _train(directory, 1)
    assert state.global_step == 6


def test_killed_trainer_is_taken_over_by_its_successor(tmp_path: Path) -> None:
    for round_ in range(TAKEOVER_ROUNDS):
        directory = tmp_path / f"run{round_}"
        first = _start(directory, 1, "0.02")
        _read_until(first, "step 5")
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
        second = _start(directory, 2, "0", "2")
        line = _read_until(second, "started")
        resumed = int(line.split()[1])
        assert resumed >= 4  # its predecessor's newest checkpoint
        code, err = _finish(second)
        assert code == 0, err
        assert "taking over the run directory" in err
        assert f"process {first.pid} is gone" in err
        state = _restored(directory)
        assert int(state["who"]) == 2
        assert state.global_step == resumed + 2


def test_paused_writer_resumed_after_a_takeover_cannot_commit(tmp_path: Path) -> None:
    lease = 1.0
    for round_ in range(TAKEOVER_ROUNDS):
        directory = tmp_path / f"run{round_}"
        paused = _start(directory, 1, "0.02", lease=lease)
        _read_until(paused, "step 3")
        paused.send_signal(signal.SIGSTOP)
        try:
            time.sleep(lease * 2.5)
            successor = _start(directory, 2, "0", "3", lease=lease)
            line = _read_until(successor, "started")
            resumed = int(line.split()[1])
            _read_until(successor, "waiting")
        finally:
            paused.send_signal(signal.SIGCONT)
        # The paused writer wakes up, trains on and tries to commit: refused.
        _out, err = paused.communicate("go\n", timeout=180)
        assert paused.returncode == 4, err
        assert "no longer owns the run directory" in err
        assert f"process {successor.pid}" in err
        code, err2 = _finish(successor)
        assert code == 0, err2
        assert "its lease was not renewed" in err2
        state = _restored(directory)
        assert int(state["who"]) == 2  # the new owner's checkpoint, not overwritten
        assert state.global_step == resumed + 3
