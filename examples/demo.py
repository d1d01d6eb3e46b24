"""Train a small neural network on scikit-learn's handwritten digits with monitored.

A one-hidden-layer MLP in plain NumPy (hand-written backprop), driven by an async
``MonitoredTrainingSession``. It shows the pieces working together:

* ``StopAtStepHook`` ends training at a fixed global step;
* ``LoggingTensorHook`` logs the loss, fetched in the session's batched transfer;
* ``StepCounterHook`` (a ``MonitoredTrainingSession`` default) logs steps/sec;
* ``EvalHook`` (written below, async) measures held-out accuracy every few hundred
  steps and keeps the best value as plugin state;
* ``MomentumOptimizer`` with an ``exponential_decay`` schedule and
  ``clip_by_global_norm`` update the weights; its slots live in the state;
* with the ``monitored-checkpoint`` plugin installed, checkpoints go to
  ``--checkpoint-dir`` (default ``runs/demo``) and a second run resumes from
  them, bit for bit: ``monitored.data.shuffle_batch`` prepares the batches in
  two threads ahead of the step and saves its position with each checkpoint.
  Run it again with a larger ``--steps`` to train further;
* with ``monitored-nan-guard`` and ``monitored-progress`` installed (``uv run
  --all-packages`` installs the workspace), a NaN loss stops training with TF1's
  error and a progress bar shows on a terminal, without a line of code here.

Run it with ``python examples/demo.py`` (``--steps``, ``--seed``, ``--checkpoint-dir``).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
from typing import Any

import anyio
import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import monitored

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


OPTIMIZER = monitored.MomentumOptimizer(
    monitored.exponential_decay(0.05, decay_steps=1000, decay_rate=0.5), momentum=0.9
)


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
    """One momentum step on softmax cross-entropy; returns the loss and gradient norm."""
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
    names = list(grads)
    clipped, norm = monitored.clip_by_global_norm([grads[n] for n in names], clip_norm=5.0)
    OPTIMIZER.apply_gradients(state, dict(zip(names, clipped, strict=True)))  # global_step += 1
    return {"loss": loss, "grad_norm": norm}


def accuracy(state: monitored.TrainState, x: np.ndarray, y: np.ndarray) -> float:
    _, logits = forward(state, x)
    return float((logits.argmax(axis=1) == y).mean())


class EvalHook:
    """Evaluates held-out accuracy every ``every_n_steps``; remembers the best.

    Its ``best`` survives checkpoints through the ``plugin_state`` hooks.
    """

    plugin_name = "eval"  # keys its state in checkpoints, wherever it sits in the list

    def __init__(self, x: np.ndarray, y: np.ndarray, every_n_steps: int) -> None:
        self.x, self.y = x, y
        self.timer = monitored.SecondOrStepTimer(every_steps=every_n_steps)
        self.best = 0.0

    async def after_run(self, run_context: monitored.SessionRunContext) -> None:
        state = run_context.session.state
        if not self.timer.should_trigger_for_step(state.global_step):
            return
        self.timer.update_last_triggered_step(state.global_step)
        acc = await anyio.to_thread.run_sync(accuracy, state, self.x, self.y)
        self.best = max(self.best, acc)
        log.info("step %4d  held-out accuracy %.3f (best %.3f)", state.global_step, acc, self.best)
        if run_context.session.has_summary_sinks:  # TensorBoard, with monitored-summaries
            await run_context.session.write_summaries(state.global_step, {"accuracy": acc})

    def plugin_state(self) -> dict[str, float]:
        return {"best": self.best}

    def load_plugin_state(self, state: dict[str, float]) -> None:
        self.best = state["best"]


async def train(
    steps: int, seed: int = 0, checkpoint_dir: str | None = None
) -> monitored.TrainState:
    """Train up to global step ``steps``, resuming from ``checkpoint_dir`` if it has one."""
    x_train, x_test, y_train, y_test = load_data(seed)
    state = monitored.TrainState(seed=seed)
    hooks = [
        monitored.StopAtStepHook(last_step=steps),
        monitored.LoggingTensorHook(
            {"step": "global_step", "loss": "loss", "grad norm": "grad_norm"}, every_n_iter=200
        ),
        EvalHook(x_test, y_test, every_n_steps=500),
    ]
    if checkpoint_dir is not None and importlib.util.find_spec("monitored_summaries"):
        from monitored_summaries import SummarySaverHook  # loss and w1 into runs/demo

        hooks.append(
            SummarySaverHook(
                save_steps=100, output_dir=checkpoint_dir, scalars=["loss"], histograms=["w1"]
            )
        )
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
    async with monitored.MonitoredTrainingSession(
        state,
        hooks=hooks,
        scaffold=monitored.Scaffold(init_fn=init_params),
        checkpoint_dir=checkpoint_dir,
        log_step_count_steps=500,
    ) as sess:
        if sess.restored_from is not None:
            print(f"resumed from {sess.restored_from} at step {state.global_step}")
        while not sess.should_stop():
            await sess.run(train_step)
    final = accuracy(state, x_test, y_test)
    print(f"held-out accuracy after {state.global_step} steps: {final:.3f}")
    return state


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
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    anyio.run(train, args.steps, args.seed, args.checkpoint_dir or None)


if __name__ == "__main__":
    main()
