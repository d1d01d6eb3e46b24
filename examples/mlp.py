"""An MLP on scikit-learn's digits, trained with every optimizer of ``monitored``.

Plain NumPy with hand-written backprop: the gradients are first verified against
central differences (``compute_gradient_error``, in float64), then the same
network, from the same initial weights, is trained in float32 once per optimizer
with clipped gradients; a table shows the training loss before and after and
the held-out accuracy. A last run adds a learning-rate schedule and a moving
average of the weights, evaluated with the averaged weights swapped in.

No session is needed: a ``TrainState`` holds the weights (and the optimizers'
slots and the averages), and the loop calls the optimizer directly.

Run: ``python examples/mlp.py`` (``--epochs``, ``--seed``). Exits non-zero if a
gradient check fails or some optimizer does not lower the loss.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import monitored
from monitored.train.clipping import clip_by_global_norm
from monitored.train.gradient_checker import compute_gradient_error
from monitored.train.moving_averages import ExponentialMovingAverage
from monitored.train.optimizers import (
    AdadeltaOptimizer,
    AdagradDAOptimizer,
    AdagradOptimizer,
    AdamOptimizer,
    AdamWOptimizer,
    FtrlOptimizer,
    GradientDescentOptimizer,
    MomentumOptimizer,
    Optimizer,
    ProximalAdagradOptimizer,
    ProximalGradientDescentOptimizer,
    RMSPropOptimizer,
)
from monitored.train.schedules import exponential_decay, linear_warmup

Params = dict[str, np.ndarray]

#: Every optimizer with a learning rate that suits this network.
OPTIMIZERS: dict[str, Callable[[], Optimizer]] = {
    "GradientDescent": lambda: GradientDescentOptimizer(0.5),
    "Momentum": lambda: MomentumOptimizer(0.05, 0.9),
    "Momentum (Nesterov)": lambda: MomentumOptimizer(0.05, 0.9, use_nesterov=True),
    "Adagrad": lambda: AdagradOptimizer(0.1),
    "AdagradDA": lambda: AdagradDAOptimizer(0.1),
    "Adadelta": lambda: AdadeltaOptimizer(1.0, epsilon=1e-6),
    "Adam": lambda: AdamOptimizer(0.005),
    "AdamW": lambda: AdamWOptimizer(1e-4, 0.005),
    "RMSProp": lambda: RMSPropOptimizer(0.002),
    "RMSProp (centered, momentum)": lambda: RMSPropOptimizer(0.001, momentum=0.5, centered=True),
    "Ftrl": lambda: FtrlOptimizer(0.1),
    "ProximalGradientDescent": lambda: ProximalGradientDescentOptimizer(0.5, 1e-5, 1e-5),
    "ProximalAdagrad": lambda: ProximalAdagradOptimizer(0.1, 0.1, 1e-5),
}


# -- data and model ------------------------------------------------------------------


def load_data(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Digits scaled to [0, 1] (float32) and integer labels, split 80/20."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=seed, stratify=y
    )
    return x_train, x_test, y_train, y_test


def init_params(seed: int, n_in: int = 64, n_hidden: int = 32, n_out: int = 10) -> Params:
    """Glorot-uniform weights and zero biases, float32."""
    rng = np.random.default_rng(seed)

    def glorot(fan_in: int, fan_out: int) -> np.ndarray:
        limit = np.sqrt(6.0 / (fan_in + fan_out))
        return rng.uniform(-limit, limit, (fan_in, fan_out)).astype(np.float32)

    return {
        "w1": glorot(n_in, n_hidden),
        "b1": np.zeros(n_hidden, np.float32),
        "w2": glorot(n_hidden, n_out),
        "b2": np.zeros(n_out, np.float32),
    }


def forward(params: Params, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Hidden activations (tanh) and class probabilities (softmax)."""
    hidden = np.tanh(x @ params["w1"] + params["b1"])
    logits = hidden @ params["w2"] + params["b2"]
    logits = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(logits)
    return hidden, exp / exp.sum(axis=1, keepdims=True)


