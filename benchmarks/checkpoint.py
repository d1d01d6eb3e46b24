"""Checkpoint throughput and step-loop stall of ``monitored-checkpoint``.

Measures, for a state of ``--size-gb`` GB of float32 split into ``--arrays``
arrays, in one process and against baselines taken in the same run:

* **save**: ``Saver.save`` (safetensors + manifest, CRC-32, fsync, rename, state
  file) against ``numpy.save`` of the same arrays to the same disk, with and
  without an ``fsync`` of the files (a checkpoint must be durable; ``numpy.save``
  alone is not);
* **restore**: ``restore`` into an empty state (fresh arrays, checksum verified)
  against ``numpy.load``, each from the page cache (*warm*) and after the files
  were evicted from it with ``posix_fadvise(DONTNEED)`` (*cold*); and, warm,
  into a *filled* state (arrays of the right shapes already there, as when a
  session re-creates itself), which is read into new buffers and copied in once
  every check has passed, so a failed restore leaves the state as it was;
* **stall**: how long an asynchronous save blocks the step loop of a
  ``MonitoredSession`` (the snapshot to host memory), against a plain host copy
  of the same arrays (``[a.copy() for a in arrays]``, fresh memory) and a copy
  into memory already touched (``np.copyto``); the first save allocates the
  snapshot buffers, later ones reuse them. Also how much slower the steps that
  run while the write is in flight are.

With ``--show``, only how fast ``monitored checkpoint show`` answers for a
checkpoint of ``--size-gb`` GB in ``--arrays`` arrays (1000 in that mode: one
megabyte each) without ``--stats``, which reads the manifest alone: the real
command as a fresh subprocess (wall clock) against Python starting and doing
nothing, Python importing NumPy (which the checkpoint plugin needs), Python
importing ``monitored`` alone, and ``monitored --version`` (every installed
plugin imported, reading nothing); in-process against ``safetensors.safe_open``
listing the same file's names, dtypes and shapes from its header;
``show --stats`` (every byte read and checksummed) for contrast. With
``--before DIR`` (the ``core`` and ``plugins`` folders of an older commit, e.g.
``git archive REV core plugins | tar -x -C DIR``), the command and
``monitored --help`` are also run from those sources (put first on
``PYTHONPATH``), in the same run. The load average is printed before and after.
Every subprocess runs once before the timed rounds, with Python's bytecode cache
in the scratch directory (``PYTHONPYCACHEPREFIX``), as an installed package has
its ``.pyc`` files; ``--no-bytecode`` times them compiling every module from
source instead (``PYTHONDONTWRITEBYTECODE=1`` and no cache: about twice the
time, NumPy's import most of it).

Repeats alternate the contenders so a slow spell of the shared machine hits
both; the table gives medians and min-max. Files go to a temporary directory
under ``--dir`` (default: the system's temp dir), removed at the end.

Usage::

    python benchmarks/checkpoint.py [--size-gb 1] [--arrays 16] [--repeats 5] [--dir DIR]
    python benchmarks/checkpoint.py --show [--size-gb 1] [--arrays 1000] [--repeats 5]
        [--before DIR] [--no-bytecode]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import numpy as np

from monitored import MonitoredSession, StopAtStepHook, TrainState
from monitored_checkpoint import CheckpointSaverHook, Saver, restore
from monitored_checkpoint._format import SnapshotBuffers, take_snapshot


def _fsync(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _evict(paths: list[Path]) -> None:
    """Drop the files from the page cache (after fsync, clean pages can be dropped)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


@contextmanager
def _scratch(parent: str | None) -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="monitored-ckpt-bench-", dir=parent))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _make_arrays(size_gb: float, count: int) -> dict[str, np.ndarray]:
    total = int(size_gb * (1 << 30)) // 4
    per = total // count
    rng = np.random.default_rng(0)
    return {f"layer{i:02d}": rng.random(per, dtype=np.float32) for i in range(count)}


