"""Evaluation benchmarks: metric updates, and train_and_evaluate against a hand-written loop.

``--what metrics`` (the default): for each metric this times
``metric.update(...)`` (input checks, weights, the accumulation into float64
arrays) against the shortest inline NumPy code that
accumulates the same sums, written below and run in the same process on the
same batches. Both are timed alternately after a warm-up, over ``--updates``
updates per repeat; the medians are compared. The ratio is monitored's time
over the inline code's (the target is at most 1.2).

The inline AUC baseline uses the same bucketing (``searchsorted`` + ``bincount``)
that monitored uses; TF's own tiled comparison is O(n * thresholds) and far slower.

    python benchmarks/evaluation.py [--batch 4096] [--updates 200] [--repeats 7]

``--what train-and-evaluate``: the demo's model (examples/demo.py: a 64-64-10
MLP on scikit-learn's digits, momentum, clipping) trained for ``--steps``
steps with the held-out set evaluated every ``--eval-every`` steps and at the
end (accuracy, mean per-class accuracy, loss), by ``monitored.train_and_evaluate``
(no model directory: the state in memory is evaluated; installed plugins off)
and by a hand-written loop calling the same step functions, on the same batches
and the same evaluation steps (both must give the same final metrics). Runs
alternate; medians of wall time and of process CPU time are compared (CPU time
is less disturbed by other jobs on a shared machine); the target is at most 1.05.

    python benchmarks/evaluation.py --what train-and-evaluate [--steps 1000] [--eval-every 100]

With ``--model-dir`` it runs as a user runs it by default: the installed
plugins loaded with their defaults (checkpoint, summaries, NaN guard, progress,
early stopping and MLflow off until configured), a fresh model directory per
run, a checkpoint every ``--eval-every`` steps (``save_checkpoint_steps``;
``EvalSpec(throttle_secs=0)``, so each new checkpoint is evaluated) and the
session's default ``global_step/sec`` every 100 steps. The hand-written loop
then does the same work by hand: a ``safetensors`` checkpoint of the state's
arrays at the same steps (temporary name, ``fsync``, rename, the newest five
kept), the same evaluations, ``tensorboardX`` scalars (the evaluation results
into ``eval``, ``global_step/sec`` every 100 steps), ``np.isnan`` of the loss
every step and a clock check for a progress line every 30 s. Both must give
the same final metrics, evaluate as often and write as many checkpoints, or
the script fails. ``--dir`` is the parent of the scratch directories.

    python benchmarks/evaluation.py --what train-and-evaluate --model-dir [--dir DIR]

``--what evaluate-once``: the fixed cost of one evaluation: ``evaluate_once``
over the demo's held-out set (a ``MonitoredSession`` of its own) against the
same eval steps and metric results written inline; CPU time per evaluation,
median of ``--repeats`` runs of 20.

``--what train-input``: what reading ``TrainSpec(input_fn=...)`` through
``monitored.data.prefetch`` (as ``train_and_evaluate`` and ``Experiment`` do,
for exact resume) costs per step: a ``MonitoredTrainingSession`` loop with a
no-op step over ``--steps`` batches of a list and of a generator, the input
iterated directly (what they did before) against the same input through the
pipeline they make (tasks on the loop's thread, no structure check), and with
the default ``prefetch`` (a worker thread). Runs alternate; CPU microseconds
per step, medians of ``--repeats``.

    python benchmarks/evaluation.py --what train-input [--steps 20000] [--repeats 7]

Prints a markdown table and the command that produced it.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import numpy as np

import monitored
from monitored import metrics as m


def _inline_mean() -> tuple[Callable[[Any, Any, Any], None], Callable[[], float]]:
    acc = np.zeros(2)

    def update(labels: Any, preds: Any, weights: Any) -> None:
        acc[0] += preds.sum(dtype=np.float64)
        acc[1] += preds.size

    return update, lambda: float(acc[0] / acc[1])


def _inline_accuracy() -> tuple[Callable[[Any, Any, Any], None], Callable[[], float]]:
    acc = np.zeros(2)

    def update(labels: Any, preds: Any, weights: Any) -> None:
        acc[0] += (labels == preds).sum(dtype=np.float64)
        acc[1] += labels.size

    return update, lambda: float(acc[0] / acc[1])


def _inline_mse() -> tuple[Callable[[Any, Any, Any], None], Callable[[], float]]:
    acc = np.zeros(2)

    def update(labels: Any, preds: Any, weights: Any) -> None:
        d = np.subtract(labels, preds, dtype=np.float64)
        acc[0] += (d * d * weights).sum()
        acc[1] += weights.sum()

    return update, lambda: float(acc[0] / acc[1])


def _inline_precision() -> tuple[Callable[[Any, Any, Any], None], Callable[[], float]]:
    acc = np.zeros(2)

    def update(labels: Any, preds: Any, weights: Any) -> None:
        lab, pred = labels.astype(bool), preds.astype(bool)
        acc[0] += np.count_nonzero(lab & pred)
        acc[1] += np.count_nonzero(~lab & pred)

    return update, lambda: float(acc[0] / (acc[0] + acc[1]))


def _inline_auc() -> tuple[Callable[[Any, Any, Any], None], Callable[[], float]]:
    thresholds = m.auc_thresholds(200)
    pos, neg = np.zeros(201), np.zeros(201)

    def update(labels: Any, preds: Any, weights: Any) -> None:
        bucket = np.searchsorted(thresholds, preds, side="left")
        lab = labels.astype(bool)
        pos[:] += np.bincount(bucket[lab], minlength=201)
        neg[:] += np.bincount(bucket[~lab], minlength=201)

    return update, lambda: 0.0


def _inline_iou() -> tuple[Callable[[Any, Any, Any], None], Callable[[], float]]:
    cm = np.zeros((10, 10))

    def update(labels: Any, preds: Any, weights: Any) -> None:
        cm[:] += np.bincount(labels * 10 + preds, minlength=100).reshape(10, 10)

    return update, lambda: 0.0


def _time_case(
    label: str,
    make: Callable[[], Any],
    make_inline: Any,
    labels: Any,
    preds: Any,
    weights: Any,
    weighted: bool,
    args: argparse.Namespace,
) -> tuple[float, float]:
    """Median µs per update: (monitored, inline)."""
    w = weights if weighted else None

    def run_monitored() -> None:
        metric = make()
        if label == "Mean":
            for _ in range(args.updates):
                metric.update(preds)
        else:
            for _ in range(args.updates):
                metric.update(labels, preds, w)

    def run_inline() -> None:
        update, _ = make_inline()
        for _ in range(args.updates):
            update(labels, preds, weights)

    run_monitored()
    run_inline()
    mine, theirs = [], []
    for _ in range(args.repeats):
        start = time.perf_counter()
        run_monitored()
        mine.append(time.perf_counter() - start)
        start = time.perf_counter()
        run_inline()
        theirs.append(time.perf_counter() - start)
    return (
        statistics.median(mine) / args.updates * 1e6,
        statistics.median(theirs) / args.updates * 1e6,
    )


def _load_demo() -> ModuleType:
    path = Path(__file__).parent.parent / "examples" / "demo.py"
    spec = importlib.util.spec_from_file_location("demo", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["demo"] = module
    spec.loader.exec_module(module)
    return module


def _train_and_evaluate_row(args: argparse.Namespace) -> None:
    """``train_and_evaluate`` vs a hand-written loop on the demo model, alternating."""
    if not args.model_dir:
        os.environ["MONITORED_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    demo = _load_demo()
    x_train, x_test, y_train, y_test = demo.load_data(0)
    order = np.random.default_rng(0).integers(0, len(y_train), (args.steps, 32))
    batches = [(x_train[i], y_train[i]) for i in order]
    held_out = [(x_test[i : i + 128], y_test[i : i + 128]) for i in range(0, len(y_test), 128)]
    scratch = Path(tempfile.mkdtemp(prefix="monitored-tae-", dir=args.dir))
    runs = iter(range(10**9))
    #: What the last run did: evaluations (calls of the eval input function), and the
    #: steps of the checkpoints it left (the newest five).
    counts: dict[str, Any] = {"evaluations": 0, "checkpoints": []}

    def fresh_state() -> monitored.TrainState:
        state = monitored.TrainState(seed=0)
        demo.init_params(state)
        state.initialized = True
        return state

    def eval_input() -> list[tuple[Any, Any]]:
        counts["evaluations"] += 1
        return held_out

    def fresh_dir() -> Path:
        counts.update(evaluations=0, checkpoints=[])
        path = scratch / str(next(runs))
        path.mkdir()
        return path

    async def with_monitored(model_dir: Path) -> dict[str, float]:
        if not args.model_dir:
            result = await monitored.train_and_evaluate(
                monitored.TrainSpec(demo.train_step, input_fn=lambda: batches),
                monitored.EvalSpec(demo.eval_step, demo.eval_metrics(), input_fn=eval_input),
                state=fresh_state(),
                min_eval_frequency=args.eval_every,
                log_step_count_steps=None,
            )
            return result.metrics
        result = await monitored.train_and_evaluate(
            monitored.TrainSpec(demo.train_step, input_fn=lambda: batches),
            monitored.EvalSpec(
                demo.eval_step, demo.eval_metrics(), input_fn=eval_input, throttle_secs=0
            ),
            model_dir=model_dir,
            state=fresh_state(),
            min_eval_frequency=args.eval_every,
            save_checkpoint_steps=args.eval_every,
        )
        return result.metrics

    def by_hand(model_dir: Path) -> dict[str, float]:
        state = fresh_state()
        metrics = demo.eval_metrics()

        def evaluate() -> dict[str, float]:
            for metric in metrics.values():
                metric.reset()
            for batch in eval_input():
                demo.eval_step(state, batch, metrics)
            return {key: metric.result() for key, metric in metrics.items()}

        last = None
        results: dict[str, float] = {}
        if not args.model_dir:
            for batch in batches:
                demo.train_step(state, batch)
                step = state.global_step
                if last is None or step - last >= args.eval_every:  # the hook's schedule
                    results, last = evaluate(), step
            if last != state.global_step:
                results = evaluate()
            return results
        results = _by_hand_with_model_dir(
            state, demo.train_step, batches, evaluate, model_dir, args
        )
        counts["checkpoints"] = _steps_kept(model_dir, ".safetensors")
        return results

    def timed(fn: Callable[[Path], dict[str, float]]) -> tuple[float, float, dict[str, float]]:
        model_dir = fresh_dir()
        wall, cpu = time.perf_counter(), time.process_time()
        out = fn(model_dir)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        shutil.rmtree(model_dir)
        return wall, cpu, out

    def run_monitored(model_dir: Path) -> dict[str, float]:
        metrics = anyio.run(with_monitored, model_dir)
        counts["checkpoints"] = _steps_kept(model_dir, ".json")
        return metrics

    try:
        *_, expected = timed(by_hand)  # warm-up, both
        done_by_hand = dict(counts)
        *_, got = timed(run_monitored)
        if got != expected:
            raise SystemExit(f"the two loops disagree: {got} != {expected}")
        if args.model_dir and counts != done_by_hand:
            raise SystemExit(f"the two loops did not do the same work: {counts} != {done_by_hand}")
        times: dict[str, list[tuple[float, float]]] = {"monitored": [], "by hand": []}
        for repeat in range(args.repeats):
            pair = [("monitored", run_monitored), ("by hand", by_hand)]
            for name, fn in pair if repeat % 2 == 0 else pair[::-1]:
                wall, cpu, _ = timed(fn)
                times[name].append((wall, cpu))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    evaluations = done_by_hand["evaluations"]
    flags = " --model-dir" if args.model_dir else ""
    print(
        f"python benchmarks/evaluation.py --what train-and-evaluate --steps {args.steps} "
        f"--eval-every {args.eval_every} --repeats {args.repeats}{flags}\n"
    )
    made = (
        f", a checkpoint every {args.eval_every} steps; plugins: "
        f"{', '.join(sorted(_installed_plugins()))}"
        if args.model_dir
        else "; no model directory, installed plugins off"
    )
    print(
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, NumPy {np.__version__}; load average "
        f"{os.getloadavg()[0]:.1f}; {args.steps} steps of batch 32, {evaluations} "
        f"evaluations of {len(y_test)} held-out digits{made}; final accuracy "
        f"{got['accuracy']:.3f}\n"
    )
    print("| loop | wall s (median) | wall min - max | CPU s (median) | ratio wall | ratio CPU |")
    print("|---|--:|--:|--:|--:|--:|")
    base_wall = statistics.median(w for w, _ in times["by hand"])
    base_cpu = statistics.median(c for _, c in times["by hand"])
    for name, label in [("monitored", "train_and_evaluate"), ("by hand", "hand-written loop")]:
        walls, cpus = [w for w, _ in times[name]], [c for _, c in times[name]]
        wall, cpu = statistics.median(walls), statistics.median(cpus)
        print(
            f"| {label} | {wall:.3f} | {min(walls):.3f} - {max(walls):.3f} | {cpu:.3f} | "
            f"{wall / base_wall:.3f} | {cpu / base_cpu:.3f} |"
        )
    paired = [m[1] / h[1] for m, h in zip(times["monitored"], times["by hand"], strict=True)]
    wall_ratio = statistics.median(w for w, _ in times["monitored"]) / base_wall
    cpu_ratio = statistics.median(c for _, c in times["monitored"]) / base_cpu
    print(
        f"\nratio of medians: wall {wall_ratio:.3f}, CPU {cpu_ratio:.3f}; median of paired "
        f"CPU ratios {statistics.median(paired):.3f} (target <= 1.05)"
    )


def _steps_kept(model_dir: Path, suffix: str) -> list[int]:
    """The global steps of the checkpoints left in ``model_dir`` (``model.ckpt-<step><suffix>``)."""
    names = [path.name for path in model_dir.glob(f"model.ckpt-*{suffix}")]
    return sorted(int(name[len("model.ckpt-") : -len(suffix)]) for name in names)


def _installed_plugins() -> list[str]:
    """The names of the installed ``monitored`` plugins (entry points)."""
    from importlib.metadata import entry_points

    return [entry.name for entry in entry_points(group="monitored")]


def _by_hand_with_model_dir(
    state: monitored.TrainState,
    train_step: Callable[[monitored.TrainState, Any], dict[str, Any]],
    batches: list[tuple[Any, Any]],
    evaluate: Callable[[], dict[str, float]],
    model_dir: Path,
    args: argparse.Namespace,
) -> dict[str, float]:
    """The default install's work written by hand: checkpoints, evaluations, scalars."""
    from safetensors.numpy import save_file
    from tensorboardX import SummaryWriter

    writer = SummaryWriter(str(model_dir))
    eval_writer = SummaryWriter(str(model_dir / "eval"))
    kept: list[Path] = []

    def save() -> None:
        step = state.global_step
        arrays = {name: state[name] for name in state}
        path = model_dir / f"model.ckpt-{step}.safetensors"
        tmp = path.with_suffix(".tmp")
        save_file(arrays, str(tmp), metadata={"global_step": str(step)})
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        kept.append(path)
        if len(kept) > 5:  # the checkpoint plugin's max_to_keep
            kept.pop(0).unlink()

    results: dict[str, float] = {}
    last = 0
    save()  # as the session's first checkpoint, at creation
    clock = time.monotonic()
    last_line, next_line = clock, clock + 30.0
    for batch in batches:
        out = train_step(state, batch)
        if np.isnan(out["loss"]):
            raise FloatingPointError(f"loss is NaN at step {state.global_step}")
        step = state.global_step
        now = time.monotonic()
        if now >= next_line:
            print(f"step {step}", file=sys.stderr)
            next_line = now + 30.0
        if step % 100 == 0:
            writer.add_scalar("global_step/sec", 100 / max(now - last_line, 1e-9), step)
            last_line = now
        if step % args.eval_every == 0:
            results, last = evaluate(), step
            for key, value in results.items():
                eval_writer.add_scalar(key, value, step)
            save()
    if last != state.global_step:
        results = evaluate()
        for key, value in results.items():
            eval_writer.add_scalar(key, value, state.global_step)
        save()
    writer.close()
    eval_writer.close()
    return results


