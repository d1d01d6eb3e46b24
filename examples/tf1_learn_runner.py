"""A ``tf.contrib.learn`` trainer ported: ``learn_runner.run(experiment_fn, output_dir)``.

GoogleCloudPlatform's ``cloudml-dist-mnist-example`` trains MNIST with an
``Estimator`` inside a contrib ``Experiment`` (``eval_metrics`` of
``MetricSpec(metric_fn=streaming_accuracy, prediction_key="classes")``,
``min_eval_frequency=1``, ``train_steps``, ``eval_steps``) and lets
``learn_runner.run(generate_experiment_fn(...), output_dir)`` pick the
schedule of each task (``train_and_evaluate`` when run alone). This is that
program on ``monitored.estimator`` (our own code): scikit-learn's 8x8 digits
stand in for MNIST, and the convolutional network for a hidden layer of 64
units with dropout (drawn from the state's generator, saved with every
checkpoint, so a resumed run drops the same units as an uninterrupted one).

* ``Experiment(export_strategies=...)`` -> dropped: nothing exports a
  SavedModel here; ``Estimator.predict`` serves from the checkpoint;
* ``model_fn`` -> :func:`model_fn`, its gradients written out by hand.

Run: ``python examples/tf1_learn_runner.py --output-path runs/tf1_learn_runner``
(``--train-steps``); run it again with more steps and it resumes.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from typing import Any

import anyio
import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import monitored
from monitored.estimator import (
    Estimator,
    EstimatorSpec,
    Experiment,
    MetricSpec,
    ModeKeys,
    RunConfig,
    current_state,
    get_variable,
    learn_runner,
    numpy_input_fn,
    zeros_initializer,
)

HIDDEN = 64
DROPOUT = 0.4  # tf.layers.dropout(rate=0.4), in training only


def load_data(seed: int = 0) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """``(train images, labels), (eval images, labels)``: pixels scaled to [0, 1]."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_train, x_eval, y_train, y_eval = train_test_split(
        x, digits.target, test_size=0.2, random_state=seed, stratify=digits.target
    )
    return (x_train, y_train), (x_eval, y_eval)


def model_fn(features: np.ndarray, labels: Any, mode: str, params: dict[str, Any]) -> EstimatorSpec:
    """A hidden layer with dropout and a softmax: the trainer's ``model_fn``, on arrays."""
    state = current_state()
    w1 = get_variable("dense/kernel", (features.shape[1], HIDDEN))
    b1 = get_variable("dense/bias", (HIDDEN,), initializer=zeros_initializer())
    w2 = get_variable("logits/kernel", (HIDDEN, 10))
    b2 = get_variable("logits/bias", (10,), initializer=zeros_initializer())
    hidden = np.maximum(features @ w1 + b1, 0)
    keep = None
    if mode == ModeKeys.TRAIN:
        keep = ((state.rng.random(hidden.shape) >= DROPOUT) / (1 - DROPOUT)).astype(np.float32)
        hidden = hidden * keep
    logits = hidden @ w2 + b2
    predictions = {"classes": logits.argmax(axis=1), "logits": logits}
    if mode == ModeKeys.PREDICT:
        return EstimatorSpec(mode, predictions=predictions)
    log_probabilities = logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)
    rows = np.arange(len(labels))
    loss = -log_probabilities[rows, labels].mean()
    if mode == ModeKeys.EVAL:
        return EstimatorSpec(mode, loss=loss, predictions=predictions)

    d_logits = np.exp(log_probabilities)
    d_logits[rows, labels] -= 1
    d_logits /= len(labels)
    d_hidden = (d_logits @ w2.T) * (hidden > 0) * keep
    grads = {
        "dense/kernel": features.T @ d_hidden,
        "dense/bias": d_hidden.sum(axis=0),
        "logits/kernel": hidden.T @ d_logits,
        "logits/bias": d_logits.sum(axis=0),
    }
    optimizer = params["optimizer"]
    return EstimatorSpec(mode, loss=loss, train_op=lambda: optimizer.apply_gradients(state, grads))


def build_estimator(output_dir: str, seed: int) -> Estimator:
    """The trainer's ``build_estimator``: checkpoints every 50 steps, 3 kept."""
    return Estimator(
        model_fn,
        model_dir=output_dir,
        config=RunConfig(tf_random_seed=seed, save_checkpoints_steps=50, keep_checkpoint_max=3),
        params={"optimizer": monitored.MomentumOptimizer(0.1, momentum=0.9)},
    )


def generate_experiment_fn(
    train_batch_size: int = 100,
    eval_batch_size: int = 100,
    train_steps: int = 1000,
    eval_steps: int | None = None,
    seed: int = 0,
    **experiment_args: Any,
) -> Callable[[str], Experiment]:
    """The trainer's ``generate_experiment_fn``: an Experiment for ``output_dir``."""
    (x_train, y_train), (x_eval, y_eval) = load_data(seed)

    def experiment_fn(output_dir: str) -> Experiment:
        return Experiment(
            build_estimator(output_dir, seed),
            train_input_fn=numpy_input_fn(
                x_train, y_train, train_batch_size, num_epochs=None, shuffle=True, seed=seed
            ),
            eval_input_fn=numpy_input_fn(x_eval, y_eval, eval_batch_size, shuffle=False),
            eval_metrics={
                "accuracy": MetricSpec(
                    metric_fn=monitored.metrics.Accuracy, prediction_key="classes"
                )
            },
            train_steps=train_steps,
            eval_steps=eval_steps,
            **experiment_args,
        )

    return experiment_fn


async def run(output_path: str, train_steps: int, seed: int = 0) -> dict[str, Any]:
    """``learn_runner.run`` of the trainer's experiment: the final evaluation's result."""
    eval_result, export_results = await learn_runner.run(
        generate_experiment_fn(train_steps=train_steps, seed=seed, min_eval_frequency=200),
        output_path,
    )
    assert export_results == []  # no export_strategies: nothing is exported here
    result: dict[str, Any] = eval_result
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-path", default="runs/tf1_learn_runner")
    parser.add_argument("--train-steps", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    result = anyio.run(run, args.output_path, args.train_steps, args.seed)
    print(
        f"after {result['global_step']} steps: accuracy {result['accuracy']:.4f}, "
        f"loss {result['loss']:.4f}"
    )


if __name__ == "__main__":
    main()
