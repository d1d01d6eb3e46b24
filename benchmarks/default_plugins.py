"""Throughput of a 1 ms NumPy step with the nan-guard, early-stopping and progress plugins.

Compares, in one process and in alternating blocks (so a slow spell of a shared
machine hits all alike):

* a **bare loop** calling the step function;
* ``MonitoredSession`` with installed plugins off (``disable_plugins``);
* ``MonitoredSession`` with ``nan_guard``, ``early_stopping`` and ``progress``
  installed, at their defaults (the NaN guard reads the NumPy ``loss`` in
  ``after_run``, without a fetch; early stopping is off until configured, and
  then called at no step; progress prints plain lines every 30 s without a
  terminal). The per-step cost of every installed plugin with nothing due,
  over the core alone, is the default install row of ``benchmarks/overhead.py``.

The step does about 1 ms of NumPy work (calibrated at start), increments the
global step and returns a ``loss``. The figure of merit is throughput relative
to the bare loop (target: >= 98 % with the three plugins).

With ``--attribute`` it measures instead what each installed plugin costs per
step when nothing is due: sessions on a trivial step (the global step and a
NumPy ``loss``, or no ``loss`` with ``--no-loss``) with every installed plugin,
with each plugin alone, and with none, run in one process in rotating blocks,
timed with the thread's CPU time (steady on a busy machine); the table gives
each over the session without plugins.

Usage (one BLAS thread, so the machine's threads do not add noise)::

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python benchmarks/default_plugins.py [--repeats R]
    python benchmarks/default_plugins.py --attribute [--no-loss]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import anyio
import numpy as np

import monitored

OTHERS = ["checkpoint", "summaries"]


def make_step(target_secs: float) -> Callable[[monitored.TrainState], dict[str, Any]]:
    """A step of about ``target_secs`` of NumPy work (a few small matrix products)."""
    a = np.random.default_rng(0).standard_normal((96, 96)).astype(np.float32)

    def work(n: int) -> np.float32:
        x = a
        for _ in range(n):
            x = np.tanh(x @ a * 0.01)
        return np.float32(x[0, 0])

    n = 1
    while True:
        started = time.perf_counter()
        for _ in range(20):
            work(n)
        if (time.perf_counter() - started) / 20 >= target_secs:
            break
        n += 1

    def step(state: monitored.TrainState) -> dict[str, Any]:
        loss = work(n)
        state.global_step += 1
        return {"loss": loss}

    return step


async def bare(step: Any, state: monitored.TrainState, steps: int) -> float:
    started = time.perf_counter()
    for _ in range(steps):
        step(state)
    return time.perf_counter() - started


async def session_block(sess: monitored.MonitoredSession, step: Any, steps: int) -> float:
    started = time.perf_counter()
    for _ in range(steps):
        if sess.should_stop():
            break
        await sess.run(step)
    return time.perf_counter() - started


async def main(steps: int, repeats: int, block: int) -> None:
    os.environ.pop("MONITORED_DISABLE_PLUGIN_AUTOLOAD", None)
    os.environ.pop("MONITORED_PROGRESS", None)
    installed = {info.name for info in monitored.installed_plugins(())}
    off = sorted(installed & set(OTHERS))
    step = make_step(1e-3)
    times: dict[str, list[float]] = {
        "bare loop": [],
        "session, plugins off": [],
        "session, 3 plugins": [],
    }
    for _ in range(repeats):
        state_a, state_b, state_c = (monitored.TrainState() for _ in range(3))
        plain = monitored.MonitoredSession(state_b, disable_plugins=sorted(installed))
        three = monitored.MonitoredSession(state_c, disable_plugins=off)
        async with plain, three:
            loaded = {info.name for info in three.plugins}
            assert {"nan_guard", "early_stopping", "progress"} <= loaded, loaded
            await bare(step, state_a, block)  # warm-up
            await session_block(plain, step, block)
            await session_block(three, step, block)
            totals = dict.fromkeys(times, 0.0)
            runners = [
                ("bare loop", lambda s=state_a: bare(step, s, block)),
                ("session, plugins off", lambda p=plain: session_block(p, step, block)),
                ("session, 3 plugins", lambda t=three: session_block(t, step, block)),
            ]
            for i in range(steps // block):  # the order rotates block by block
                for name, run in runners[i % 3 :] + runners[: i % 3]:
                    totals[name] += await run()
        for name, total in totals.items():
            times[name].append(total / (steps // block * block))
    print(
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, numpy {np.__version__}; "
        f"{repeats} repeats x {steps} steps, blocks of {block} alternating"
    )
    base = statistics.median(times["bare loop"])
    print("| runner | ms/step (median) | throughput vs bare loop |")
    print("|---|--:|--:|")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"| {name} | {median * 1e3:.4f} | {base / median * 100:.1f} % |")


async def attribute(blocks: int, block: int, with_loss: bool) -> None:
    """Per-step cost of each installed plugin (and of all) over the core alone."""
    os.environ.pop("MONITORED_DISABLE_PLUGIN_AUTOLOAD", None)
    os.environ.pop("MONITORED_PROGRESS", None)
    names = sorted(info.name for info in monitored.installed_plugins(()))
    configs = {"none (core alone)": names, "all installed": []}
    configs.update({f"{name} alone": [n for n in names if n != name] for name in names})
    outputs: dict[str, Any] = {"loss": np.float32(0.5)} if with_loss else {"acc": np.float32(0.5)}

    def step(state: monitored.TrainState) -> dict[str, Any]:
        state.global_step += 1
        return outputs

    async def run(sess: monitored.MonitoredSession, n: int) -> float:
        should_stop, run_step = sess.should_stop, sess.run
        started = time.thread_time_ns()
        for _ in range(n):
            if should_stop():
                break
            await run_step(step)
        return (time.thread_time_ns() - started) / n / 1e3

    options = {"progress": {"mode": "plain"}}
    sessions = {
        label: monitored.MonitoredSession(disable_plugins=off, plugin_options=options)
        for label, off in configs.items()
    }
    times: dict[str, list[float]] = {label: [] for label in sessions}
    with contextlib.redirect_stderr(io.StringIO()):  # progress's closing lines
        async with contextlib.AsyncExitStack() as stack:
            for sess in sessions.values():
                await stack.enter_async_context(sess)
            for sess in sessions.values():
                await run(sess, 3 * block)  # warm-up
            labels = list(sessions)
            for i in range(blocks):  # the order rotates block by block
                for label in labels[i % len(labels) :] + labels[: i % len(labels)]:
                    times[label].append(await run(sessions[label], block))
    core = statistics.median(times["none (core alone)"])
    print(
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}; {blocks} blocks of {block} steps per session, "
        f"thread CPU time; step returns {'a NumPy loss' if with_loss else 'no loss'}"
    )
    print("| session | us/step (median) | over the core alone |")
    print("|---|--:|--:|")
    for label, values in times.items():
        median = statistics.median(values)
        print(f"| {label} | {median:.2f} | {median - core:+.2f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--block", type=int, default=100)
    parser.add_argument("--attribute", action="store_true", help="each plugin's per-step cost")
    parser.add_argument("--no-loss", action="store_true", help="--attribute: steps without loss")
    args = parser.parse_args()
    if args.attribute:
        anyio.run(attribute, 40, 500, not args.no_loss)
    else:
        anyio.run(main, args.steps, args.repeats, args.block)
