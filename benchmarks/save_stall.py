"""How long one checkpoint save blocks the step loop with the default install (issue 33).

A ``MonitoredTrainingSession(checkpoint_dir=...)`` with every installed plugin
on (checkpoint, summaries, and whatever else is installed: NaN guard, progress,
early stopping, MLflow without a tracking URI stays off), a state of ``SIZE`` MB
of float32 in four arrays and a trivial step (the global step plus one), saving
every ``--every`` steps. Before the step that precedes each save step, the
script waits (outside the timing) for the previous write to finish, so what is
timed is what the save itself makes the loop wait for (the snapshot, and before
issue 33 the whole durable write when a plugin implemented ``after_save``).

The **stall** of a save is the wall time of its step minus the median of the
steps without a save. The **floor** is ``np.copyto`` of the same arrays into
host buffers already touched, timed right before or right after each save
(alternately: whichever runs second reads the state from a warm cache), in
the same process. The **first** save is the first periodic save of a *resumed*
session (a checkpoint exists, so none is written at creation): the one that
used to allocate the snapshot buffers in the loop (the script keeps the CPU busy
for 0.2 s five steps before it, as ten steps of 20 ms would: the trivial steps
here take microseconds, less than the thread that prepares the buffers needs);
its ratio is the median of ``--first`` resumed sessions.

The previous write's ``after_save`` listeners (the summaries plugin's
``SessionLog.CHECKPOINT``) hear of it at the first step boundary after the write
finished: in training, a step between two saves. Waiting for the write right
before the save step (``--deliver-in-save-step``, how the figures before
2026-11-28 were taken) puts that delivery, and the event-file thread it wakes,
into the save's step; by default it lands on the step before, whose extra time
over a plain step is reported on its own (**delivery**). Waiting idle (a
blocking ``wait`` or a ``sleep``) also leaves the CPU cold for the next step,
which a training loop, busy between saves, does not: the first save's wait
spins instead, and the write's wait is a step away from the save.

Usage::

    python benchmarks/save_stall.py [--sizes 1 64 512] [--saves 9] [--every 10]
        [--first 3] [--deliver-in-save-step]
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np

import monitored
from monitored_checkpoint import CheckpointSaverHook


def _step(state: monitored.TrainState) -> None:
    state.global_step += 1


def _hook_of(sess: monitored.MonitoredSession) -> CheckpointSaverHook:
    for info in sess.plugins:
        if isinstance(info.plugin, CheckpointSaverHook):
            return info.plugin
    raise RuntimeError("no CheckpointSaverHook in the session")


def _floor(buffers: list[np.ndarray], arrays: list[np.ndarray]) -> float:
    started = time.perf_counter()
    for dst, src in zip(buffers, arrays, strict=True):
        np.copyto(dst, src)
    return time.perf_counter() - started


def _spin(seconds: float) -> None:
    """Keep the CPU busy for ``seconds``, as training steps would (a sleep lets it cool)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


