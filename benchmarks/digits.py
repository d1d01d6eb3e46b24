"""A small real training with every feature on: ``monitored`` against the same by hand (issue 33).

scikit-learn's digits, an MLP 64-128-10 (ReLU, softmax cross-entropy, plain
SGD on minibatches of 32, float32), ``--steps`` steps (2000), trained three
ways in one process, on the same batches from the same initial weights:

* **bare**: the NumPy loop alone;
* **by hand**: the same loop with the features written by hand: a checkpoint
  every 100 steps (``safetensors.numpy.save_file`` to a temporary name,
  ``fsync``, rename), the loss to TensorBoard every 10 steps
  (``tensorboardX.SummaryWriter.add_scalar``), a NaN check every step
  (``np.isnan``), early stopping on the loss (best value and patience, checked
  every step), a ``tqdm`` progress bar (to ``/dev/null``);
* **monitored**: ``MonitoredTrainingSession(checkpoint_dir=...,
  save_checkpoint_steps=100, save_summaries_steps=10)`` with the installed
  plugins (checkpoint, summaries, NaN guard, early stopping with
  ``monitor="loss"``, progress; standard output to ``/dev/null``), the step
  recording ``summaries.scalar("loss", ...)``; set-up and close included.

Each repeat runs the three in a rotating order (so a slow spell of the shared
machine hits all alike) in fresh directories; the figures are medians of the
process CPU time (every thread: the checkpoint writer's and the event-file
writer's included) and of wall time. The figure of merit is monitored over by
hand (target: at most 1.10).

Usage (one BLAS thread, so the machine's threads do not add noise)::

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python benchmarks/digits.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import platform
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
from sklearn.datasets import load_digits

import monitored

Params = dict[str, np.ndarray]


def _data(steps: int, batch: int) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, len(x), batch) for _ in range(steps)]
    return x, y, batches


def _init() -> Params:
    rng = np.random.default_rng(1)
    return {
        "w1": (rng.standard_normal((64, 128)) * np.sqrt(2 / 64)).astype(np.float32),
        "b1": np.zeros(128, np.float32),
        "w2": (rng.standard_normal((128, 10)) * np.sqrt(2 / 128)).astype(np.float32),
        "b2": np.zeros(10, np.float32),
    }


def _sgd_step(p: Any, x: np.ndarray, y: np.ndarray, lr: float = 0.1) -> np.float32:
    """One SGD step in place on ``p`` (a dict or a TrainState); the batch's mean loss."""
    h = x @ p["w1"] + p["b1"]
    a = np.maximum(h, 0)
    z = a @ p["w2"] + p["b2"]
    z -= z.max(axis=1, keepdims=True)
    e = np.exp(z)
    prob = e / e.sum(axis=1, keepdims=True)
    n = len(y)
    loss = np.float32(-np.log(prob[np.arange(n), y] + 1e-12).mean())
    dz = prob
    dz[np.arange(n), y] -= 1
    dz /= n
    dw2 = a.T @ dz
    db2 = dz.sum(axis=0)
    da = dz @ p["w2"].T
    da[h <= 0] = 0
    dw1 = x.T @ da
    db1 = da.sum(axis=0)
    p["w1"] -= lr * dw1
    p["b1"] -= lr * db1
    p["w2"] -= lr * dw2
    p["b2"] -= lr * db2
    return loss


def bare(x: np.ndarray, y: np.ndarray, batches: list[np.ndarray], root: Path) -> float:
    p = _init()
    loss = np.float32(0)
    for idx in batches:
        loss = _sgd_step(p, x[idx], y[idx])
    return float(loss)


