"""A port of TF1's CIFAR-10 training tutorial to ``monitored``, on scikit-learn's digits.

tensorflow/models' ``tutorials/image/cifar10/cifar10_train.py`` is a typical TF1
``MonitoredTrainingSession`` script. This is the same program written for
``monitored`` (our own code; the dataset is the offline 8x8 digits instead of
CIFAR-10, the network a small MLP with hand-written backprop instead of a
convnet), keeping each piece of the original's structure so the two read side
by side. ``docs/tf1-migration.md`` walks through it. What the original did, and
where it went:

* ``distorted_inputs()`` -> :func:`distorted_batch`: random crops (shifts of up
  to one pixel) drawn with ``state.rng``, so a resumed run draws the same
  batches; the per-pixel standardization constants are ``trainable=False``
  state entries (TF1's non-trainable variables);
* ``inference()`` + ``loss()`` -> :func:`loss_and_grads`: two fully connected
  ReLU layers with L2 weight decay (the original's ``local3``/``local4``) and a
  softmax layer; the total loss is cross-entropy plus the decay terms;
* ``train()`` -> :func:`train_step`: ``exponential_decay`` with ``staircase``,
  plain gradient descent, moving averages of the losses (``ExponentialMovingAverage``
  over values, not variables) and of the trainable variables (``num_updates``
  tied to the global step), evaluated with the averages swapped in;
* ``_LoggerHook`` -> :class:`LoggerHook`, ``NanTensorHook`` -> :class:`NanLossHook`
  (the NaN-guard plugin replaces it where installed),
  ``StopAtStepHook`` unchanged; ``config=tf.ConfigProto(...)`` is dropped (there
  is no device placement to log);
* ``train_dir`` -> ``checkpoint_dir`` (needs the ``monitored-checkpoint`` plugin):
  run it again with a larger ``--max-steps`` and it resumes, bit for bit.

``--feed-learning-rate`` trains with ResNet's TF1 pattern instead: a hook sets the
rate before every step (TF1 fed it through a placeholder); it computes the same
schedule, so both runs end bit for bit equal.

Run: ``python examples/tf1_cifar10_port.py`` (``--max-steps``, ``--train-dir``,
``--log-frequency``, ``--seed``, ``--feed-learning-rate``).
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from collections.abc import Callable

import anyio
import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import monitored

log = logging.getLogger("tf1_cifar10_port")

BATCH_SIZE = 64
INITIAL_LEARNING_RATE = 0.1  # the original's constants, scaled to a dataset of 1437 images
LEARNING_RATE_DECAY_FACTOR = 0.1
DECAY_STEPS = 1500
MOVING_AVERAGE_DECAY = 0.999
WEIGHT_DECAY = 0.0005
HIDDEN = (128, 64)

#: TF1's ``trainable=False`` variables: standardization constants computed once.
#: Declared in the constructor, so a run resumed from a checkpoint (which stores
#: arrays, not markers, and does not run ``init_fn``) has them too.
NON_TRAINABLE = ("input/mean", "input/std")

Data = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def load_data(seed: int) -> Data:
    """Digits as float32 in [0, 1] and integer labels, split 80/20 (train, test)."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=seed, stratify=y
    )
    return x_train, x_test, y_train, y_test


# -- the model (TF1: cifar10.inference, cifar10.loss) ---------------------------------------


def make_init_fn(x_train: np.ndarray) -> Callable[[monitored.TrainState], None]:
    """``Scaffold.init_fn``: the variables, the constants, the optimizer's and averages' entries.

    TF1 ran the variables' initializers here; this builds the arrays. It runs on a
    fresh start only: a resumed run gets every entry from the checkpoint.
    """

    def init_fn(state: monitored.TrainState) -> None:
        sizes = (x_train.shape[1], *HIDDEN, 10)
        layers = ("local3", "local4", "softmax_linear")
        for layer, fan_in, fan_out in zip(layers, sizes[:-1], sizes[1:], strict=True):
            std = math.sqrt(2.0 / fan_in) if layer != "softmax_linear" else 1.0 / fan_in
            weights = state.rng.normal(0.0, std, (fan_in, fan_out))
            state[f"{layer}/weights"] = weights.astype(np.float32)
            state[f"{layer}/biases"] = np.full(
                fan_out, 0.1 if layer != "softmax_linear" else 0.0, np.float32
            )
        state["input/mean"] = x_train.mean(axis=0)
        state["input/std"] = np.maximum(x_train.std(axis=0), 0.1).astype(np.float32)
        # var_list=None is every trainable entry: the constants above are skipped.
        variable_averages(state).create_averages(state)
        LOSS_AVERAGES.create_averages(state, values={"cross_entropy": 0.0, "total_loss": 0.0})

    return init_fn