# -- save and restore ---------------------------------------------------------------------------
def _raw_save(files: list[Path], arrays: dict[str, np.ndarray]) -> None:
    for path, array in zip(files, arrays.values(), strict=True):
        np.save(path, array)


def _raw_fsync(files: list[Path], directory: Path) -> None:
    for path in files:
        _fsync(path)
    _fsync(directory)


def _raw_load(files: list[Path]) -> list[np.ndarray]:
    return [np.load(p) for p in files]


def bench_save_restore(
    arrays: dict[str, np.ndarray], root: Path, repeats: int
) -> dict[str, list[float]]:
    state = TrainState(arrays)
    labels = ("raw save", "raw save + fsync", "ours save")
    labels += ("raw load warm", "ours restore warm", "raw load cold", "ours restore cold")
    labels += ("ours restore warm, filled state",)
    times: dict[str, list[float]] = {k: [] for k in labels}
    raw_dir, ours_dir = root / "raw", root / "ours"
    saver = Saver(max_to_keep=1)
    for repeat in range(repeats):
        for d in (raw_dir, ours_dir):
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir()
        raw_files = [raw_dir / f"{name}.npy" for name in arrays]
        save_path = str(ours_dir / "model.ckpt")
        # Alternate who goes first, so drifting background load hits both alike.
        if repeat % 2 == 0:
            t_raw = _timed(partial(_raw_save, raw_files, arrays))
            t_fsync = _timed(partial(_raw_fsync, raw_files, raw_dir))
            t_ours = _timed(partial(saver.save, state, save_path, repeat))
        else:
            t_ours = _timed(partial(saver.save, state, save_path, repeat))
            t_raw = _timed(partial(_raw_save, raw_files, arrays))
            t_fsync = _timed(partial(_raw_fsync, raw_files, raw_dir))
        times["raw save"].append(t_raw)
        times["raw save + fsync"].append(t_raw + t_fsync)
        times["ours save"].append(t_ours)

        ours_files = sorted(ours_dir.glob("*.safetensors"))
        for label, evict in (("warm", False), ("cold", True)):
            if evict:
                _evict(raw_files)
                _evict(ours_files)
            times[f"raw load {label}"].append(_timed(partial(_raw_load, raw_files)))
            target = TrainState()
            times[f"ours restore {label}"].append(
                _timed(partial(restore, target, f"{save_path}-{repeat}"))
            )
            first = next(iter(arrays))
            assert np.array_equal(target[first], arrays[first])
            del target
        filled = TrainState({n: np.zeros_like(a) for n, a in arrays.items()})
        times["ours restore warm, filled state"].append(
            _timed(partial(restore, filled, f"{save_path}-{repeat}"))
        )
        assert np.array_equal(filled[first], arrays[first])
        del filled
    return times


# -- stall of the step loop ---------------------------------------------------------------------
_WORK = np.random.default_rng(1).random(1 << 18).astype(np.float32)


def _step(s: TrainState) -> None:
    """A few milliseconds of CPU work, touching the state a little."""
    for _ in range(8):
        np.sqrt(_WORK * _WORK + 1.0)
    s["layer00"][s.global_step % 100] += 1.0
    s.global_step += 1


def bench_stall(
    arrays: dict[str, np.ndarray], root: Path, saves: int, save_secs: float
) -> dict[str, Any]:
    """Step times of a session that saves asynchronously every ``every`` steps.

    ``every`` is chosen so each write finishes well before the next save is due
    (what is measured is the snapshot, not waiting for the previous write).
    """
    state = TrainState({n: a.copy() for n, a in arrays.items()})
    step_secs = statistics.median(_timed(partial(_step, state)) for _ in range(20))
    every = max(20, int(3 * save_secs / step_secs))
    state.global_step = 0
    hook = CheckpointSaverHook(str(root / "async"), save_steps=every, saver=Saver(max_to_keep=1))
    last = every * saves
    durations: list[tuple[int, float, bool]] = []  # (step, seconds, write in flight)

    async def main() -> None:
        async with MonitoredSession(state, hooks=[hook, StopAtStepHook(last_step=last)]) as sess:
            while not sess.should_stop():
                write = hook.last_write
                in_flight = write is not None and not write.done.is_set()
                begun = time.perf_counter()
                await sess.run(_step)
                durations.append((state.global_step, time.perf_counter() - begun, in_flight))

    anyio.run(main)
    plain = [d for s, d, busy in durations if s % every != 0 and not busy]
    during = [d for s, d, busy in durations if s % every != 0 and busy]
    base = statistics.median(plain)
    stalls = [d - base for s, d, _ in durations if s % every == 0 and s != last]
    return {
        "every": every,
        "step": base,
        "step during write": statistics.median(during) if during else float("nan"),
        "stalls": stalls,
        "steps during writes": len(during),
    }