def _evaluate_once_row(args: argparse.Namespace) -> None:
    """CPU per ``evaluate_once`` of the demo's held-out set vs the same work inline."""
    os.environ["MONITORED_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    demo = _load_demo()
    _, x_test, _, y_test = demo.load_data(0)
    held_out = [(x_test[i : i + 128], y_test[i : i + 128]) for i in range(0, len(y_test), 128)]
    state = monitored.TrainState(seed=0)
    demo.init_params(state)
    state.initialized = True
    n = 20

    async def sessions() -> None:
        for _ in range(n):
            await monitored.evaluate_once(
                demo.eval_step, demo.eval_metrics(), input=held_out, state=state
            )

    def inline() -> None:
        for _ in range(n):
            metrics = demo.eval_metrics()
            for batch in held_out:
                demo.eval_step(state, batch, metrics)
            {key: metric.result() for key, metric in metrics.items()}

    def cpu_ms(fn: Callable[[], None]) -> float:
        start = time.process_time()
        fn()
        return (time.process_time() - start) / n * 1e3

    mine, theirs = [], []
    for _ in range(args.repeats + 1):  # the first pair warms up
        mine.append(cpu_ms(lambda: anyio.run(sessions)))
        theirs.append(cpu_ms(inline))
    a, b = statistics.median(mine[1:]), statistics.median(theirs[1:])
    print(f"python benchmarks/evaluation.py --what evaluate-once --repeats {args.repeats}\n")
    print(f"evaluate_once: {a:.2f} ms CPU per evaluation; inline: {b:.2f} ms (median of")
    print(f"{args.repeats} x {n}; {len(y_test)} held-out digits in {len(held_out)} batches)")


def _train_input_row(args: argparse.Namespace) -> None:
    """CPU per step of a session loop whose input is iterated directly or through prefetch."""
    os.environ["MONITORED_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    batches = [np.ones(2)] * args.steps

    def generator() -> Any:
        yield from batches

    def step(state: monitored.TrainState, batch: Any) -> None:
        state.global_step += 1

    async def direct(source: Callable[[], Any]) -> None:
        state = monitored.TrainState()
        async with monitored.MonitoredTrainingSession(state, log_step_count_steps=None) as sess:
            for batch in source():
                if sess.should_stop():
                    break
                await sess.run(step, batch)

    async def piped(source: Callable[[], Any], **options: Any) -> None:
        state = monitored.TrainState()
        pipeline = monitored.data.prefetch(source(), name="train_input_fn", **options)
        async with monitored.MonitoredTrainingSession(
            state, hooks=[pipeline], log_step_count_steps=None
        ) as sess:
            async for batch in pipeline:
                await sess.run(step, batch)

    loops: dict[str, Callable[[Callable[[], Any]], Any]] = {
        "iterated directly (before)": direct,
        "prefetch, tasks, no check (TrainSpec now)": lambda src: piped(
            src, threads=False, check=False
        ),
        "prefetch, default (a worker thread)": piped,
    }
    print(
        f"python benchmarks/evaluation.py --what train-input --steps {args.steps} "
        f"--repeats {args.repeats}\n"
    )
    print(
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, NumPy {np.__version__}; load average "
        f"{os.getloadavg()[0]:.1f}\n"
    )
    print("| input | loop | CPU us/step (median) | ratio |")
    print("|---|---|--:|--:|")
    for label, source in [("a list", lambda: batches), ("a generator", generator)]:
        cpu: dict[str, list[float]] = {name: [] for name in loops}
        for repeat in range(args.repeats + 1):  # the first round warms up
            order = list(loops) if repeat % 2 == 0 else list(loops)[::-1]
            for name in order:
                start = time.process_time()
                anyio.run(loops[name], source)
                if repeat:
                    cpu[name].append((time.process_time() - start) / args.steps * 1e6)
        base = statistics.median(cpu["iterated directly (before)"])
        for name, values in cpu.items():
            value = statistics.median(values)
            print(f"| {label} | {name} | {value:.1f} | {value / base:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--what",
        choices=["metrics", "train-and-evaluate", "evaluate-once", "train-input"],
        default="metrics",
    )
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--updates", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument(
        "--model-dir",
        action="store_true",
        help="train-and-evaluate as by default: installed plugins and a model directory",
    )
    parser.add_argument("--dir", default=None, help="parent of the scratch model directories")
    args = parser.parse_args()
    if args.what == "train-and-evaluate":
        _train_and_evaluate_row(args)
        return
    if args.what == "evaluate-once":
        _evaluate_once_row(args)
        return
    if args.what == "train-input":
        _train_input_row(args)
        return
    rng = np.random.default_rng(0)
    n = args.batch
    binary = rng.integers(0, 2, n)
    scores = rng.random(n).astype(np.float32)
    weights = rng.random(n)
    classes, predicted = rng.integers(0, 10, n), rng.integers(0, 10, n)
    hard = (scores > 0.5).astype(np.int64)
    cases: list[tuple[str, Callable[[], Any], Any, Any, Any, bool]] = [
        ("Mean", m.Mean, _inline_mean, binary, scores, False),
        ("Accuracy", m.Accuracy, _inline_accuracy, binary, hard, False),
        ("MeanSquaredError (weighted)", m.MeanSquaredError, _inline_mse, scores, binary, True),
        ("Precision", m.Precision, _inline_precision, binary, hard, False),
        ("AUC (200 thresholds)", m.AUC, _inline_auc, binary, scores, False),
        ("MeanIoU (10 classes)", lambda: m.MeanIoU(10), _inline_iou, classes, predicted, False),
    ]
    print(
        f"python benchmarks/evaluation.py --batch {n} --updates {args.updates} "
        f"--repeats {args.repeats}\n"
    )
    print(
        f"Machine: {platform.machine()}, Python {platform.python_version()}, "
        f"NumPy {np.__version__}, batch {n}\n"
    )
    print("| metric | monitored (µs/update) | inline NumPy (µs/update) | ratio |")
    print("|---|---:|---:|---:|")
    ratios = []
    for label, make, make_inline, labels, preds, weighted in cases:
        a, b = _time_case(label, make, make_inline, labels, preds, weights, weighted, args)
        ratios.append(a / b)
        print(f"| {label} | {a:.1f} | {b:.1f} | {a / b:.2f} |")
    print(f"\nworst ratio {max(ratios):.2f}", file=sys.stdout)


if __name__ == "__main__":
    main()
