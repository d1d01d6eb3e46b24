"""Data-parallel training of the demo's network on scikit-learn's digits, over MPI.

Run it on one process (``python examples/distributed.py``) or on several
(``mpiexec -n 2 python examples/distributed.py``): the code is the same. Rank 0
is the chief; it initializes the weights, which every rank then receives. Each
rank trains on its own shard of the training set (``monitored.data.shard``),
shuffled and batched ahead of the step by ``monitored.data.shuffle_batch``;
``DistributedOptimizer`` averages the gradients. The held-out set is sharded
too (its 15 batches do not divide evenly over 2 or 4 ranks: that is fine), each
rank evaluates its shard with ``evaluate_once(..., sharded=True)`` and the
metrics are merged across ranks exactly. The chief prints the result.

Options: ``--steps`` (default 300), ``--batch`` (per rank, default 64).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import anyio
import demo  # the single-process demo's model (examples/demo.py)

import monitored
import monitored_mpi
from monitored import data
from monitored.evaluation import evaluate_once

RANK, SIZE = monitored_mpi.rank(), monitored_mpi.size()


async def main(argv: Sequence[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args(argv)

    x_train, x_test, y_train, y_test = demo.load_data(seed=0)
    # The demo's step applies demo.OPTIMIZER: make it average over the ranks.
    demo.OPTIMIZER = monitored_mpi.DistributedOptimizer(demo.OPTIMIZER)
    state = monitored.TrainState(seed=0)
    # This rank's rows of the training set (a tuple of arrays is split by rows),
    # shuffled and batched ahead of the step, fed to demo.train_step as `batch`.
    batches = data.shuffle_batch(
        data.shard((x_train, y_train), SIZE, RANK),
        args.batch,
        capacity=8 * args.batch,
        min_after_dequeue=4 * args.batch,
        seed=0,
        enqueue_many=True,
        feed="batch",
        name="digits",
    )

    async with monitored.MonitoredTrainingSession(
        state,
        scaffold=monitored.Scaffold(init_fn=demo.init_params),
        hooks=[batches, monitored.StopAtStepHook(last_step=args.steps)],
        save_summaries_steps=None,
        log_step_count_steps=None,
    ) as sess:
        while not sess.should_stop():
            await sess.run(demo.train_step)

    # The held-out set in batches of 24 (a list is split by batch): each rank
    # evaluates its own batches, every rank gets the results over all of them.
    held_out = [(x_test[i : i + 24], y_test[i : i + 24]) for i in range(0, len(y_test), 24)]
    result = await evaluate_once(
        demo.eval_step,
        demo.eval_metrics(),
        input=data.shard(held_out, SIZE, RANK),
        state=state,
        sharded=True,
    )
    if RANK == 0:
        print(
            f"{SIZE} rank(s), step {state.global_step}: held-out accuracy "
            f"{result.metrics['accuracy']:.3f} on {len(y_test)} digits"
        )
    return result.metrics["accuracy"]


if __name__ == "__main__":
    anyio.run(main)