def _fresh_copies(arrays: dict[str, np.ndarray]) -> list[np.ndarray]:
    return [a.copy() for a in arrays.values()]


def _copy_into(buffers: dict[str, np.ndarray], arrays: dict[str, np.ndarray]) -> None:
    for name, array in arrays.items():
        np.copyto(buffers[name], array)


def _first_snapshot(state: TrainState) -> None:
    take_snapshot(state, buffers=SnapshotBuffers())


def bench_copies(arrays: dict[str, np.ndarray], repeats: int) -> dict[str, list[float]]:
    buffers = {n: np.empty_like(a) for n, a in arrays.items()}
    _copy_into(buffers, arrays)  # touch the buffers once
    state = TrainState(arrays)
    fresh = [_timed(partial(_fresh_copies, arrays)) for _ in range(repeats)]
    reused = [_timed(partial(_copy_into, buffers, arrays)) for _ in range(repeats)]
    first = [_timed(partial(_first_snapshot, state)) for _ in range(repeats)]
    return {
        "plain copy (fresh memory)": fresh,
        "copy into touched memory": reused,
        "first snapshot (new buffers)": first,
    }


# -- report -------------------------------------------------------------------------------------
def _row(label: str, values: list[float], nbytes: int) -> str:
    med = statistics.median(values)
    return (
        f"| {label} | {med:.3f} s | {min(values):.3f} to {max(values):.3f} s | "
        f"{nbytes / med / 1e9:.2f} GB/s |"
    )


def _in_process_show(argv: list[str]) -> None:
    from monitored._cli import main as monitored_main

    with contextlib.redirect_stdout(io.StringIO()):
        status = monitored_main(argv)
    assert status == 0, argv


def _safetensors_header(path: str) -> None:
    from safetensors import safe_open

    with safe_open(path, "np") as file:
        for name in file.keys():  # noqa: SIM118 - safe_open is not a mapping
            view = file.get_slice(name)
            view.get_dtype(), view.get_shape()


def _command(*argv: str, env: dict[str, str]) -> None:
    script = str(Path(sys.executable).with_name("monitored"))
    subprocess.run([script, *argv], check=True, stdout=subprocess.DEVNULL, env=env)


