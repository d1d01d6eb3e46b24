"""Train a small neural network on scikit-learn's handwritten digits with monitored.

A one-hidden-layer MLP in plain NumPy (hand-written backprop), trained and
evaluated on held-out data by ``monitored.train_and_evaluate`` (TF Estimator's,
on an async ``MonitoredTrainingSession``). It shows the pieces working together:

* ``TrainSpec(max_steps=...)`` ends training at a fixed global step;
  ``EvalSpec`` evaluates held-out accuracy, mean per-class accuracy and loss
  (``monitored.metrics``) every 100 steps and once at the end; the last line
  printed is the final evaluation;
* ``LoggingTensorHook`` logs the loss, fetched in the session's batched transfer;
* ``StepCounterHook`` (a ``MonitoredTrainingSession`` default) logs steps/sec;
* ``MomentumOptimizer`` with an ``exponential_decay`` schedule and
  ``clip_by_global_norm`` update the weights; its slots live in the state;
* with the ``monitored-checkpoint`` plugin installed, checkpoints go to
  ``--checkpoint-dir`` (default ``runs/demo``) and a second run resumes from
  them, bit for bit: ``monitored.data.shuffle_batch`` prepares the batches in
  two threads ahead of the step and saves its position with each checkpoint.
  Run it again with a larger ``--steps`` to train further;
* with ``monitored-early-stopping``, training stops once held-out accuracy has
  not improved for 3 evaluations (the hook hears each evaluation through the
  ``after_evaluate`` hook);
* with ``monitored-summaries``, the step's scalar outputs (loss, gradient norm,
  learning rate: the same as MLflow gets), a ``w1`` histogram and
  ``global_step/sec`` go to ``runs/demo`` and the evaluations to one event file
  in ``runs/demo/eval`` (``tensorboard --logdir runs/demo``);
* with ``monitored-mlflow``, the run is logged to MLflow: parameters (the
  optimizer's settings among them), loss, learning rate, gradient norm,
  ``global_step/sec`` and the held-out evaluations, into ``MLFLOW_TRACKING_URI``
  or else ``<checkpoint-dir>/mlflow.db``; a resumed run continues the same
  MLflow run (``mlflow ui --backend-store-uri sqlite:///runs/demo/mlflow.db``).
  MLflow works in a process of its own, so training does not wait for it; the
  end of the run does, for the last points (creating the database the first
  time takes a few seconds). ``--no-mlflow`` leaves it out;
* with ``monitored-nan-guard`` and ``monitored-progress`` installed (``uv run
  --all-packages`` installs the workspace), a NaN loss stops training with TF1's
  error and a progress bar shows on a terminal, without a line of code here.

Run it with ``python examples/demo.py`` (``--steps``, ``--seed``, ``--checkpoint-dir``,
``--no-mlflow``).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import shlex
import signal
from typing import Any

import anyio
import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import monitored
from monitored.evaluation import EvaluationResult

log = logging.getLogger("demo")


def load_data(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Digits scaled to [0, 1], split 80/20 into train and held-out test sets."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=seed, stratify=y
    )
    return x_train, x_test, y_train, y_test


LEARNING_RATE = monitored.exponential_decay(0.05, decay_steps=1000, decay_rate=0.5)
OPTIMIZER = monitored.MomentumOptimizer(LEARNING_RATE, momentum=0.9)


def init_params(state: monitored.TrainState, n_in: int = 64, n_hidden: int = 64) -> None:
    """He-initialized weights drawn from the state's RNG, and the optimizer's slots."""
    rng = state.rng
    shapes = {"w1": (n_in, n_hidden), "b1": (n_hidden,), "w2": (n_hidden, 10), "b2": (10,)}
    for name, shape in shapes.items():
        fan_in = shape[0] if len(shape) == 2 else 1
        value = rng.normal(0, np.sqrt(2 / fan_in), shape) if len(shape) == 2 else np.zeros(shape)
        state[name] = value.astype(np.float32)
    OPTIMIZER.create_slots(state)


def forward(state: monitored.TrainState, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    hidden = np.maximum(x @ state["w1"] + state["b1"], 0)
    logits = hidden @ state["w2"] + state["b2"]
    return hidden, logits


def train_step(state: monitored.TrainState, batch: tuple[np.ndarray, np.ndarray]) -> dict[str, Any]:
    """One momentum step on softmax cross-entropy; returns loss, gradient norm and rate."""
    x, y = batch
    hidden, logits = forward(state, x)
    logits -= logits.max(axis=1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=1, keepdims=True)
    loss = -np.log(probs[np.arange(len(y)), y] + 1e-12).mean()

    d_logits = probs
    d_logits[np.arange(len(y)), y] -= 1
    d_logits /= len(y)
    grads = {"w2": hidden.T @ d_logits, "b2": d_logits.sum(axis=0)}
    d_hidden = (d_logits @ state["w2"].T) * (hidden > 0)
    grads |= {"w1": x.T @ d_hidden, "b1": d_hidden.sum(axis=0)}
    learning_rate = LEARNING_RATE(state.global_step)  # the rate this step applies
    names = list(grads)
    clipped, norm = monitored.clip_by_global_norm([grads[n] for n in names], clip_norm=5.0)
    OPTIMIZER.apply_gradients(state, dict(zip(names, clipped, strict=True)))  # global_step += 1
    return {"loss": loss, "grad_norm": norm, "learning_rate": learning_rate}


def accuracy(state: monitored.TrainState, x: np.ndarray, y: np.ndarray) -> float:
    _, logits = forward(state, x)
    return float((logits.argmax(axis=1) == y).mean())


def eval_step(
    state: monitored.TrainState,
    batch: tuple[np.ndarray, np.ndarray],
    metrics: dict[str, monitored.metrics.Metric],
) -> None:
    """Held-out accuracy, mean per-class accuracy and loss of one batch, streamed."""
    x, y = batch
    _, logits = forward(state, x)
    predicted = logits.argmax(axis=1)
    metrics["accuracy"].update(y, predicted)
    metrics["per_class_accuracy"].update(y, predicted)
    logits = logits - logits.max(axis=1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    metrics["loss"].update(-log_probs[np.arange(len(y)), y])


def eval_metrics() -> dict[str, monitored.metrics.Metric]:
    return {
        "accuracy": monitored.metrics.Accuracy(),
        "per_class_accuracy": monitored.metrics.MeanPerClassAccuracy(10),
        "loss": monitored.metrics.Mean(),
    }


def mlflow_hook(checkpoint_dir: str) -> Any:
    """Log the run to MLflow: ``MLFLOW_TRACKING_URI``, else a database in ``checkpoint_dir``."""
    from monitored_mlflow import MlflowHook  # parameters, scalars, evaluations

    os.makedirs(checkpoint_dir, exist_ok=True)
    uri = os.environ.get("MLFLOW_TRACKING_URI") or (
        f"sqlite:///{os.path.abspath(checkpoint_dir)}/mlflow.db"
    )
    return MlflowHook(uri, experiment="demo", optimizer=OPTIMIZER, params={"batch_size": 32})


async def train(
    steps: int,
    seed: int = 0,
    checkpoint_dir: str | None = None,
    eval_every: int = 100,
    mlflow: bool = False,
) -> monitored.TrainState:
    """Train up to global step ``steps``, resuming from ``checkpoint_dir`` if it has one.

    The trained state; :func:`run` says more (the last evaluation, a signal).
    """
    state, _ = await run(steps, seed, checkpoint_dir, eval_every, mlflow)
    return state


async def run(
    steps: int,
    seed: int = 0,
    checkpoint_dir: str | None = None,
    eval_every: int = 100,
    mlflow: bool = False,
) -> tuple[monitored.TrainState, EvaluationResult]:
    """Train up to global step ``steps``, resuming from ``checkpoint_dir`` if it has one.

    The held-out set is evaluated every ``eval_every`` steps (after the checkpoint
    of that step, with a ``checkpoint_dir``) and once at the end; the early
    stopping hook, when installed, ends training once held-out accuracy stops
    improving. ``mlflow`` logs the run to MLflow, when ``monitored-mlflow`` is
    installed and there is a ``checkpoint_dir`` (the command line's default).
    """
    x_train, x_test, y_train, y_test = load_data(seed)
    state = monitored.TrainState(seed=seed)
    hooks: list[object] = [
        monitored.LoggingTensorHook(
            {"step": "global_step", "loss": "loss", "grad norm": "grad_norm"}, every_n_iter=200
        ),
    ]
    if importlib.util.find_spec("monitored_early_stopping"):
        from monitored_early_stopping import EarlyStoppingHook

        # Judges each held-out evaluation (every_n_steps=0: reported metrics).
        hooks.append(EarlyStoppingHook("accuracy", min_delta=0.002, patience=3, every_n_steps=0))
    if checkpoint_dir is not None and importlib.util.find_spec("monitored_summaries"):
        from monitored_summaries import SummarySaverHook  # loss, learning rate and w1

        hooks.append(
            SummarySaverHook(
                save_steps=100,
                output_dir=checkpoint_dir,
                scalars=["loss", "learning_rate"],
                histograms=["w1"],
                step_outputs=True,  # grad_norm too: what MLflow logs, TensorBoard shows
            )
        )
    tracking: Any = None
    if checkpoint_dir is not None and mlflow and importlib.util.find_spec("monitored_mlflow"):
        tracking = mlflow_hook(checkpoint_dir)
        hooks.append(tracking)
    # Shuffled batches of 32, made ahead by two threads and fed to train_step as
    # `batch`; their position is saved with each checkpoint (exact resume).
    hooks.append(
        monitored.data.shuffle_batch(
            (x_train, y_train),
            32,
            capacity=256,
            min_after_dequeue=128,
            num_threads=2,
            seed=seed,
            enqueue_many=True,
            feed="batch",
            name="digits",
        )
    )
    held_out = [(x_test[i : i + 128], y_test[i : i + 128]) for i in range(0, len(y_test), 128)]
    result = await monitored.train_and_evaluate(
        monitored.TrainSpec(train_step, max_steps=steps, hooks=hooks),
        monitored.EvalSpec(eval_step, eval_metrics(), input_fn=lambda: held_out, throttle_secs=0),
        model_dir=checkpoint_dir,
        state=state,
        scaffold=monitored.Scaffold(init_fn=init_params),
        min_eval_frequency=eval_every,
        save_checkpoint_steps=eval_every,
        log_step_count_steps=500,
    )
    if tracking is not None:
        uri = tracking.tracking_uri
        if tracking.run_id is None:  # never print a run that does not exist
            print(f"nothing was logged to MLflow: no run could be created on {uri} (see above)")
        else:
            command = f"mlflow ui --backend-store-uri {shlex.quote(uri)}"  # pasted as is
            print(f"logged to MLflow run {tracking.run_id} ({command})")
    metrics = result.metrics
    print(
        f"held-out accuracy after {result.global_step} steps: {metrics['accuracy']:.3f} "
        f"(mean per-class {metrics['per_class_accuracy']:.3f})"
    )
    return state, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000, help="train up to this global step")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--checkpoint-dir",
        default="runs/demo",
        help="checkpoints go here; a second run resumes from them ('' for none; "
        "needs the monitored-checkpoint plugin)",
    )
    parser.add_argument(
        "--mlflow",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="log the run to MLflow when monitored-mlflow is installed (MLFLOW_TRACKING_URI, "
        "else <checkpoint-dir>/mlflow.db); --no-mlflow leaves it out",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    try:
        _, result = anyio.run(
            run, args.steps, args.seed, args.checkpoint_dir or None, 100, args.mlflow
        )
    except (monitored.RunOwnedError, monitored.UnconnectedTasksError) as exc:
        # Not a bug to debug but a run to start elsewhere: the message says what to do.
        raise SystemExit(f"demo: {exc}") from None
    if result.stopped_by_signal is not None:
        # Interrupted is not finished: a shell (`demo && next`) or a scheduler must
        # be able to tell. The checkpoint of the last step is saved: run it again.
        print(f"demo: stopped by {result.stopped_by_signal} at step {result.global_step}")
        raise SystemExit(128 + signal.Signals[result.stopped_by_signal].value)


if __name__ == "__main__":
    main()
