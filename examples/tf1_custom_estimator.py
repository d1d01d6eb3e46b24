"""TF's custom Estimator tutorial ported: ``model_fn``, ``train``, ``evaluate``, ``predict``.

TensorFlow's "Creating custom Estimators" guide (``custom_estimator.py`` of
tensorflow/models' ``samples/core/get_started``) classifies iris flowers with
a ``model_fn`` of two hidden layers of 10 units, trained by Adagrad (rate 0.1)
for 1000 steps of 100 shuffled examples, then evaluates the test set's
accuracy and predicts three new flowers. This is the same program on
``monitored.estimator``, kept line for line where arrays allow:

* ``tf.get_variable``/``tf.layers.dense`` -> :func:`dense` over
  ``monitored.estimator.get_variable`` (Glorot-uniform weights, zero biases:
  ``tf.layers.dense``'s defaults);
* the graph's automatic gradients -> :func:`backward`, written out by hand;
* ``train_op = optimizer.minimize(loss, global_step=...)`` -> a function
  applying ``optimizer.minimize`` to the state, which counts the step;
* ``tf.metrics.accuracy(labels, predicted_classes)`` ->
  ``metrics.Accuracy().updated(labels, predicted_classes)``;
* ``iris_data``'s CSV files -> scikit-learn's copy of the same data set (120
  training and 30 test flowers, as TF's split); ``train_input_fn`` (shuffle,
  repeat, batch) -> ``numpy_input_fn(..., num_epochs=None, shuffle=True)``.

Run: ``python examples/tf1_custom_estimator.py`` (``--train-steps``,
``--model-dir``); run it again with more steps and it resumes.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

import anyio
import numpy as np
from sklearn.datasets import load_iris
from sklearn.model_selection import train_test_split

import monitored
from monitored import metrics
from monitored.estimator import (
    Estimator,
    EstimatorSpec,
    ModeKeys,
    RunConfig,
    current_state,
    get_variable,
    numpy_input_fn,
    zeros_initializer,
)

SPECIES = ["Setosa", "Versicolor", "Virginica"]
PREDICT_X = {  # the tutorial's three new flowers
    "SepalLength": [5.1, 5.9, 6.9],
    "SepalWidth": [3.3, 3.0, 3.1],
    "PetalLength": [1.7, 4.2, 5.4],
    "PetalWidth": [0.5, 1.5, 2.1],
}
EXPECTED = ["Setosa", "Versicolor", "Virginica"]


def load_data(
    seed: int = 0,
) -> tuple[tuple[dict[str, np.ndarray], np.ndarray], tuple[dict[str, np.ndarray], np.ndarray]]:
    """``(train_x, train_y), (test_x, test_y)``: features by column name, as iris_data gave."""
    iris = load_iris()
    x = iris.data.astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, iris.target, test_size=30, random_state=seed, stratify=iris.target
    )
    columns = list(PREDICT_X)

    def by_column(values: np.ndarray) -> dict[str, np.ndarray]:
        return {name: values[:, i] for i, name in enumerate(columns)}

    return (by_column(x_train), y_train), (by_column(x_test), y_test)


def input_layer(features: dict[str, Any], feature_columns: list[str]) -> np.ndarray:
    """``tf.feature_column.input_layer`` of numeric columns: the columns side by side."""
    return np.stack([np.asarray(features[key], np.float32) for key in feature_columns], axis=1)


def dense(net: np.ndarray, units: int, name: str) -> tuple[np.ndarray, str]:
    """``tf.layers.dense`` without its activation: ``net @ kernel + bias``, and the layer's name."""
    kernel = get_variable(f"{name}/kernel", (net.shape[1], units))
    bias = get_variable(f"{name}/bias", (units,), initializer=zeros_initializer())
    return net @ kernel + bias, name


def backward(
    state: monitored.TrainState,
    layers: list[tuple[np.ndarray, np.ndarray, str]],
    d_logits: np.ndarray,
) -> dict[str, np.ndarray]:
    """The gradients of every layer's kernel and bias, from the gradient of the logits."""
    grads: dict[str, np.ndarray] = {}
    d_out = d_logits
    for index in reversed(range(len(layers))):
        inputs, outputs, name = layers[index]
        if index < len(layers) - 1:
            d_out = d_out * (outputs > 0)  # the hidden layers' ReLU
        grads[f"{name}/kernel"] = inputs.T @ d_out
        grads[f"{name}/bias"] = d_out.sum(axis=0)
        d_out = d_out @ state[f"{name}/kernel"].T
    return grads