def _python(code: str, env: dict[str, str]) -> None:
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def _subprocess_env(root: Path, bytecode: bool) -> dict[str, str]:
    """The environment of the timed subprocesses: a bytecode cache of their own, or none."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    if bytecode:
        return {**env, "PYTHONPYCACHEPREFIX": str(root / "pycache")}
    return {**env, "PYTHONDONTWRITEBYTECODE": "1"}


def _sources_env(env: dict[str, str], before: str) -> dict[str, str]:
    """``env`` running ``monitored`` from the sources under ``before``."""
    roots = [Path(before, "core"), *sorted(Path(before, "plugins").glob("*/src"))]
    return {**env, "PYTHONPATH": os.pathsep.join(str(root) for root in roots)}


def bench_show(
    size_gb: float,
    count: int,
    root: Path,
    repeats: int,
    before: str | None = None,
    bytecode: bool = True,
) -> dict[str, list[float]]:
    """Seconds of ``monitored checkpoint show`` of one checkpoint, and of its baselines."""
    # Zeros: calloc'd pages the save writes without a copy (quick to make, real bytes).
    each = int(size_gb * 1e9) // count // 4
    state = TrainState({f"layer{i:04d}/w": np.zeros(each, np.float32) for i in range(count)})
    path = Saver().save(state, f"{root}/model.ckpt")
    data = f"{path}.safetensors"
    env = _subprocess_env(root, bytecode)
    contenders: dict[str, Callable[[], None]] = {
        "python -c pass (subprocess)": partial(_python, "pass", env),
        "python -c 'import numpy' (subprocess)": partial(_python, "import numpy", env),
        "python -c 'import monitored' (subprocess)": partial(_python, "import monitored", env),
        "monitored --version (subprocess)": partial(_command, "--version", env=env),
        "monitored checkpoint show (subprocess)": partial(
            _command, "checkpoint", "show", path, env=env
        ),
        "monitored --help (subprocess)": partial(_command, "--help", env=env),
        "safetensors safe_open header (in-process)": partial(_safetensors_header, data),
        "checkpoint show (in-process)": partial(_in_process_show, ["checkpoint", "show", path]),
    }
    if before is not None:
        old = _sources_env(env, before)
        contenders["monitored checkpoint show (subprocess, before)"] = partial(
            _command, "checkpoint", "show", path, env=old
        )
        contenders["monitored --help (subprocess, before)"] = partial(_command, "--help", env=old)
    for fn in contenders.values():  # the bytecode cache, the page cache
        fn()
    times: dict[str, list[float]] = {label: [] for label in contenders}
    stats: list[float] = []
    for _ in range(repeats):
        for label, fn in contenders.items():
            times[label].append(_timed(fn))
    for _ in range(min(repeats, 3)):
        stats.append(_timed(partial(_in_process_show, ["checkpoint", "show", "--stats", path])))
    times["checkpoint show --stats (in-process)"] = stats
    times["checkpoint file bytes"] = [float(Path(data).stat().st_size)]
    return times


def show_main(args: argparse.Namespace) -> None:
    count = args.arrays if args.arrays != 16 else 1000
    load_before = os.getloadavg()
    with _scratch(args.dir) as root:
        times = bench_show(
            args.size_gb, count, root, args.repeats, args.before, not args.no_bytecode
        )
    load_after = os.getloadavg()
    nbytes = times.pop("checkpoint file bytes")[0]
    print(f"Command: {shlex.join([Path(sys.executable).name, *sys.argv])}")
    print(
        f"Machine: {os.cpu_count()} cores, {platform.machine()}, {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}, NumPy {np.__version__}"
    )
    print(
        "Load average (1, 5, 15 min): "
        f"{' '.join(f'{x:.2f}' for x in load_before)} before, "
        f"{' '.join(f'{x:.2f}' for x in load_after)} after"
    )
    print(f"Checkpoint: {nbytes / 1e9:.2f} GB in {count} arrays; {args.repeats} repeats")
    print(
        "Subprocesses: "
        + ("no bytecode cache, every module compiled" if args.no_bytecode else "bytecode cached")
    )
    print()
    print("| operation | median | range |")
    print("|---|---|---|")
    med = {}
    for label, values in times.items():
        med[label] = statistics.median(values)
        print(f"| {label} | {med[label]:.3f} s | {min(values):.3f} to {max(values):.3f} s |")
    print()
    show = med["monitored checkpoint show (subprocess)"]
    start = med["monitored --version (subprocess)"]
    inner = med["checkpoint show (in-process)"]
    header = med["safetensors safe_open header (in-process)"]
    numpy_start = med["python -c 'import numpy' (subprocess)"]
    bare = med["python -c pass (subprocess)"]
    print(
        f"monitored checkpoint show answers in {show:.3f} s (target <= 1 s): "
        f"{show / numpy_start:.2f}x python -c 'import numpy' ({numpy_start:.3f} s), "
        f"{show / bare:.1f}x python -c pass ({bare:.3f} s), "
        f"{show / start:.2f}x monitored --version ({start:.3f} s)"
    )
    if args.before is not None:
        old = med["monitored checkpoint show (subprocess, before)"]
        old_help = med["monitored --help (subprocess, before)"]
        new_help = med["monitored --help (subprocess)"]
        print(
            f"before ({args.before}): show {old:.3f} s = {old / numpy_start:.2f}x NumPy's "
            f"import, now {old / show:.2f}x faster; --help {old_help:.3f} s, now "
            f"{new_help:.3f} s ({old_help / new_help:.2f}x faster)"
        )
    print(
        f"in-process: {inner * 1e3:.1f} ms = {inner / header:.2f}x safetensors reading the "
        f"header ({header * 1e3:.1f} ms)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-gb", type=float, default=1.0)
    parser.add_argument("--arrays", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--saves", type=int, default=5, help="async saves in the stall run")
    parser.add_argument("--dir", default=None, help="parent of the scratch directory")
    parser.add_argument(
        "--show", action="store_true", help="only time monitored checkpoint show (see above)"
    )
    parser.add_argument(
        "--before", metavar="DIR", help="with --show, also time the sources under DIR (see above)"
    )
    parser.add_argument(
        "--no-bytecode", action="store_true", help="with --show, no bytecode cache (see above)"
    )
    args = parser.parse_args()
    if args.show:
        show_main(args)
        return

    arrays = _make_arrays(args.size_gb, args.arrays)
    nbytes = sum(a.nbytes for a in arrays.values())
    with _scratch(args.dir) as root:
        times = bench_save_restore(arrays, root, args.repeats)
        copies = bench_copies(arrays, args.repeats)
        save_secs = statistics.median(times["ours save"])
        stall = bench_stall(arrays, root, args.saves, save_secs)

    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"Command: {shlex.join([Path(sys.executable).name, *sys.argv])}")
    print(
        f"Machine: {os.cpu_count()} cores, {platform.machine()}, {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}, NumPy {np.__version__}"
    )
    print(
        f"State: {nbytes / 1e9:.2f} GB of float32 in {len(arrays)} arrays; {args.repeats} repeats"
    )
    print()
    print("| operation | median | range | throughput |")
    print("|---|---|---|---|")
    for label, values in times.items():
        print(_row(label, values, nbytes))
    for label, values in copies.items():
        print(_row(label, values, nbytes))
    print()
    print(f"save vs numpy.save + fsync: {med['raw save + fsync'] / med['ours save']:.2f}x")
    print(f"save vs numpy.save (no fsync): {med['raw save'] / med['ours save']:.2f}x")
    print(
        f"restore vs numpy.load, warm cache: {med['raw load warm'] / med['ours restore warm']:.2f}x"
    )
    print(
        f"restore vs numpy.load, cold cache: {med['raw load cold'] / med['ours restore cold']:.2f}x"
    )
    filled = med["ours restore warm, filled state"]
    print(
        f"restore into a filled state vs numpy.load, warm cache: "
        f"{med['raw load warm'] / filled:.2f}x"
    )
    plain = statistics.median(copies["plain copy (fresh memory)"])
    touched = statistics.median(copies["copy into touched memory"])
    stalls = stall["stalls"]
    later = statistics.median(stalls)
    first = statistics.median(copies["first snapshot (new buffers)"])
    print()
    print(
        f"step (no write in flight): {stall['step'] * 1e3:.1f} ms; "
        f"during a write: {stall['step during write'] * 1e3:.1f} ms "
        f"({stall['steps during writes']} steps)"
    )
    print(
        f"stall of an async save in the loop (median of {len(stalls)}, "
        f"{min(stalls):.3f} to {max(stalls):.3f} s): {later:.3f} s = "
        f"{later / plain:.2f}x a plain host copy ({plain:.3f} s), "
        f"{later / touched:.2f}x a copy into touched memory ({touched:.3f} s)"
    )
    print(
        f"the first snapshot of a session allocates its buffers: {first:.3f} s = "
        f"{first / plain:.2f}x a plain host copy"
    )


if __name__ == "__main__":
    main()
