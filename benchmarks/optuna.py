"""Trials at once in one event loop, and the pruning plugin's cost when nothing is due.

Two measurements, each against a baseline taken in the same run:

* **Concurrency.** A trial is a ``MonitoredSession`` of ``--steps`` steps whose
  step awaits 2 ms of simulated device time (``anyio.sleep(0.002)``), with an
  ``OptunaPruningHook`` reporting the step's ``loss`` every 10 steps to an
  in-memory study. Timed: one trial alone; 8 trials with
  ``monitored_optuna.optimize(..., concurrency=8)``; the same 8 one after
  another (``concurrency=1``). Target: 8 at once <= 1.2x one alone.
* **Idle cost.** A ``MonitoredTrainingSession`` of a trivial synchronous step
  (it only increments the global step) with the installed ``optuna`` plugin
  for a current trial, watching an evaluation metric (none comes) or a step
  output every 10**9 steps (none is due), and with an ``OptunaPruningHook`` of
  the latter kind in ``hooks=``, against the same session with the plugin
  disabled, in alternating blocks. Target: <= 0.5 us/step more than without.

Usage::

    python benchmarks/optuna.py [--repeats R] [--steps N]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from typing import Any

# This file has the package's name: its folder, first on sys.path when it runs as a
# script, would make `import optuna` import this file.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import anyio  # noqa: E402
import numpy as np  # noqa: E402
import optuna  # noqa: E402

import monitored  # noqa: E402
from monitored_optuna import OptunaPruningHook, optimize, use_trial  # noqa: E402

optuna.logging.set_verbosity(optuna.logging.WARNING)

OTHERS = ["checkpoint", "summaries", "nan_guard", "early_stopping", "progress", "mpi"]


async def device_step(state: monitored.TrainState) -> dict[str, Any]:
    await anyio.sleep(0.002)  # the device computes; the loop is free meanwhile
    state.global_step += 1
    return {"loss": np.float64(1.0 / state.global_step)}


async def trial_objective(trial: optuna.trial.Trial, steps: int) -> float:
    hooks = [OptunaPruningHook(trial, "loss", every_n_steps=10)]
    async with monitored.MonitoredSession(hooks=hooks, disable_plugins=OTHERS) as session:
        while session.state.global_step < steps:
            outputs = await session.run(device_step)
    return float(outputs["loss"])


async def timed_study(n_trials: int, concurrency: int, steps: int) -> float:
    study = optuna.create_study()
    started = time.perf_counter()
    await optimize(
        study, lambda t: trial_objective(t, steps), n_trials=n_trials, concurrency=concurrency
    )
    elapsed = time.perf_counter() - started
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    return elapsed


class EmptyHook:
    """A hook whose per-step methods do nothing: what any per-step hook costs a session."""

    def before_run(self, run_context: Any) -> None:
        return None

    def after_run(self, run_context: Any, run_values: Any) -> None:
        return None


def bump(state: monitored.TrainState) -> None:
    state.global_step += 1


async def block(session: monitored.MonitoredSession, steps: int) -> float:
    started = time.perf_counter()
    for _ in range(steps):
        await session.run(bump)
    return time.perf_counter() - started


async def idle_cost(steps: int, block_steps: int) -> dict[str, float]:
    """Seconds per step of each session (one repeat), in alternating blocks."""
    trial = optuna.create_study().ask()
    never = 10**9

    def session(options: dict[str, Any] | None, hooks: list[object], off: list[str]) -> Any:
        return monitored.MonitoredTrainingSession(
            hooks=hooks, plugin_options=options, disable_plugins=off, log_step_count_steps=None
        )

    with use_trial(trial):
        runners = {
            "without": session(None, [], [*OTHERS, "optuna"]),
            # The same again: how far two identical sessions differ (the noise floor).
            "again": session(None, [], [*OTHERS, "optuna"]),
            "evaluations": session({"optuna": {"monitor": "accuracy"}}, [], OTHERS),
            "outputs": session({"optuna": {"monitor": "loss", "every_n_steps": never}}, [], OTHERS),
            "hook": session(None, [OptunaPruningHook(trial, "loss", every_n_steps=never)], OTHERS),
            "empty": session(None, [EmptyHook()], [*OTHERS, "optuna"]),
        }
        async with (
            runners["without"],
            runners["again"],
            runners["evaluations"],
            runners["outputs"],
            runners["hook"],
            runners["empty"],
        ):
            for name in ("evaluations", "outputs"):
                assert any(isinstance(i.plugin, OptunaPruningHook) for i in runners[name].plugins)
            for each in runners.values():
                await block(each, block_steps)  # warm-up
            totals = dict.fromkeys(runners, 0.0)
            names = list(runners)
            for i in range(steps // block_steps):  # the order rotates block by block
                k = i % len(names)
                for name in names[k:] + names[:k]:
                    totals[name] += await block(runners[name], block_steps)
    assert trial.storage.get_trial(trial._trial_id).intermediate_values == {}
    done = steps // block_steps * block_steps
    return {name: total / done for name, total in totals.items()}


async def main(repeats: int, steps: int, idle_steps: int) -> None:
    os.environ.pop("MONITORED_DISABLE_PLUGIN_AUTOLOAD", None)
    print(
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, optuna {optuna.__version__}, "
        f"load average {os.getloadavg()[0]:.1f}; {repeats} repeats"
    )
    alone, together, sequential = [], [], []
    for _ in range(repeats):
        alone.append(await timed_study(1, 1, steps))
        together.append(await timed_study(8, 8, steps))
        sequential.append(await timed_study(8, 1, steps))
    one = statistics.median(alone)
    print(f"\nTrials of {steps} steps awaiting 2 ms each (median of {repeats}):\n")
    print("| run | seconds | vs one trial alone |")
    print("|---|--:|--:|")
    for name, values in (
        ("1 trial alone", alone),
        ("8 trials, concurrency=8", together),
        ("8 trials, concurrency=1", sequential),
    ):
        median = statistics.median(values)
        print(f"| {name} | {median:.3f} | {median / one:.2f}x |")

    costs: dict[str, list[float]] = {
        "without": [],
        "again": [],
        "evaluations": [],
        "outputs": [],
        "hook": [],
        "empty": [],
    }
    for _ in range(repeats):
        for name, value in (await idle_cost(idle_steps, 1000)).items():
            costs[name].append(value)
    base = statistics.median(costs["without"])
    print(f"\nA trivial step, {idle_steps} steps per repeat, nothing due (median of {repeats}):\n")
    print("| session | us/step | added vs without |")
    print("|---|--:|--:|")
    for name, label in (
        ("without", "optuna plugin disabled"),
        ("again", "the same, a second session (noise floor)"),
        ("evaluations", "plugin watching an evaluation metric"),
        ("outputs", "plugin watching a step output, not due"),
        ("hook", "OptunaPruningHook(every_n_steps=10**9) in hooks="),
        ("empty", "for scale: a hook with empty before_run and after_run"),
    ):
        median = statistics.median(costs[name])
        print(f"| {label} | {median * 1e6:.2f} | {(median - base) * 1e6:+.2f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=500, help="steps per trial")
    parser.add_argument("--idle-steps", type=int, default=60000)
    args = parser.parse_args()
    anyio.run(main, args.repeats, args.steps, args.idle_steps)