def my_model(
    features: dict[str, Any], labels: Any, mode: str, params: dict[str, Any]
) -> EstimatorSpec:
    """DNN with two hidden layers and learning rate 0.1: the tutorial's ``my_model``."""
    net = input_layer(features, params["feature_columns"])
    layers = []
    for i, units in enumerate(params["hidden_units"]):
        inputs = net
        net, name = dense(net, units, f"dense_{i}")
        net = np.maximum(net, 0)  # activation=tf.nn.relu
        layers.append((inputs, net, name))
    logits, name = dense(net, params["n_classes"], "logits")
    layers.append((net, logits, name))

    predicted_classes = logits.argmax(axis=1)
    if mode == ModeKeys.PREDICT:
        shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
        predictions = {
            "class_ids": predicted_classes[:, np.newaxis],
            "probabilities": shifted / shifted.sum(axis=1, keepdims=True),
            "logits": logits,
        }
        return EstimatorSpec(mode, predictions=predictions)

    # tf.losses.sparse_softmax_cross_entropy: the mean over the batch.
    log_probabilities = logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)
    loss = -log_probabilities[np.arange(len(labels)), labels].mean()
    accuracy = metrics.Accuracy().updated(labels, predicted_classes)
    if mode == ModeKeys.EVAL:
        return EstimatorSpec(mode, loss=loss, eval_metric_ops={"accuracy": accuracy})

    assert mode == ModeKeys.TRAIN
    optimizer = params["optimizer"]
    state = current_state()

    def loss_and_grads(state: monitored.TrainState) -> tuple[Any, dict[str, np.ndarray]]:
        d_logits = np.exp(log_probabilities)
        d_logits[np.arange(len(labels)), labels] -= 1
        return loss, backward(state, layers, d_logits / len(labels))

    return EstimatorSpec(
        mode, loss=loss, train_op=lambda: optimizer.minimize(state, loss_and_grads)
    )


def make_classifier(model_dir: str | None, seed: int = 0) -> Estimator:
    """The tutorial's ``tf.estimator.Estimator(model_fn=my_model, params=...)``."""
    return Estimator(
        model_fn=my_model,
        model_dir=model_dir,
        config=RunConfig(tf_random_seed=seed, save_checkpoints_steps=100),
        params={
            "feature_columns": list(PREDICT_X),
            "hidden_units": [10, 10],
            "n_classes": 3,
            "optimizer": monitored.AdagradOptimizer(learning_rate=0.1),
        },
    )


async def main_async(
    train_steps: int, batch_size: int, model_dir: str | None
) -> tuple[Estimator, dict[str, Any], list[dict[str, Any]]]:
    """Train, evaluate and predict; the classifier, the evaluation and the three predictions."""
    (train_x, train_y), (test_x, test_y) = load_data()
    classifier = make_classifier(model_dir)
    await classifier.train(
        input_fn=numpy_input_fn(train_x, train_y, batch_size, num_epochs=None, shuffle=True),
        max_steps=train_steps,
    )
    eval_result = await classifier.evaluate(
        input_fn=numpy_input_fn(test_x, test_y, batch_size, shuffle=False)
    )
    predictions = [
        prediction
        async for prediction in classifier.predict(
            input_fn=numpy_input_fn(PREDICT_X, None, batch_size, shuffle=False)
        )
    ]
    return classifier, eval_result, predictions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--train-steps", type=int, default=1000, help="train up to this step")
    parser.add_argument("--model-dir", default="runs/tf1_custom_estimator")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    _, eval_result, predictions = anyio.run(
        main_async, args.train_steps, args.batch_size, args.model_dir
    )
    print("\nTest set accuracy: {accuracy:0.3f}\n".format(**eval_result))
    for pred_dict, expected in zip(predictions, EXPECTED, strict=True):
        class_id = int(pred_dict["class_ids"][0])
        probability = pred_dict["probabilities"][class_id]
        print(
            f'Prediction is "{SPECIES[class_id]}" ({100 * probability:.1f}%), expected "{expected}"'
        )


if __name__ == "__main__":
    main()
