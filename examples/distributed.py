"""Data-parallel training of the demo's network on scikit-learn's digits, over MPI.

Run it on one process (``python examples/distributed.py``) or on several
(``mpiexec -n 2 python examples/distributed.py``): the code is the same. Rank 0
is the chief; it initializes the weights, which every rank then receives; each
rank trains on its own shard of the training set, ``DistributedOptimizer``
averages the gradients, and the held-out accuracy is computed on each rank's
shard of the test set and merged across ranks exactly. The chief prints it.

Options: ``--steps`` (default 300), ``--batch`` (per rank, default 64).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import anyio
import demo  # the single-process demo's model (examples/demo.py)

import monitored
import monitored_mpi
from monitored.metrics import Accuracy

RANK, SIZE = monitored_mpi.rank(), monitored_mpi.size()


async def main(argv: Sequence[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args(argv)

    x_train, x_test, y_train, y_test = demo.load_data(seed=0)
    x_train, y_train = x_train[RANK::SIZE], y_train[RANK::SIZE]  # this rank's shard
    # The demo's step applies demo.OPTIMIZER: make it average over the ranks.
    demo.OPTIMIZER = monitored_mpi.DistributedOptimizer(demo.OPTIMIZER)
    state = monitored.TrainState(seed=0)

    async with monitored.MonitoredTrainingSession(
        state,
        scaffold=monitored.Scaffold(init_fn=demo.init_params),
        hooks=[monitored.StopAtStepHook(last_step=args.steps)],
        save_summaries_steps=None,
        log_step_count_steps=None,
    ) as sess:
        while not sess.should_stop():
            rows = sess.state.rng.choice(len(y_train), size=args.batch, replace=False)
            await sess.run(demo.train_step, (x_train[rows], y_train[rows]))

    accuracy = Accuracy(name="test_accuracy")
    _, logits = demo.forward(state, x_test[RANK::SIZE])
    accuracy.update(y_test[RANK::SIZE], logits.argmax(axis=1))
    monitored_mpi.merge_metrics([accuracy])
    if RANK == 0:
        print(
            f"{SIZE} rank(s), step {state.global_step}: held-out accuracy "
            f"{accuracy.result():.3f} on {int(accuracy.arrays['count'][()])} digits"
        )
    return accuracy.result()


if __name__ == "__main__":
    anyio.run(main)
