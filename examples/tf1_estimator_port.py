"""A TF Estimator script ported: ``train_and_evaluate`` with ``TrainSpec(input_fn=...)``.

GoogleCloudPlatform/cloudml-samples' census trainer is a typical
``tf.estimator`` program: flags become a ``RunConfig`` (model directory,
checkpoint and summary intervals, how many checkpoints to keep), a wide-and-deep
``DNNLinearCombinedClassifier`` (FTRL on the sparse "wide" columns, Adagrad on
the dense network), an ``input_fn`` of shuffled batches in a ``TrainSpec``, an
``EvalSpec`` over the held-out file, and ``tf.estimator.train_and_evaluate``.
This is the same program written for ``monitored`` (our own code; scikit-learn's
offline breast-cancer data instead of the census file: a binary label, as
census' income bracket), kept piece by piece so the two read side by side:

* ``input_fn`` -> :func:`input_fn`, a plain generator of shuffled batches
  (seeded). ``TrainSpec(input_fn=...)`` reads it through
  ``monitored.data.prefetch``, which saves its position with every checkpoint:
  a run killed and started again trains on exactly the batches an uninterrupted
  one does, and ends bit for bit equal to it;
* the wide columns (``bucketized_column``) -> one-hot quantile buckets of each
  feature; the deep columns -> the standardized features;
* ``DNNLinearCombinedClassifier`` -> :func:`train_step`: a linear part trained
  by ``FtrlOptimizer`` and a one-hidden-layer network trained by
  ``AdagradOptimizer`` (the canned estimator's defaults), logistic loss. The
  biases are 0-d entries whose gradient is a NumPy scalar (``d.sum()`` is an
  ``np.float32``), which the optimizers take as TF1 took a 0-d tensor;
* the canned estimator's metrics -> ``monitored.metrics`` (``accuracy``,
  ``auc``, ``auc_precision_recall``, ``precision``, ``recall``,
  ``average_loss``), streamed over the held-out batches by :func:`eval_step`;
* ``RunConfig(model_dir, save_checkpoints_steps, keep_checkpoint_max,
  save_summary_steps, log_step_count_steps)`` -> the keyword arguments of
  ``train_and_evaluate`` (``docs/tf1-migration.md`` has the table);
* ``EvalSpec(exporters=[FinalExporter(...)])`` and the serving input function
  -> dropped: the checkpoint holds the trained arrays and :func:`predict` is
  the serving function (``docs/evaluation.md``, "Serving a trained model").

Run: ``python examples/tf1_estimator_port.py`` (``--max-steps``, ``--model-dir``,
``--seed``); run it again with a larger ``--max-steps`` and it resumes.
"""

from __future__ import annotations

import argparse
import itertools
import logging
from collections.abc import Iterator

import anyio
import numpy as np
from sklearn.datasets import load_breast_cancer
from sklearn.model_selection import train_test_split

import monitored
from monitored import metrics

BATCH_SIZE = 32
BUCKETS = 4  # quantile buckets per feature: the wide part's bucketized columns
HIDDEN = 16
LINEAR_OPTIMIZER = monitored.FtrlOptimizer(0.2)  # the canned estimator's linear default
DNN_OPTIMIZER = monitored.AdagradOptimizer(0.05)  # ... and its network's

Batch = tuple[np.ndarray, np.ndarray, np.ndarray]


def load_data(seed: int) -> tuple[Batch, Batch]:
    """``(wide, deep, label)`` of the training and held-out examples (80/20).

    The bucket edges and the standardization come from the training examples
    only, as a feature column's vocabulary and normalizer would.
    """
    data = load_breast_cancer()
    x = data.data.astype(np.float32)
    y = data.target.astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=seed, stratify=y
    )
    mean, std = x_train.mean(axis=0), x_train.std(axis=0)
    edges = np.quantile(x_train, np.linspace(0, 1, BUCKETS + 1)[1:-1], axis=0).T

    def columns(features: np.ndarray, labels: np.ndarray) -> Batch:
        buckets = np.stack(
            [np.searchsorted(edges[i], features[:, i]) for i in range(features.shape[1])], 1
        )
        wide = np.zeros((len(features), features.shape[1] * BUCKETS), np.float32)
        wide[
            np.arange(len(features))[:, None], np.arange(features.shape[1]) * BUCKETS + buckets
        ] = 1
        deep = ((features - mean) / std).astype(np.float32)
        return wide, deep, labels

    return columns(x_train, y_train), columns(x_test, y_test)


def input_fn(
    examples: Batch, batch_size: int, num_epochs: int | None, seed: int
) -> Iterator[Batch]:
    """TF's census ``input_fn``: shuffled batches for ``num_epochs`` (``None``: forever).

    A generator, made afresh each time ``TrainSpec``'s input function is
    called; seeded, so every call yields the same batches (what exact resume needs).
    """
    rng = np.random.default_rng(seed)
    wide, deep, labels = examples
    for _ in itertools.count() if num_epochs is None else range(num_epochs):
        order = rng.permutation(len(labels))
        for start in range(0, len(order) - batch_size + 1, batch_size):
            rows = order[start : start + batch_size]
            yield wide[rows], deep[rows], labels[rows]