def logits_of(state: monitored.TrainState, images: np.ndarray) -> list[np.ndarray]:
    """The activations of every layer, input (standardized) first, logits last."""
    x = (images - state["input/mean"]) / state["input/std"]
    activations = [x]
    for layer in ("local3", "local4"):
        x = np.maximum(x @ state[f"{layer}/weights"] + state[f"{layer}/biases"], 0.0)
        activations.append(x)
    activations.append(x @ state["softmax_linear/weights"] + state["softmax_linear/biases"])
    return activations


def loss_and_grads(
    state: monitored.TrainState, images: np.ndarray, labels: np.ndarray
) -> tuple[float, float, dict[str, np.ndarray]]:
    """Cross-entropy, total loss (with weight decay) and the gradients, by hand."""
    activations = logits_of(state, images)
    logits = activations[-1] - activations[-1].max(axis=1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=1, keepdims=True)
    n = len(labels)
    cross_entropy = float(-np.log(probs[np.arange(n), labels] + 1e-12).mean())
    decay = sum(float((state[f"{k}/weights"] ** 2).sum()) for k in ("local3", "local4"))
    total_loss = cross_entropy + 0.5 * WEIGHT_DECAY * decay  # TF1's tf.nn.l2_loss * wd

    grads: dict[str, np.ndarray] = {}
    delta = probs
    delta[np.arange(n), labels] -= 1.0
    delta /= n
    for layer, below in zip(
        ("softmax_linear", "local4", "local3"), reversed(activations[:-1]), strict=True
    ):
        weights = state[f"{layer}/weights"]
        grads[f"{layer}/weights"] = below.T @ delta
        grads[f"{layer}/biases"] = delta.sum(axis=0)
        if layer != "softmax_linear":
            grads[f"{layer}/weights"] += WEIGHT_DECAY * weights
        if layer != "local3":
            delta = (delta @ weights.T) * (below > 0)
    return cross_entropy, total_loss, {k: v.astype(np.float32) for k, v in grads.items()}


# -- training (TF1: cifar10.train, the train_op) ----------------------------------------------

SCHEDULE = monitored.exponential_decay(
    INITIAL_LEARNING_RATE, DECAY_STEPS, LEARNING_RATE_DECAY_FACTOR, staircase=True
)
OPTIMIZER = monitored.GradientDescentOptimizer(SCHEDULE)
LOSS_AVERAGES = monitored.ExponentialMovingAverage(0.9, name="avg")


def variable_averages(state: monitored.TrainState) -> monitored.ExponentialMovingAverage:
    """The moving averages of the weights; TF1 passed the global step as ``num_updates``."""
    return monitored.ExponentialMovingAverage(
        MOVING_AVERAGE_DECAY, num_updates=lambda: state.global_step, name="avg_weights"
    )