def by_hand(x: np.ndarray, y: np.ndarray, batches: list[np.ndarray], root: Path) -> float:
    from safetensors.numpy import save_file
    from tensorboardX import SummaryWriter
    from tqdm import tqdm

    p = _init()
    best, bad, patience = np.inf, 0, 10**9
    writer = SummaryWriter(str(root / "hand"))
    loss = np.float32(0)
    with open(os.devnull, "w") as devnull, tqdm(total=len(batches), file=devnull) as bar:
        for step, idx in enumerate(batches, 1):
            loss = _sgd_step(p, x[idx], y[idx])
            if np.isnan(loss):
                raise FloatingPointError(f"loss is NaN at step {step}")
            if loss < best:
                best, bad = loss, 0
            else:
                bad += 1
                if bad > patience:
                    break
            if step % 10 == 0:
                writer.add_scalar("loss", float(loss), step)
            if step % 100 == 0:
                path = root / "hand" / f"model-{step}.safetensors"
                tmp = path.with_suffix(".tmp")
                save_file(p, str(tmp))
                fd = os.open(tmp, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(tmp, path)
            bar.update(1)
    writer.close()
    return float(loss)


def with_monitored(
    x: np.ndarray,
    y: np.ndarray,
    batches: list[np.ndarray],
    root: Path,
    disable: tuple[str, ...] = (),
) -> float:
    import monitored_summaries as summaries

    state = monitored.TrainState(_init())
    batch_iter = iter(batches)

    def step(s: monitored.TrainState) -> dict[str, Any]:
        idx = next(batch_iter)
        loss = _sgd_step(s, x[idx], y[idx])
        summaries.scalar("loss", loss)
        s.global_step += 1
        return {"loss": loss}

    options = {}
    if "early_stopping" not in disable:
        options["early_stopping"] = {"monitor": "loss", "patience": 10**9}

    async def main() -> float:
        loss = 0.0
        async with monitored.MonitoredTrainingSession(
            state=state,
            checkpoint_dir=None if "checkpoint" in disable else str(root / "monitored"),
            summary_dir=str(root / "monitored"),
            save_checkpoint_steps=100,
            save_checkpoint_secs=None,
            save_summaries_steps=None if "summaries" in disable else 10,
            save_summaries_secs=None,
            log_step_count_steps=None,
            plugin_options=options,
            hooks=[monitored.StopAtStepHook(last_step=len(batches))],
            disable_plugins=disable,
        ) as sess:
            while not sess.should_stop():
                out = await sess.run(step)
                loss = float(out["loss"])
        return loss

    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
        return anyio.run(main)


PLUGINS = ["checkpoint", "summaries", "nan_guard", "early_stopping", "progress"]

CONTENDERS: dict[str, Callable[[np.ndarray, np.ndarray, list[np.ndarray], Path], float]] = {
    "bare NumPy loop": bare,
    "the same features by hand": by_hand,
    "monitored, every plugin": with_monitored,
}


@contextlib.contextmanager
def _scratch(parent: str | None) -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="monitored-digits-", dir=parent))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--dir", default=None, help="parent of the scratch directories")
    parser.add_argument(
        "--attribute",
        action="store_true",
        help="also monitored without each plugin in turn (disable_plugins), and with none",
    )
    args = parser.parse_args()
    x, y, batches = _data(args.steps, 32)
    if args.attribute:
        for plugin in PLUGINS:
            CONTENDERS[f"monitored without {plugin}"] = functools.partial(
                with_monitored, disable=(plugin,)
            )
        CONTENDERS["monitored, no plugin"] = functools.partial(
            with_monitored, disable=tuple(PLUGINS)
        )
    names = list(CONTENDERS)
    cpu: dict[str, list[float]] = {n: [] for n in names}
    wall: dict[str, list[float]] = {n: [] for n in names}
    losses: dict[str, float] = {}
    with _scratch(args.dir) as root:
        for name in names:  # warm-up: imports, first-touch
            warm = root / f"warm-{names.index(name)}"
            (warm / "hand").mkdir(parents=True)
            CONTENDERS[name](x, y, batches[:200], warm)
        for r in range(args.repeats):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                directory = root / f"{r}-{names.index(name)}"
                directory.mkdir()
                (directory / "hand").mkdir()
                c, w = time.process_time(), time.perf_counter()
                losses[name] = CONTENDERS[name](x, y, batches, directory)
                cpu[name].append(time.process_time() - c)
                wall[name].append(time.perf_counter() - w)
    print(f"Command: {shlex.join([Path(sys.executable).name, *sys.argv])}")
    print(
        f"Machine: {os.cpu_count()} cores, {platform.machine()}, Python "
        f"{platform.python_version()}, NumPy {np.__version__}; load {os.getloadavg()[0]:.1f}"
    )
    print(f"{args.steps} steps, {args.repeats} repeats; final losses {set(losses.values())}")
    print()
    hand_cpu = statistics.median(cpu["the same features by hand"])
    hand_wall = statistics.median(wall["the same features by hand"])
    bare_cpu = statistics.median(cpu["bare NumPy loop"])
    print(
        "| contender | CPU s (median, range) | wall s (median) | steps/s (CPU) | CPU / bare "
        "| CPU / by hand | wall / by hand |"
    )
    print("|---|--:|--:|--:|--:|--:|--:|")
    for name in names:
        c, w = statistics.median(cpu[name]), statistics.median(wall[name])
        print(
            f"| {name} | {c:.3f} ({min(cpu[name]):.3f}-{max(cpu[name]):.3f}) | {w:.3f} | "
            f"{args.steps / c:,.0f} | {c / bare_cpu:.2f} | {c / hand_cpu:.2f} | "
            f"{w / hand_wall:.2f} |"
        )


if __name__ == "__main__":
    main()
