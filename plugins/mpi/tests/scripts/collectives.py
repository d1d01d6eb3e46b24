"""The collectives and DistributedOptimizer on every rank; results to OUT_DIR/rank<N>.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

import monitored
import monitored_mpi
from monitored.metrics import Mean

OUT = Path(sys.argv[1])
RANK, SIZE = monitored_mpi.rank(), monitored_mpi.size()


def refused(call: object) -> str | None:
    """The CollectiveMismatchError of ``call()`` (raised on every rank alike), or None."""
    try:
        call()  # type: ignore[operator]
    except monitored_mpi.CollectiveMismatchError as exc:
        return str(exc)
    return None


# Mismatches first: every rank refuses, and the collectives after them still work.
checked = monitored_mpi.DistributedOptimizer(monitored.train.GradientDescentOptimizer(1.0))
same = {"w": np.ones(3), "v": np.ones((2, 2))}
refusals = {
    "allreduce_dtype": refused(
        lambda: monitored_mpi.allreduce(np.zeros(3, np.float32 if RANK else np.float64), name="g")
    ),
    "allreduce_shape": refused(lambda: monitored_mpi.allreduce(np.zeros(2 + (RANK == 2)))),
    "broadcast": refused(lambda: monitored_mpi.broadcast(np.zeros((RANK + 1, 1)))),
    "allgather": refused(lambda: monitored_mpi.allgather(np.zeros((1, 3 if RANK == 1 else 2)))),
    "optimizer_same": refused(lambda: checked.reduce_gradients(same)),
    # Later, rank 1 alone has no gradient for v, rank 2 passes w as float32.
    "optimizer_changed": refused(
        lambda: checked.reduce_gradients(
            {
                "w": np.ones(3, np.float32 if RANK == 2 else np.float64),
                "v": None if RANK == 1 else np.ones((2, 2)),
            }
        )
    ),
    "optimizer_names": refused(
        lambda: checked.reduce_gradients({"w": np.ones(3), **({"x": np.ones(1)} if RANK else {})})
    ),
}

# A layout that changes on rank 1 only, after a call every rank agreed on: the
# others have posted the old layout's first reduction with the check (by
# reduce-scatter from 1 MiB on, or fp16 gathering), and rank 1 joins it.
SAME_BIG = {"a": np.ones(300_000, np.float32)}
ONE_MORE = {"a": np.ones(300_000 + (RANK == 1), np.float32)}
by_scatter = monitored_mpi.DistributedOptimizer(monitored.train.GradientDescentOptimizer(1.0))
by_scatter.reduce_gradients(SAME_BIG)
refusals["optimizer_scatter_changed"] = refused(lambda: by_scatter.reduce_gradients(ONE_MORE))
by_fp16 = monitored_mpi.DistributedOptimizer(
    monitored.train.GradientDescentOptimizer(1.0), compression="fp16"
)
by_fp16.reduce_gradients(SAME_BIG)
refusals["optimizer_fp16_changed"] = refused(lambda: by_fp16.reduce_gradients(ONE_MORE))

mean = Mean(name="m")
mean.update(np.arange(RANK + 1, dtype=np.float64))
monitored_mpi.merge_metrics([mean])

state = monitored.TrainState({"w": np.zeros(3, np.float32), "e": np.zeros((4, 2))}, seed=0)
opt = monitored_mpi.DistributedOptimizer(monitored.train.GradientDescentOptimizer(1.0))
grads = {
    "w": np.full(3, RANK + 1, np.float32),
    "e": monitored.IndexedSlices(np.full((1, 2), float(RANK)), [RANK % 4], (4, 2)),
}
opt.apply_gradients(state, grads)
summed = monitored_mpi.DistributedOptimizer(
    monitored.train.GradientDescentOptimizer(1.0), op=monitored_mpi.Sum
).reduce_gradients(
    {
        "d": np.full(2, RANK + 1.0),
        "s": monitored.IndexedSlices(np.full((1, 2), 1.0), [RANK % 4], (4, 2)),
    }
)
fp16 = monitored_mpi.DistributedOptimizer(
    monitored.train.GradientDescentOptimizer(1.0), compression="fp16"
).reduce_gradients([(np.full(2, 0.5 * (RANK + 1)), "x")])

# Large enough to go by reduce-scatter (1 MiB and more), in three gradients of two
# dtypes whose packed sizes do not divide by the number of ranks; reused buffers.
big = {
    "a": np.arange(200_001, dtype=np.float32) * (RANK + 1),
    "b": np.full((300, 401), RANK + 1.0),
    "c": np.full(70_003, RANK + 1.0, np.float32),
}
for _ in range(2):
    averaged = opt.reduce_gradients(big, reuse_buffers=True)
mean_factor = (SIZE + 1) / 2  # the mean of 1, 2, ..., SIZE
# A world of one rank (COMM_SELF): its block is the whole sum, in buffers of its own.
alone = monitored_mpi.DistributedOptimizer(
    monitored.train.GradientDescentOptimizer(1.0),
    world_=monitored_mpi.World(MPI.COMM_SELF, MPI),
)
for _ in range(2):
    self_averaged = alone.reduce_gradients({"a": big["a"]}, reuse_buffers=True)
large = {
    "self_world": bool(np.array_equal(self_averaged["a"], big["a"])),
    "a": bool(np.array_equal(averaged["a"], np.arange(200_001, dtype=np.float32) * mean_factor)),
    "b": bool(np.array_equal(averaged["b"], np.full((300, 401), mean_factor))),
    "c": bool(np.array_equal(averaged["c"], np.full(70_003, mean_factor, np.float32))),
    "dtypes": [averaged[k].dtype.str for k in "abc"],
    "digest": float(averaged["a"].sum(dtype=np.float64) + averaged["b"].sum()),
}

result = {
    "allreduce_mean": monitored_mpi.allreduce(np.array([RANK, 1.0])).tolist(),
    "allreduce_max": monitored_mpi.allreduce(np.array([RANK]), "max").tolist(),
    "broadcast": monitored_mpi.broadcast(np.array([RANK * 10.0]), root=SIZE - 1).tolist(),
    "allgather": [a.tolist() for a in monitored_mpi.allgather(np.arange(RANK + 1))],
    "allgather_scalar": [a.tolist() for a in monitored_mpi.allgather(np.float64(RANK))],
    "mean": mean.result(),
    "w": state["w"].tolist(),
    "e": state["e"].tolist(),
    "fp16": [fp16[0][0].tolist(), fp16[0][0].dtype.str],
    "large": large,
    "summed": [summed["d"].tolist(), summed["s"].values.tolist()],
    "local": [monitored_mpi.local_rank(), monitored_mpi.local_size()],
    "spec": monitored_mpi.world() is not None,
    "refusals": refusals,
}
(OUT / f"rank{RANK}.json").write_text(json.dumps(result))
