"""Cost of data-parallel training with ``monitored-mpi``, against raw MPI in the same run.

* **gradient**: on 2 ranks, one step of a distributed ``MonitoredSession`` whose
  step averages a 10M-float32 gradient with ``DistributedOptimizer`` (the
  layout check, reduce-scatter, each rank dividing its block, allgather, the
  per-step stop agreement, the hooks' machinery), against ``comm.Allreduce``
  of the same buffer and, for reference, the same sum as the plugin moves it
  (``Reduce_scatter`` + ``Allgatherv``, no division); rounds alternate them. A
  further row adds the optimizer's update (a plain SGD step over the 10M
  floats), for scale.
* **layout check**: what ``DistributedOptimizer`` adds per step to compare the
  ranks' gradient layouts (6 variables, unchanged from call to call), in µs,
  against a 1-float ``comm.Allreduce`` (the smallest collective), alternating.
* **demo**: the demo network (``examples/demo.py``) trained for ``--steps``
  steps of ``--batch`` samples per rank, on 1 rank and on 2: samples per second
  and the scaling efficiency (2-rank throughput / (2 x 1-rank throughput)).

Run: ``python benchmarks/mpi.py [--repeats 7] [--steps 300] [--batch 64]``; it
launches itself under the ``mpiexec`` next to the Python interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()


def _mpiexec() -> str:
    beside = Path(sys.executable).parent / "mpiexec"
    found = str(beside) if beside.exists() else shutil.which("mpiexec")
    if found is None:
        raise SystemExit("no mpiexec: install the mpich wheel (pip install mpich)")
    return found


def _launch(n: int, *args: str) -> dict[str, object]:
    out = subprocess.run(
        [_mpiexec(), "-n", str(n), sys.executable, str(HERE), "--child", *args],
        env={**os.environ, "MPIEXEC_TIMEOUT": "600"},
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def child_gradient(repeats: int, steps: int) -> None:
    import anyio
    import numpy as np
    from mpi4py import MPI

    import monitored
    import monitored_mpi

    comm = MPI.COMM_WORLD
    n = 10_000_000
    grad = np.full(n, comm.rank + 1.0, np.float32)
    out = np.empty_like(grad)
    opt = monitored_mpi.DistributedOptimizer(monitored.GradientDescentOptimizer(1e-3))

    def reduce_only(state: monitored.TrainState) -> None:
        opt.reduce_gradients({"w": grad}, reuse_buffers=True)
        state.global_step += 1

    def full_step(state: monitored.TrainState) -> None:
        opt.apply_gradients(state, {"w": grad})

    def raw() -> float:
        comm.Barrier()
        start = time.perf_counter()
        for _ in range(steps):
            comm.Allreduce(grad, out)
        return (time.perf_counter() - start) / steps

    base, extra = divmod(n, comm.size)
    counts = [base + (1 if r < extra else 0) for r in range(comm.size)]
    offsets = [sum(counts[:r]) for r in range(comm.size)]
    block = np.empty(counts[comm.rank], np.float32)

    def raw_scatter() -> float:
        # The same sum as Allreduce, as the plugin moves it for large buffers
        # (no division): the best raw MPI decomposition, for reference.
        comm.Barrier()
        start = time.perf_counter()
        for _ in range(steps):
            comm.Reduce_scatter(grad, block, counts, op=MPI.SUM)
            comm.Allgatherv(block, [out, (counts, offsets)])
        return (time.perf_counter() - start) / steps

    async def session(step_fn: object) -> float:
        state = monitored.TrainState({"w": np.zeros(n, np.float32)})
        async with monitored.MonitoredSession(state, disable_plugins=["progress"]) as sess:
            await sess.run(step_fn)  # warm-up (buffers)
            comm.Barrier()
            start = time.perf_counter()
            for _ in range(steps):
                await sess.run(step_fn)
            return (time.perf_counter() - start) / steps

    world = monitored_mpi.world()
    layout = [(f"v{i}", np.zeros((64, 64), np.float32)) for i in range(6)]
    one, one_out = np.ones(1), np.empty(1)

    def check() -> float:
        comm.Barrier()
        start = time.perf_counter()
        for _ in range(2000):
            opt._check_layout(layout, world)
        return (time.perf_counter() - start) / 2000

    def tiny() -> float:
        comm.Barrier()
        start = time.perf_counter()
        for _ in range(2000):
            comm.Allreduce(one, one_out)
        return (time.perf_counter() - start) / 2000

    times: dict[str, list[float]] = {
        "raw": [],
        "raw_scatter": [],
        "reduce": [],
        "apply": [],
        "check": [],
        "tiny": [],
    }
    raw()
    raw_scatter()
    for _ in range(repeats):
        times["raw"].append(raw())
        times["raw_scatter"].append(raw_scatter())
        times["reduce"].append(anyio.run(session, reduce_only))
        times["apply"].append(anyio.run(session, full_step))
        times["tiny"].append(tiny())
        times["check"].append(check())
    if comm.rank == 0:
        print(json.dumps(times))


def child_demo(steps: int, batch: int) -> None:
    sys.path.insert(0, str(HERE.parent.parent / "examples"))
    import anyio
    import demo

    import monitored
    import monitored_mpi

    rank, size = monitored_mpi.rank(), monitored_mpi.size()
    x, _, y, _ = demo.load_data(seed=0)
    x, y = x[rank::size], y[rank::size]
    demo.OPTIMIZER = monitored_mpi.DistributedOptimizer(demo.OPTIMIZER)

    async def main() -> float:
        state = monitored.TrainState(seed=0)
        async with monitored.MonitoredSession(
            state, scaffold=monitored.Scaffold(init_fn=demo.init_params)
        ) as sess:
            start = 0.0
            for i in range(steps + 10):
                if i == 10:
                    start = time.perf_counter()
                rows = state.rng.choice(len(y), size=batch, replace=False)
                await sess.run(demo.train_step, (x[rows], y[rows]))
            return time.perf_counter() - start

    elapsed = anyio.run(main)
    if rank == 0:
        print(json.dumps({"samples_per_sec": steps * batch * size / elapsed}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--child", choices=["gradient", "demo"])
    args = parser.parse_args()
    if args.child == "gradient":
        child_gradient(args.repeats, 10)
        return
    if args.child == "demo":
        child_demo(args.steps, args.batch)
        return

    times = _launch(2, "gradient", "--repeats", str(args.repeats))
    raw = statistics.median(times["raw"])  # type: ignore[arg-type]
    print("10M-float32 gradient on 2 ranks, ms per step (median of", args.repeats, "rounds)")
    for key, label in [
        ("raw", "comm.Allreduce (baseline)"),
        ("raw_scatter", "comm.Reduce_scatter + comm.Allgatherv (reference)"),
        ("reduce", "session step, reduce_gradients (reuse_buffers)"),
        ("apply", "session step, apply_gradients (reduce + SGD update)"),
    ]:
        value = statistics.median(times[key])  # type: ignore[arg-type]
        print(f"  {label:<55} {value * 1e3:8.2f} ms  {value / raw:5.2f}x")
    tiny, check = (statistics.median(times[k]) for k in ("tiny", "check"))  # type: ignore[type-var]
    print("per call, us (median of", args.repeats, "rounds of 2000)")
    print(f"  {'comm.Allreduce of 1 float64 (baseline)':<55} {tiny * 1e6:8.1f} us")
    print(f"  {'DistributedOptimizer layout check (6 variables)':<55} {check * 1e6:8.1f} us")
    if os.environ.get("MPI_BENCH_SKIP_DEMO"):
        return
    demo_args = ("demo", "--steps", str(args.steps), "--batch", str(args.batch))
    one, two = [], []
    for _ in range(3):  # alternate, medians
        one.append(_launch(1, *demo_args)["samples_per_sec"])
        two.append(_launch(2, *demo_args)["samples_per_sec"])
    s1, s2 = statistics.median(one), statistics.median(two)  # type: ignore[type-var]
    print(f"demo network, batch {args.batch} per rank, {args.steps} steps (median of 3)")
    print(f"  1 rank : {s1:9.0f} samples/s")
    print(f"  2 ranks: {s2:9.0f} samples/s   scaling efficiency {s2 / (2 * s1):.2f}")  # type: ignore[operator]


if __name__ == "__main__":
    main()
