"""A port of Horovod's TF1 MNIST example to ``monitored-mpi``, on scikit-learn's digits.

Horovod's ``examples/tensorflow/tensorflow_mnist.py`` is how most TF1 users ran
data-parallel training: ``hvd.init()``, a learning rate scaled by ``hvd.size()``,
``hvd.DistributedOptimizer``, ``hvd.BroadcastGlobalVariablesHook(0)``,
``StopAtStepHook(last_step=N // hvd.size())``, checkpoints on rank 0 only, and a
Python generator of shuffled batches. This is that program for ``monitored``
(our own code; the digits instead of MNIST, softmax regression with
hand-written gradients instead of a convnet), each piece where the original has
it; docs/scaling-out.md ("From Horovod") has the table:

* ``hvd.init()`` and ``BroadcastGlobalVariablesHook(0)`` are gone: MPI starts
  with the session, and the chief's state is broadcast when it is created;
* ``hvd.DistributedOptimizer(opt)`` -> ``monitored_mpi.DistributedOptimizer(opt)``;
* ``checkpoint_dir = "./checkpoints" if hvd.rank() == 0 else None``: the same;
* the generator of shuffled batches draws from ``np.random.default_rng([seed,
  rank])`` and is fed through ``monitored.data.prefetch``: each rank shuffles
  differently, reproducibly, and a restarted run reads its stream again from the
  start and skips what it had consumed, so it resumes bit for bit
  (``state.rng`` belongs to the step: a producer thread running ahead must not
  draw from it).

Run: ``mpiexec -n 2 python examples/horovod_digits.py`` (or without ``mpiexec``:
one process). ``--steps`` (all ranks together, default 400), ``--checkpoint-dir``.
Every rank prints a digest of its weights at the end: they agree.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
from collections.abc import Iterator, Sequence

import anyio
import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import monitored
import monitored_mpi
from monitored import data

log = logging.getLogger("horovod_digits")

Batch = tuple[np.ndarray, np.ndarray]


def load_data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=0, stratify=y
    )
    return x_train, x_test, y_train, y_test


def train_input_generator(
    x_train: np.ndarray, y_train: np.ndarray, batch_size: int, seed: int
) -> Iterator[Batch]:
    """The original's generator: reshuffle every epoch, yield whole batches, forever.

    Its randomness is its own, seeded per rank (``[seed, rank]``): reproducible,
    and different on each rank.
    """
    rng = np.random.default_rng([seed, monitored_mpi.rank()])
    while True:
        order = rng.permutation(len(x_train))
        for start in range(0, len(order) - batch_size + 1, batch_size):
            rows = order[start : start + batch_size]
            yield x_train[rows], y_train[rows]


def init(state: monitored.TrainState) -> None:
    """Runs on the chief only; every rank receives these values."""
    state["w"] = state.rng.normal(0.0, 0.01, (64, 10)).astype(np.float32)
    state["b"] = np.zeros(10, np.float32)
    OPTIMIZER.create_slots(state)


def loss_and_grads(
    state: monitored.TrainState, x: np.ndarray, y: np.ndarray
) -> tuple[float, dict[str, np.ndarray]]:
    logits = x @ state["w"] + state["b"]
    logits -= logits.max(axis=1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=1, keepdims=True)
    loss = float(-np.log(probs[np.arange(len(y)), y] + 1e-12).mean())
    probs[np.arange(len(y)), y] -= 1
    probs /= len(y)
    return loss, {"w": x.T @ probs, "b": probs.sum(axis=0)}


def train_step(state: monitored.TrainState, batch: Batch) -> dict[str, object]:
    loss, grads = loss_and_grads(state, *batch)
    OPTIMIZER.apply_gradients(state, grads)  # averaged over the ranks; global_step += 1
    return {"loss": loss, "step": state.global_step}


def accuracy(state: monitored.TrainState, x: np.ndarray, y: np.ndarray) -> float:
    return float(((x @ state["w"] + state["b"]).argmax(axis=1) == y).mean())


def digest(state: monitored.TrainState) -> str:
    """A short hash of the weights, to see that every rank holds the same bits."""
    sha = hashlib.sha256()
    for name in sorted(state):
        sha.update(name.encode() + np.ascontiguousarray(state[name]).tobytes())
    return sha.hexdigest()[:16]


#: Horovod scales the rate by the number of ranks (the batch grows with them).
OPTIMIZER = monitored_mpi.DistributedOptimizer(monitored.AdamOptimizer(0.01 * monitored_mpi.size()))


async def main(argv: Sequence[str] | None = None) -> monitored.TrainState:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint-dir", default="runs/horovod")
    args = parser.parse_args(argv)

    x_train, x_test, y_train, y_test = load_data()
    batches = data.prefetch(
        train_input_generator(x_train, y_train, args.batch, args.seed),
        buffer_size=4,
        feed="batch",
        name="digits",
    )
    hooks = [
        batches,
        # The global step counts steps of all ranks together: N // size of them see N batches.
        monitored.StopAtStepHook(last_step=args.steps // monitored_mpi.size()),
        monitored.LoggingTensorHook({"step": "step", "loss": "loss"}, every_n_iter=50),
    ]
    # Rank 0 alone saves checkpoints (and restores them: the others receive its state).
    checkpoint_dir = args.checkpoint_dir if monitored_mpi.rank() == 0 else None
    state = monitored.TrainState(seed=args.seed)
    async with monitored.MonitoredTrainingSession(
        state,
        checkpoint_dir=checkpoint_dir,
        scaffold=monitored.Scaffold(init_fn=init),
        hooks=hooks,
        save_checkpoint_steps=50,
        save_summaries_steps=None,
        log_step_count_steps=None,
    ) as mon_sess:
        while not mon_sess.should_stop():
            await mon_sess.run(train_step)

    if monitored_mpi.rank() == 0:
        print(f"step {state.global_step}: held-out accuracy {accuracy(state, x_test, y_test):.3f}")
    print(f"rank {monitored_mpi.rank()} weights {digest(state)}", flush=True)
    return state


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    anyio.run(main)