def distorted_batch(
    state: monitored.TrainState, x: np.ndarray, y: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """A random batch, each image shifted by up to one pixel (TF1: random crops).

    Drawn with ``state.rng``, whose state the checkpoint holds: a resumed run
    draws exactly the batches an uninterrupted one would.
    """
    index = state.rng.integers(0, len(x), BATCH_SIZE)
    offsets = state.rng.integers(0, 3, (2, BATCH_SIZE))
    padded = np.pad(x[index].reshape(-1, 8, 8), ((0, 0), (1, 1), (1, 1)))
    rows = (offsets[0][:, None] + np.arange(8))[:, :, None]
    cols = (offsets[1][:, None] + np.arange(8))[:, None, :]
    crops = padded[np.arange(BATCH_SIZE)[:, None, None], rows, cols]
    return crops.reshape(BATCH_SIZE, 64), y[index]


def train_step(
    state: monitored.TrainState,
    images: np.ndarray,
    labels: np.ndarray,
    averages: monitored.ExponentialMovingAverage,
) -> dict[str, float]:
    """TF1's ``train_op``: one SGD step, then the moving averages of losses and weights.

    The fetches a hook can ask for by name are what this returns (``"loss"``,
    ``"cross_entropy"``) and the state's entries (``"total_loss/avg"``).
    """
    cross_entropy, total_loss, grads = loss_and_grads(state, images, labels)
    LOSS_AVERAGES.apply(state, values={"cross_entropy": cross_entropy, "total_loss": total_loss})
    OPTIMIZER.apply_gradients(state, grads)  # state.global_step += 1
    averages.apply(state)  # var_list=None: the trainable entries only
    return {"loss": total_loss, "cross_entropy": cross_entropy}


# -- hooks (TF1: _LoggerHook, NanTensorHook, a learning-rate feeding hook) --------------------


class LoggerHook(monitored.SessionRunHook):
    """Logs the loss and the speed every ``log_frequency`` steps (TF1's ``_LoggerHook``).

    The original counted steps itself from -1, which restarts on a resumed run;
    this one reads the global step, which the checkpoint holds.
    """

    def __init__(self, log_frequency: int) -> None:
        self.log_frequency = log_frequency
        self.start_time = 0.0

    def begin(self) -> None:
        self.start_time = time.perf_counter()

    def before_run(self, run_context: monitored.SessionRunContext) -> monitored.SessionRunArgs:
        return monitored.SessionRunArgs({"loss": "loss", "average": "total_loss/avg"})

    def after_run(
        self, run_context: monitored.SessionRunContext, run_values: monitored.SessionRunValues
    ) -> None:
        step = run_context.session.state.global_step
        if step % self.log_frequency:
            return
        now = time.perf_counter()
        duration, self.start_time = now - self.start_time, now
        log.info(
            "step %d, loss = %.3f (average %.3f; %.0f examples/sec)",
            step,
            run_values.results["loss"],
            run_values.results["average"],
            self.log_frequency * BATCH_SIZE / max(duration, 1e-9),
        )


class NanLossHook(monitored.SessionRunHook):
    """Stops training with an error when the loss is NaN (TF1's ``NanTensorHook(loss)``).

    Where the NaN-guard plugin is installed it does this (and more)
    by itself; this hook keeps the example running on the core alone.
    """

    def before_run(self, run_context: monitored.SessionRunContext) -> monitored.SessionRunArgs:
        return monitored.SessionRunArgs("loss")

    def after_run(
        self, run_context: monitored.SessionRunContext, run_values: monitored.SessionRunValues
    ) -> None:
        if not math.isfinite(run_values.results):
            raise monitored.NanLossDuringTrainingError(
                f"loss is {run_values.results} at global step "
                f"{run_context.session.state.global_step}"
            )


class LearningRateSetterHook(monitored.SessionRunHook):
    """Sets the optimizer's rate before each step: ResNet's TF1 hook, which fed it.

    TF1 fed ``learning_rate`` through a placeholder in ``before_run``; here the
    hook assigns ``optimizer.learning_rate``. It computes the rate from the
    global step (not from a count of its own), so a resumed run gets the same
    rates: the value set here is not in the checkpoint.
    """

    def __init__(
        self, optimizer: monitored.Optimizer, schedule: monitored.LearningRateSchedule
    ) -> None:
        self.optimizer = optimizer
        self.schedule = schedule

    def before_run(self, run_context: monitored.SessionRunContext) -> None:
        self.optimizer.learning_rate = self.schedule(run_context.session.state.global_step)


# -- the training loop (TF1: cifar10_train.train) ----------------------------------------------


async def train(
    max_steps: int,
    seed: int = 0,
    train_dir: str | None = None,
    *,
    feed_learning_rate: bool = False,
    schedule: monitored.LearningRateSchedule = SCHEDULE,
    log_frequency: int = 100,
) -> monitored.TrainState:
    """Train up to global step ``max_steps``, resuming from ``train_dir`` if it has checkpoints.

    The optimizer follows ``schedule``: as its learning rate, or, with
    ``feed_learning_rate``, through a hook that sets the rate before every step.
    """
    x_train, _, y_train, _ = load_data(seed)
    state = monitored.TrainState(seed=seed, non_trainable=NON_TRAINABLE)
    hooks: list[object] = [
        monitored.StopAtStepHook(last_step=max_steps),
        NanLossHook(),
        LoggerHook(log_frequency),
    ]
    if feed_learning_rate:
        OPTIMIZER.learning_rate = 0.0  # the hook sets it before every step
        hooks.append(LearningRateSetterHook(OPTIMIZER, schedule))
    else:
        OPTIMIZER.learning_rate = schedule
    async with monitored.MonitoredTrainingSession(
        state,
        checkpoint_dir=train_dir,
        scaffold=monitored.Scaffold(init_fn=make_init_fn(x_train)),
        hooks=hooks,
        log_step_count_steps=0,
    ) as sess:
        averages = variable_averages(state)
        while not sess.should_stop():
            images, labels = distorted_batch(state, x_train, y_train)
            await sess.run(train_step, images, labels, averages)  # TF1: run(train_op)
    return state


def evaluate(state: monitored.TrainState, x: np.ndarray, y: np.ndarray) -> float:
    """Precision at 1 with the moving averages of the weights (TF1: cifar10_eval.py)."""
    with variable_averages(state).averaged(state):
        return float((logits_of(state, x)[-1].argmax(axis=1) == y).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=3000, help="train up to this step")
    parser.add_argument(
        "--train-dir",
        default="runs/tf1_cifar10_port",
        help="checkpoints ('' for none; needs the monitored-checkpoint plugin)",
    )
    parser.add_argument("--log-frequency", type=int, default=250)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--feed-learning-rate", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    state = anyio.run(
        lambda: train(
            args.max_steps,
            args.seed,
            args.train_dir or None,
            feed_learning_rate=args.feed_learning_rate,
            log_frequency=args.log_frequency,
        )
    )
    _, x_test, _, y_test = load_data(args.seed)
    print(f"step {state.global_step}: precision @ 1 = {evaluate(state, x_test, y_test):.3f}")


if __name__ == "__main__":
    main()
