"""Many sessions in one event loop: each ends bit for bit as it would alone, sharing nothing.

Eight ``MonitoredTrainingSession``s run at once in one task group, each with its
own checkpoint and summary directory, the installed checkpoint and summaries
plugins, an early-stopping hook and the NaN guard: they checkpoint, write
summaries, stop at step 6 (as a preemption would), resume from their
checkpoints at once again and stop early, each at its own step. Every one ends
with the arrays, step, RNG state, checkpoints and event-file values it has when
run alone, and no hook, plugin state, writer or signal watcher belongs to two
sessions. One session failing ends that session only, or the whole group, as
the caller's task group decides (docs/guide.md shows both).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import pytest

import monitored

pytestmark = pytest.mark.anyio

N = 8


@pytest.fixture(autouse=True)
def plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.setenv("MONITORED_DISABLE_PLUGINS", "progress,optuna")
    monkeypatch.delenv("MONITORED_PLUGIN_OPTIONS", raising=False)


def make_step(i: int) -> Any:
    """Session ``i``'s step: noisy updates from the state's RNG; its loss bottoms out at 8 + i."""
    import monitored_summaries

    def step(state: monitored.TrainState) -> dict[str, Any]:
        state["w"] -= 0.01 * state.rng.normal(size=state["w"].shape).astype(np.float32)
        state.global_step += 1
        loss = np.float32(abs(8 + i - state.global_step) + float(state["w"].sum()) * 1e-3)
        monitored_summaries.scalar("loss", loss)
        return {"loss": loss}

    return step


def new_state(i: int) -> monitored.TrainState:
    return monitored.TrainState({"w": np.full(16, float(i), np.float32)}, seed=100 + i)


async def train(i: int, directory: Path, last_step: int, seen: dict[int, Any]) -> Any:
    """One session of run ``i`` up to ``last_step`` (or its early stop)."""
    from monitored_early_stopping import EarlyStoppingHook

    state = new_state(i)
    session = monitored.MonitoredTrainingSession(
        state,
        checkpoint_dir=str(directory),
        save_checkpoint_steps=3,
        save_summaries_steps=1,
        log_step_count_steps=None,
        hooks=[
            EarlyStoppingHook("loss", patience=2),
            monitored.StopAtStepHook(last_step=last_step),
        ],
    )
    step = make_step(i)
    async with session:
        seen[i] = list(session.plugins)
        while not session.should_stop():
            await session.run(step)
            await anyio.lowlevel.checkpoint()  # let the other sessions' steps in between
    return state


async def two_phases(i: int, directory: Path, seen: dict[int, Any]) -> monitored.TrainState:
    await train(i, directory, 6, {})
    return await train(i, directory, 40, seen)


def event_values(directory: Path) -> list[tuple[int, str, float]]:
    from monitored_summaries import summary_iterator

    found = []
    for path in sorted(directory.glob("events.out.tfevents.*")):
        for event in summary_iterator(str(path)):
            for value in event.summary.value:
                found.append((event.step, value.tag, value.simple_value))
    return found


def checkpoints(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("model.ckpt-"))


async def test_eight_sessions_at_once_end_bit_for_bit_as_each_alone(tmp_path: Path) -> None:
    alone = {}
    for i in range(N):
        alone[i] = await two_phases(i, tmp_path / "alone" / str(i), {})

    together: dict[int, monitored.TrainState] = {}
    seen: dict[int, Any] = {}

    async def run(i: int) -> None:
        together[i] = await two_phases(i, tmp_path / "together" / str(i), seen)

    async with anyio.create_task_group() as group:
        for i in range(N):
            group.start_soon(run, i)

    stops = sorted({alone[i].global_step for i in range(N)})
    assert len(stops) == N, f"each session stopped early at its own step: {stops}"
    for i in range(N):
        a, b = alone[i], together[i]
        assert b.global_step == a.global_step < 40
        for name in a:
            np.testing.assert_array_equal(b[name], a[name], err_msg=f"session {i}: {name}")
        np.testing.assert_equal(b.rng_state, a.rng_state)
        here, there = tmp_path / "alone" / str(i), tmp_path / "together" / str(i)
        assert checkpoints(there) == checkpoints(here)
        assert event_values(there) == event_values(here), f"session {i}'s summaries"

    # Nothing belongs to two sessions: hooks, plugin hooks, writers, savers, watchers.
    owners: dict[int, int] = {}
    for i, infos in seen.items():
        for info in infos:
            objects = [info.plugin]
            for attribute in ("_writer", "saver", "_signals"):
                value = getattr(info.plugin, attribute, None)
                if value is not None:
                    objects.append(value)
            for obj in objects:
                if isinstance(obj, type(monitored)):  # a plugin module: its hooks are per session
                    continue
                assert owners.setdefault(id(obj), i) == i, f"{obj!r} shared by sessions"
    assert len({id(info.plugin) for infos in seen.values() for info in infos}) > N


async def test_one_session_failing_ends_that_session_only_when_the_caller_says_so(
    tmp_path: Path,
) -> None:
    ended: dict[int, int | str] = {}

    def failing(state: monitored.TrainState) -> dict[str, Any]:
        state.global_step += 1
        if state.global_step == 3:
            raise RuntimeError("session 0 broke")
        return {"loss": np.float32(1.0)}

    async def run(i: int) -> None:
        step = failing if i == 0 else make_step(i)
        state = new_state(i)
        try:
            async with monitored.MonitoredTrainingSession(
                state,
                checkpoint_dir=str(tmp_path / str(i)),
                save_checkpoint_steps=5,
                log_step_count_steps=None,
                hooks=[monitored.StopAtStepHook(last_step=10)],
            ) as session:
                while not session.should_stop():
                    await session.run(step)
                    await anyio.lowlevel.checkpoint()
        except RuntimeError as exc:  # this session's failure, handled here: the others go on
            ended[i] = str(exc)
            return
        ended[i] = state.global_step

    async with anyio.create_task_group() as group:
        for i in range(4):
            group.start_soon(run, i)
    assert ended == {0: "session 0 broke", 1: 10, 2: 10, 3: 10}
    # It failed between saves: its checkpoints are the one at creation, none half-written.
    assert checkpoints(tmp_path / "0") == ["model.ckpt-0.json", "model.ckpt-0.safetensors"]
    assert "model.ckpt-10.json" in checkpoints(tmp_path / "1")

    # Without the try/except, the task group cancels the others and raises the failure.
    async def unguarded(i: int) -> None:
        step = failing if i == 0 else make_step(i)
        async with monitored.MonitoredSession(new_state(i)) as session:
            for _ in range(1000):
                await session.run(step)
                await anyio.sleep(0.001)

    with pytest.raises(ExceptionGroup) as caught:
        async with anyio.create_task_group() as group:
            for i in range(3):
                group.start_soon(unguarded, i)
    assert caught.group_contains(RuntimeError, match="session 0 broke")


CHILD = textwrap.dedent(
    """
    import os, sys
    import anyio
    import numpy as np
    import monitored

    def step(state):
        state["w"] += 1.0
        state.global_step += 1
        return {"loss": np.float32(1.0)}

    async def run(i, root):
        state = monitored.TrainState({"w": np.zeros(4, np.float32)})
        async with monitored.MonitoredTrainingSession(
            state, checkpoint_dir=os.path.join(root, str(i)), save_checkpoint_steps=10**6,
            log_step_count_steps=None,
        ) as session:
            while not session.should_stop():
                await session.run(step)
                await anyio.sleep(0.002)
                if i == 0 and state.global_step == 20:
                    print("ready", flush=True)
            if i == 1 and sys.argv[2:] == ["slow"]:
                await anyio.sleep(30)  # still open when the second Ctrl-C comes
        print("stopped", i, state.global_step, flush=True)

    async def main():
        async with anyio.create_task_group() as group:
            for i in range(4):
                group.start_soon(run, i, sys.argv[1])

    anyio.run(main)
    print("all saved", flush=True)
    """
)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_every_session_each_saving_its_checkpoint(
    tmp_path: Path, signum: int
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONITORED_")}
    env["MONITORED_DISABLE_PLUGINS"] = "progress,optuna,summaries"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    child.send_signal(signum)
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    lines = out.splitlines()
    assert lines[-1] == "all saved"
    stopped = {
        int(line.split()[1]): int(line.split()[2]) for line in lines if line.startswith("stopped")
    }
    assert sorted(stopped) == [0, 1, 2, 3]
    for i, step in stopped.items():
        assert f"model.ckpt-{step}.json" in checkpoints(tmp_path / str(i)), f"session {i}"
    # One notice for the process, then each session says which step it saves.
    assert err.count("received; finishing the current step") == 1, err
    assert err.count("saving a checkpoint of step") == 4, err


def test_a_second_ctrl_c_still_ends_the_process(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONITORED_")}
    env["MONITORED_DISABLE_PLUGINS"] = "progress,optuna,summaries"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path), "slow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    child.send_signal(signal.SIGINT)
    assert child.stdout.readline().startswith("stopped")  # the first stop is under way
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=20)
    assert child.returncode != 0
    assert "all saved" not in out
    assert "KeyboardInterrupt" in err