async def _session(
    directory: Path, arrays: dict[str, np.ndarray], saves: int, every: int, late: bool
) -> tuple[list[float], list[float], list[float], list[float]]:
    """(stalls, floors, plain step times, delivery step times) of one session of ``saves`` saves.

    ``late``: wait for the previous write right before the save step, so that
    its ``after_save`` delivery happens in the save's step.
    """
    state = monitored.TrainState({n: a.copy() for n, a in arrays.items()})
    buffers = [np.empty_like(a) for a in arrays.values()]
    for b in buffers:
        b.fill(1.0)
    stalls: list[float] = []
    floors: list[float] = []
    plain: list[float] = []
    delivering: list[float] = []
    async with monitored.MonitoredTrainingSession(
        state=state,
        checkpoint_dir=str(directory),
        save_checkpoint_steps=every,
        save_checkpoint_secs=None,
        # Installed and listening to saves, writing on other steps than the saves'.
        save_summaries_steps=every * 100 + 1,
        save_summaries_secs=None,
        log_step_count_steps=None,
        blocked_loop_warning_secs=None,  # the script blocks the loop between saves
    ) as sess:
        hook = _hook_of(sess)
        start = sess.state.global_step
        last = start + every * saves
        first = True
        while sess.state.global_step < last:
            saving = (sess.state.global_step + 1) % every == 0
            # The step before a save delivers the previous write (unless `late`).
            delivery = not late and (sess.state.global_step + 2) % every == 0
            if (saving and late) or delivery:
                write = hook.last_write
                if write is not None:
                    write.done.wait()
                else:
                    delivery = False
            if first and (sess.state.global_step + 5) % every == 0:
                # Ten trivial steps take microseconds; ten real ones, more than
                # the thread that prepares the buffers needs. A few steps follow,
                # so the save's step finds the loop as warm as a training's.
                _spin(0.2)
                first = False
            floor_first = saving and len(stalls) % 2 == 0
            if floor_first:
                floors.append(_floor(buffers, list(state.values())))
            began = time.perf_counter()
            await sess.run(_step)
            took = time.perf_counter() - began
            if saving:
                stalls.append(took)
                if not floor_first:
                    floors.append(_floor(buffers, list(state.values())))
            elif delivery:
                delivering.append(took)
            else:
                plain.append(took)
    base = statistics.median(plain)
    return [s - base for s in stalls], floors, plain, [d - base for d in delivering]


def bench(
    size_mb: float, saves: int, every: int, root: Path, late: bool, resumed: int = 3
) -> dict[str, Any]:
    count = 4
    per = int(size_mb * (1 << 20)) // 4 // count
    rng = np.random.default_rng(0)
    arrays = {f"layer{i}": rng.random(per, dtype=np.float32) for i in range(count)}
    directory = root / f"run-{size_mb:g}"
    stalls, floors, _, delivering = anyio.run(_session, directory, arrays, saves, every, late)
    # Resumed: the first periodic save is the first snapshot of the session.
    firsts = []
    for _ in range(resumed):
        first, first_floor, _, _ = anyio.run(_session, directory, arrays, 1, every, late)
        firsts.append(first[0] / first_floor[0])
    shutil.rmtree(directory, ignore_errors=True)
    return {
        "stall": statistics.median(stalls),
        "floor": statistics.median(floors),
        "ratios": [s / f for s, f in zip(stalls, floors, strict=True)],
        "first": statistics.median(firsts),
        "delivery": statistics.median(delivering) if delivering else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[1, 64, 512])
    parser.add_argument("--saves", type=int, default=9)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--first", type=int, default=3, help="resumed sessions (first saves)")
    parser.add_argument(
        "--deliver-in-save-step",
        action="store_true",
        help="wait for the previous write right before the save step (the figures before "
        "2026-11-28): its after_save delivery then falls in the save's step",
    )
    args = parser.parse_args()
    os.environ.setdefault("MONITORED_PROGRESS", "0")
    print(f"Command: {shlex.join([Path(sys.executable).name, *sys.argv])}")
    print(
        f"Machine: {os.cpu_count()} cores, {platform.machine()}, Python "
        f"{platform.python_version()}, NumPy {np.__version__}; load {os.getloadavg()[0]:.1f}"
    )
    print()
    print(
        "| state | stall (median) | np.copyto floor | stall / floor (median, range) "
        "| first save / floor | delivery step, over a plain step |"
    )
    print("|--:|--:|--:|--:|--:|--:|")
    root = Path(tempfile.mkdtemp(prefix="monitored-stall-", dir=args.dir))
    try:
        for size in args.sizes:
            r = bench(size, args.saves, args.every, root, args.deliver_in_save_step, args.first)
            ratios = r["ratios"]
            delivery = "-" if r["delivery"] is None else f"{r['delivery'] * 1e3:.2f} ms"
            print(
                f"| {size:g} MB | {r['stall'] * 1e3:.2f} ms | {r['floor'] * 1e3:.2f} ms | "
                f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) | "
                f"{r['first']:.2f}x | {delivery} |",
                flush=True,
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
