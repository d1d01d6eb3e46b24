"""Steps per second across two simulated hosts with a delayed link (``monitored-mpi``).

Two ranks, each in a network namespace of its own; the namespaces are joined by
two TAP devices and this process forwards every Ethernet frame from one to the
other after ``delay`` seconds (a userspace delay line: the kernel's ``netem``
is not available everywhere, this works wherever ``/dev/net/tun`` and ``ip
netns`` do). MPICH is told to use TCP only (``MPIR_CVAR_NOLOCAL=1``,
``UCX_TLS=tcp,self``), so every byte between the ranks crosses the delayed
link, as between two machines. The link's routes have ``quickack`` (the
receiving kernel acknowledges at once) unless ``--delayed-acks``: with the
kernel's delayed acknowledgements, every kind of job, raw MPI included, was
measured about half a delay slower per step on average, and noisier.

For each one-way delay, in rounds that alternate the kinds of job:

* **one allreduce**: a loop of one ``Iallreduce`` per step of a buffer the size
  of the model's gradient (65 float64), waited for as the plugin waits, in raw
  mpi4py: the floor, what a hand-written data-parallel step cannot go below;
* **monitored**: a small model (a linear regression over 64 features, batch 32)
  trained by a distributed ``MonitoredTrainingSession`` with
  ``DistributedOptimizer`` and ``StopAtStepHook``;
* **monitored, MONITORED_MPI_STOP_LAG=1**: the same, each step's stop
  agreement overlapped with the next step's gradient reduction;
* **monitored, before** (with ``--before SRC``, a checkout of the plugin's
  ``src`` folder before this change): the same with that plugin.

It prints seconds per step (median over rounds, steady state: the first 5
steps left out) and each as a multiple of the one-allreduce floor and of the
injected one-way delay. Needs root (namespaces, TAP devices).

With ``--lost-host 5 30``: how long after the link is cut mid-training the
whole job ends (``mpiexec`` exits), for each heartbeat timeout.

Run: ``sudo python benchmarks/mpi_latency.py [--delays 0 0.005 0.02 0.05]
[--steps 40] [--rounds 3] [--before /path/to/plugins/mpi/src]``, or
``sudo python benchmarks/mpi_latency.py --lost-host 5 30 [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import collections
import fcntl
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve()
_TUNSETIFF, _IFF_TAP, _IFF_NO_PI = 0x400454CA, 0x0002, 0x1000
_WARMUP = 5


class DelayLine:
    """Two namespaces joined by TAP devices, frames forwarded after ``delay`` seconds."""

    def __init__(self, tag: str, delayed_acks: bool = False) -> None:
        self.delay = 0.0
        #: Frames are dropped while True: the link is cut.
        self.cut = False
        self.namespaces = [f"{tag}a", f"{tag}b"]
        self.addresses = ["10.232.0.1", "10.232.0.2"]
        fds = []
        for i, ns in enumerate(self.namespaces):
            fd = os.open("/dev/net/tun", os.O_RDWR)
            fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", ns.encode(), _IFF_TAP | _IFF_NO_PI))
            fds.append(fd)
            _ip("netns", "add", ns)
            _ip("link", "set", ns, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{self.addresses[i]}/24", "dev", ns)
            _ip("-n", ns, "link", "set", ns, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            if not delayed_acks:
                _ip("-n", ns, "route", "change", "10.232.0.0/24", "dev", ns, "quickack", "1")
        self._forward(fds[0], fds[1])
        self._forward(fds[1], fds[0])

    def _forward(self, source: int, target: int) -> None:
        queue: collections.deque[tuple[float, bytes]] = collections.deque()
        ready = threading.Condition()

        def read() -> None:
            while True:
                try:
                    frame = os.read(source, 65536)
                except OSError:  # the devices are gone: the benchmark is over
                    return
                if self.cut:
                    continue
                with ready:
                    queue.append((time.monotonic() + self.delay, frame))
                    ready.notify()

        def write() -> None:
            while True:
                with ready:
                    while not queue:
                        ready.wait()
                    due, frame = queue.popleft()
                pause = due - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                try:
                    os.write(target, frame)
                except OSError:  # as above
                    return

        threading.Thread(target=read, daemon=True).start()
        threading.Thread(target=write, daemon=True).start()

    def close(self) -> None:
        for ns in self.namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def _mpiexec() -> str:
    beside = Path(sys.executable).parent / "mpiexec"
    found = str(beside) if beside.exists() else shutil.which("mpiexec")
    if found is None:
        raise SystemExit("no mpiexec: install the mpich wheel (pip install mpich)")
    return found


def _command(line: DelayLine, kind: str, steps: int) -> list[str]:
    command = [_mpiexec()]
    for i, ns in enumerate(line.namespaces):
        if i:
            command.append(":")
        command += ["-n", "1", "ip", "netns", "exec", ns, sys.executable, str(HERE)]
        command += ["--child", kind, str(steps)]
    return command


def _env(plugin_src: str | None, extra: dict[str, str]) -> dict[str, str]:
    env = {
        **os.environ,
        "MPIEXEC_TIMEOUT": "600",
        "MPIR_CVAR_NOLOCAL": "1",
        "UCX_TLS": "tcp,self",
        "MONITORED_DISABLE_PLUGINS": "progress,summaries,checkpoint",
    }
    if plugin_src is not None:
        env["PYTHONPATH"] = plugin_src + os.pathsep + env.get("PYTHONPATH", "")
    return {**env, **extra}


def launch(
    line: DelayLine, kind: str, steps: int, plugin_src: str | None, extra: dict[str, str]
) -> float:
    """Seconds per step of one job of ``kind`` over ``line``."""
    command, env = _command(line, kind, steps), _env(plugin_src, extra)
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{kind} job failed:\n{out.stdout}\n{out.stderr}")
    return float(json.loads(out.stdout.strip().splitlines()[-1])["per_step"])


def child(kind: str, steps: int) -> None:
    import numpy as np

    if kind == "allreduce":
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        # The model's gradient (65 float64), reduced as DistributedOptimizer does
        # (non-blocking, polled): MPICH's blocking Allreduce of 65 elements takes
        # another algorithm, measured at two delays per call over this link.
        one, out = np.ones(65), np.empty(65)
        for i in range(_WARMUP + steps):
            if i == _WARMUP:
                start = time.perf_counter()
            request = comm.Iallreduce(one, out)
            while not request.Test():
                pass
        per_step = (time.perf_counter() - start) / steps
        if comm.Get_rank() == 0:
            print(json.dumps({"per_step": per_step}))
        return

    import anyio

    import monitored
    import monitored_mpi

    rank, size = monitored_mpi.rank(), monitored_mpi.size()
    rng = np.random.default_rng(rank)
    x = rng.normal(size=(32, 64))
    y = x @ np.linspace(-1, 1, 64) + 0.5
    opt = monitored_mpi.DistributedOptimizer(monitored.train.GradientDescentOptimizer(0.01))
    marks: dict[str, float] = {}

    class Clock:
        def after_run(self, run_context: object, run_values: object) -> None:
            step = run_context.session.state.global_step  # type: ignore[attr-defined]
            if step == _WARMUP:
                marks["start"] = time.perf_counter()
            marks["end"], marks["steps"] = time.perf_counter(), step - _WARMUP

    def step(state: monitored.TrainState) -> dict[str, float]:
        err = x @ state["w"] + state["b"] - y
        grads = {"w": 2 * x.T @ err / len(y), "b": np.asarray(2 * err.mean())}
        opt.apply_gradients(state, grads)
        return {"loss": float((err**2).mean())}

    async def main() -> None:
        state = monitored.TrainState({"w": np.zeros(64), "b": np.zeros(())})
        async with monitored.MonitoredTrainingSession(
            state,
            hooks=[monitored.StopAtStepHook(last_step=_WARMUP + steps), Clock()],
            save_summaries_steps=None,
            log_step_count_steps=None,
        ) as sess:
            while not sess.should_stop():
                await sess.run(step)

    anyio.run(main)
    if rank == 0:
        per_step = (marks["end"] - marks["start"]) / marks["steps"]
        print(json.dumps({"per_step": per_step, "size": size}))


def lost_host(line: DelayLine, timeouts: list[float], rounds: int) -> None:
    """Seconds from cutting the link mid-training to the end of ``mpiexec``."""
    print("| MONITORED_MPI_HEARTBEAT_TIMEOUT | cut to job end (median, min-max) | error |")
    print("|--:|--:|---|")
    for timeout in timeouts:
        ends, errors = [], set()
        for _ in range(rounds):
            line.cut, line.delay = False, 0.0
            env = _env(None, {"MONITORED_MPI_HEARTBEAT_TIMEOUT": f"{timeout:g}"})
            job = subprocess.Popen(
                _command(line, "monitored", 10**9),
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            time.sleep(5.0)  # started, and training
            if job.poll() is not None:
                raise SystemExit(f"the job ended before the cut:\n{job.communicate()}")
            line.cut = True
            cut = time.monotonic()
            _, err = job.communicate(timeout=timeout + 600)
            ends.append(time.monotonic() - cut)
            errors |= {name for name in ("PeerLostError", "CollectiveTimeoutError") if name in err}
        print(
            f"| {timeout:g} s | {statistics.median(ends):.1f} s ({min(ends):.1f}-"
            f"{max(ends):.1f}) | {', '.join(sorted(errors))} |",
            flush=True,
        )
    line.cut = False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", nargs=2, metavar=("KIND", "STEPS"))
    parser.add_argument("--delays", nargs="+", type=float, default=[0.0, 0.005, 0.02, 0.05])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--delayed-acks",
        action="store_true",
        help="keep the kernel's delayed TCP ACKs on the link (by default off: quickack)",
    )
    parser.add_argument("--before", help="the plugin's src folder before this change")
    parser.add_argument(
        "--lost-host",
        nargs="+",
        type=float,
        metavar="SECS",
        help="instead: seconds from cutting the link to the job's end, for these "
        "MONITORED_MPI_HEARTBEAT_TIMEOUT values",
    )
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]))
        return
    if os.geteuid() != 0:
        raise SystemExit("needs root: network namespaces and TAP devices")
    lag = {"MONITORED_MPI_STOP_LAG": "1"}
    kinds: list[tuple[str, str, str | None, dict[str, str]]] = [
        ("one allreduce", "allreduce", None, {}),
        ("monitored", "monitored", None, {}),
        ("monitored, MONITORED_MPI_STOP_LAG=1", "monitored", None, lag),
    ]
    if args.before:
        kinds.append(("monitored, before", "monitored", args.before, {}))
    line = DelayLine(f"mlat{os.getpid() % 10000}", delayed_acks=args.delayed_acks)
    try:
        if args.lost_host:
            lost_host(line, args.lost_host, args.rounds)
            return
        print(
            "| one-way delay | job | s/step (median) | steps/s | x one allreduce "
            "| x one-way delay |"
        )
        print("|--:|---|--:|--:|--:|--:|")
        for delay in args.delays:
            line.delay = delay
            times: dict[str, list[float]] = {name: [] for name, _, _, _ in kinds}
            for round_ in range(args.rounds):
                order = kinds if round_ % 2 == 0 else kinds[::-1]
                for name, kind, src, extra in order:
                    times[name].append(launch(line, kind, args.steps, src, extra))
            floor = statistics.median(times["one allreduce"])
            for name, _, _, _ in kinds:
                per_step = statistics.median(times[name])
                per_delay = f"{per_step / delay:.2f}" if delay else "—"
                print(
                    f"| {delay * 1000:g} ms | {name} | {per_step * 1000:.2f} ms | "
                    f"{1 / per_step:.1f} | {per_step / floor:.2f} | {per_delay} |",
                    flush=True,
                )
    finally:
        line.close()


if __name__ == "__main__":
    main()