def init_params(state: monitored.TrainState) -> None:
    """The linear and network weights (drawn from the state's RNG) and both optimizers' slots."""
    n_wide, n_deep = 30 * BUCKETS, 30
    state["linear/w"] = np.zeros(n_wide, np.float32)
    state["linear/b"] = np.zeros((), np.float32)
    state["dnn/w1"] = state.rng.normal(0, np.sqrt(2 / n_deep), (n_deep, HIDDEN)).astype(np.float32)
    state["dnn/b1"] = np.zeros(HIDDEN, np.float32)
    state["dnn/w2"] = state.rng.normal(0, np.sqrt(1 / HIDDEN), HIDDEN).astype(np.float32)
    state["dnn/b2"] = np.zeros((), np.float32)
    LINEAR_OPTIMIZER.create_slots(state, ["linear/w", "linear/b"])
    DNN_OPTIMIZER.create_slots(state, ["dnn/w1", "dnn/b1", "dnn/w2", "dnn/b2"])


def forward(
    state: monitored.TrainState, wide: np.ndarray, deep: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The hidden layer and the logit: the linear part plus the network."""
    hidden = np.maximum(deep @ state["dnn/w1"] + state["dnn/b1"], 0)
    logit = (
        wide @ state["linear/w"] + state["linear/b"] + hidden @ state["dnn/w2"] + state["dnn/b2"]
    )
    return hidden, logit


def predict(state: monitored.TrainState, wide: np.ndarray, deep: np.ndarray) -> np.ndarray:
    """The probability of the positive class: what the SavedModel's serving signature gave."""
    _, logit = forward(state, wide, deep)
    return 1 / (1 + np.exp(-logit))


def train_step(state: monitored.TrainState, batch: Batch) -> dict[str, np.ndarray]:
    """One step of both optimizers on the mean logistic loss; the step counts once."""
    wide, deep, labels = batch
    hidden, logit = forward(state, wide, deep)
    probability = 1 / (1 + np.exp(-logit))
    loss = np.mean(np.logaddexp(0, logit) - labels * logit)
    d = (probability - labels) / len(labels)
    d_hidden = np.outer(d, state["dnn/w2"]) * (hidden > 0)
    LINEAR_OPTIMIZER.apply_gradients(
        state, {"linear/w": wide.T @ d, "linear/b": d.sum()}, global_step=False
    )
    DNN_OPTIMIZER.apply_gradients(
        state,
        {
            "dnn/w1": deep.T @ d_hidden,
            "dnn/b1": d_hidden.sum(axis=0),
            "dnn/w2": hidden.T @ d,
            "dnn/b2": d.sum(),  # an np.float32, not an array
        },
    )
    return {"loss": loss}


def eval_step(
    state: monitored.TrainState, batch: Batch, metrics: dict[str, metrics.Metric]
) -> None:
    """The canned binary classifier's metrics, streamed over one held-out batch."""
    wide, deep, labels = batch
    probability = predict(state, wide, deep)
    predicted = (probability > 0.5).astype(np.float32)
    metrics["accuracy"].update(labels, predicted)
    metrics["auc"].update(labels > 0, probability)
    metrics["auc_precision_recall"].update(labels > 0, probability)
    metrics["precision"].update(labels, predicted)
    metrics["recall"].update(labels, predicted)
    clipped = np.clip(probability, 1e-7, 1 - 1e-7)
    losses = -(labels * np.log(clipped) + (1 - labels) * np.log(1 - clipped))
    metrics["average_loss"].update(losses)


def eval_metrics() -> dict[str, metrics.Metric]:
    return {
        "accuracy": metrics.Accuracy(),
        "auc": metrics.AUC(),
        "auc_precision_recall": metrics.AUC(curve="PR"),
        "precision": metrics.Precision(),
        "recall": metrics.Recall(),
        "average_loss": metrics.Mean(),
    }


async def train(
    max_steps: int, seed: int = 0, model_dir: str | None = None
) -> tuple[monitored.TrainState, monitored.evaluation.EvaluationResult]:
    """Train up to global step ``max_steps``, resuming from ``model_dir``; the final evaluation."""
    train_examples, eval_examples = load_data(seed)
    held_out = [eval_examples]  # one batch: the whole held-out set
    state = monitored.TrainState(seed=seed)
    result = await monitored.train_and_evaluate(
        monitored.TrainSpec(
            train_step,
            input_fn=lambda: input_fn(train_examples, BATCH_SIZE, None, seed),
            max_steps=max_steps,
        ),
        monitored.EvalSpec(
            eval_step, eval_metrics(), input_fn=lambda: held_out, name="census", throttle_secs=0
        ),
        model_dir=model_dir,
        state=state,
        scaffold=monitored.Scaffold(init_fn=init_params),
        min_eval_frequency=100,  # without a model_dir too: every 100 steps, not every step
        # RunConfig(save_checkpoints_steps=100, keep_checkpoint_max=3,
        #           save_summary_steps=100, log_step_count_steps=500)
        save_checkpoint_steps=100,
        keep_checkpoint_max=3,
        save_summaries_steps=100,
        log_step_count_steps=500,
    )
    return state, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=1000, help="train up to this step")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--model-dir",
        default="runs/tf1_estimator_port",
        help="checkpoints and eval summaries; a second run resumes ('' for none)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    _, result = anyio.run(train, args.max_steps, args.seed, args.model_dir or None)
    print(
        f"after {result.global_step} steps: "
        + ", ".join(f"{name} {value:.4f}" for name, value in result.metrics.items())
    )


if __name__ == "__main__":
    main()