def loss_and_grads(params: Params, x: np.ndarray, y: np.ndarray) -> tuple[float, Params]:
    """Mean cross-entropy and its gradient, by hand-written backprop."""
    hidden, probs = forward(params, x)
    n = x.shape[0]
    loss = float(-np.mean(np.log(probs[np.arange(n), y] + 1e-12)))
    d_logits = probs.copy()
    d_logits[np.arange(n), y] -= 1
    d_logits /= n
    d_hidden = (d_logits @ params["w2"].T) * (1 - hidden * hidden)
    grads = {
        "w1": x.T @ d_hidden,
        "b1": d_hidden.sum(axis=0),
        "w2": hidden.T @ d_logits,
        "b2": d_logits.sum(axis=0),
    }
    return loss, {name: g.astype(params[name].dtype) for name, g in grads.items()}


def accuracy(params: Params, x: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(forward(params, x)[1].argmax(axis=1) == y))


# -- gradient check ------------------------------------------------------------------


def check_gradients(x: np.ndarray, y: np.ndarray, seed: int) -> float:
    """Largest gap between backprop and central differences, in float64."""
    params = {name: p.astype(np.float64) for name, p in init_params(seed, n_hidden=8).items()}
    x64 = x[:16].astype(np.float64)
    labels = y[:16]

    def loss(p: Params) -> float:
        return loss_and_grads(p, x64, labels)[0]

    def backward(p: Params, dy: np.ndarray) -> Params:
        return {name: g * dy for name, g in loss_and_grads(p, x64, labels)[1].items()}

    return compute_gradient_error(loss, params, backward, delta=1e-5)


# -- training ------------------------------------------------------------------------


def batches(n: int, size: int, rng: np.random.Generator) -> list[np.ndarray]:
    order = rng.permutation(n)
    return [order[i : i + size] for i in range(0, n, size)]


def train(
    opt: Optimizer,
    data: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    epochs: int,
    seed: int,
    ema: ExponentialMovingAverage | None = None,
) -> tuple[float, float, float]:
    """Train from the seed's initial weights; (loss before, loss after, test accuracy)."""
    x_train, x_test, y_train, y_test = data
    state = monitored.TrainState(init_params(seed), seed=seed)
    names = ["w1", "b1", "w2", "b2"]
    opt.create_slots(state, names)
    if ema is not None:
        ema.apply(state, names)  # creates the averages
    params: Params = {name: state[name] for name in names}  # the same arrays, updated in place
    before = loss_and_grads(params, x_train, y_train)[0]
    for _ in range(epochs):
        for batch in batches(len(x_train), 64, state.rng):
            _, grads = loss_and_grads(params, x_train[batch], y_train[batch])
            clipped, _ = clip_by_global_norm(grads, 5.0)
            opt.apply_gradients(state, clipped)
            if ema is not None:
                ema.apply(state, names)
    after = loss_and_grads(params, x_train, y_train)[0]
    if ema is None:
        return before, after, accuracy(params, x_test, y_test)
    with ema.averaged(state):
        return before, after, accuracy(params, x_test, y_test)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    data = load_data(args.seed)

    error = check_gradients(data[0], data[2], args.seed)
    print(f"gradient check: max |backprop - numerical| = {error:.2e}")
    if error > 1e-7:
        print("gradient check FAILED")
        return 1

    runs = dict(OPTIMIZERS)
    schedule = linear_warmup(exponential_decay(0.1, 200, 0.5), 50)
    runs["Momentum + schedule + EMA"] = lambda: MomentumOptimizer(schedule, 0.9)
    print("\n| optimizer | loss before | loss after | test accuracy | seconds |")
    print("|---|---:|---:|---:|---:|")
    failed = []
    for name, make in runs.items():
        start = time.perf_counter()
        ema = ExponentialMovingAverage(0.99) if "EMA" in name else None
        before, after, acc = train(make(), data, args.epochs, args.seed, ema)
        elapsed = time.perf_counter() - start
        print(f"| {name} | {before:.3f} | {after:.3f} | {acc:.3f} | {elapsed:.2f} |")
        if not after < before:
            failed.append(name)
    if failed:
        print(f"\nthe loss did not go down with: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
