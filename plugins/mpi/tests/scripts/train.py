"""A small data-parallel training run, launched by the tests under ``mpiexec``.

``python train.py SCENARIO STEPS OUT_DIR``: each rank trains a linear model
on its own shard of a fixed data set with ``DistributedOptimizer`` and writes
what the test checks (final step, arrays, RNG draws) to ``OUT_DIR/rank<N>.json``.
The state also holds a Fortran-ordered and a transposed array, and an entry
that only ``init_fn`` creates; ``BIT_GENERATOR`` picks ``state.rng``'s kind.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import anyio
import numpy as np

import monitored
import monitored_mpi

SCENARIO, STEPS, OUT = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
RANK, SIZE = monitored_mpi.rank(), monitored_mpi.size()


class StopOnRank1At7:
    def after_run(self, run_context, run_values):
        if RANK == 1 and run_context.session.state.global_step == 7:
            run_context.request_stop()


class FailOnRank:
    def after_run(self, run_context, run_values):
        if RANK == SIZE - 1 and run_context.session.state.global_step == 3:
            raise ValueError("boom on the last rank")


class AbortedOnRank1At3:
    def after_run(self, run_context, run_values):
        if RANK == 1 and run_context.session.state.global_step == 3:
            raise monitored.AbortedError("the parameter server restarted")


class EndFailsOnRank1:
    def end(self, session):
        if RANK == 1:
            raise RuntimeError("end hook failed on rank 1")


class SigtermOnRank1At5:
    def after_run(self, run_context, run_values):
        if RANK == 1 and run_context.session.state.global_step == 5:
            os.kill(os.getpid(), signal.SIGTERM)


class CollectiveOnRank0:
    def after_run(self, run_context, run_values):
        if RANK == 0 and run_context.session.state.global_step == 2:
            monitored_mpi.allreduce(np.ones(3), name="only-on-rank-0")


class FreezeRank1At5:
    """Rank 1 freezes (SIGSTOP): to the others, a host that vanished from the network."""

    def after_run(self, run_context, run_values):
        if RANK == 1 and run_context.session.state.global_step == 5:
            (OUT / "frozen_at").write_text(repr(time.time()))
            os.kill(os.getpid(), signal.SIGSTOP)


class BusyOnRank0At3:
    """Rank 0 holds the interpreter in pure Python for BUSY_SECS (a long, slow save)."""

    def after_run(self, run_context, run_values):
        if RANK == 0 and run_context.session.state.global_step == 3:
            end = time.monotonic() + float(os.environ["BUSY_SECS"])
            total = 0
            while time.monotonic() < end:
                total += sum(range(1000))


class Paced:
    """Steps of 20 ms, and a file saying training runs (the test then cuts the link)."""

    def after_run(self, run_context, run_values):
        if run_context.session.state.global_step == 3:
            (OUT / f"running{RANK}").write_text(repr(time.time()))
        time.sleep(0.02)


opt = monitored_mpi.DistributedOptimizer(monitored.train.MomentumOptimizer(0.05, 0.9))


INIT_RAN = False


def make_state() -> monitored.TrainState:
    width = 4 + (RANK if SCENARIO == "mismatch" else 0)
    kind = getattr(np.random, os.environ.get("BIT_GENERATOR", "PCG64"))
    arrays = {
        "w": np.zeros(width),
        "b": np.zeros(()),
        "fortran": np.zeros((3, 2), order="F"),
        "transposed": np.zeros((2, 3), np.float32).T,
    }
    state = monitored.TrainState(
        arrays,
        rng=np.random.Generator(kind(RANK + 100)),
        non_trainable=["fortran", "transposed", "pretrained"],
    )
    opt.create_slots(state)
    return state


def init(state: monitored.TrainState) -> None:
    # As a warm start would: runs on the chief only, and creates an entry.
    global INIT_RAN
    INIT_RAN = True
    state["w"][:] = state.rng.normal(size=state["w"].shape)
    state["fortran"][...] = state.rng.normal(size=(3, 2))
    state["transposed"][...] = state.rng.normal(size=(3, 2))
    state["pretrained"] = np.asfortranarray(state.rng.normal(size=(2, 2)).astype(np.float32))


rng = np.random.default_rng(0)
X = rng.normal(size=(64, 4))
Y = X @ np.array([1.0, -2.0, 0.5, 3.0]) + 0.25
shard = slice(RANK, None, SIZE)


def step(state: monitored.TrainState) -> dict:
    if SCENARIO == "nan" and RANK == 1 and state.global_step == 4:
        raise FloatingPointError("NaN loss on rank 1")
    noise = state.rng.normal(size=(16,))  # per-rank stream, checkpointed through the chief
    x, y = X[shard][:16], Y[shard][:16] + 1e-3 * noise
    err = x @ state["w"] + state["b"] - y
    grads = {"w": 2 * x.T @ err / len(y), "b": np.asarray(2 * err.mean())}
    opt.apply_gradients(state, grads)
    return {"loss": float((err**2).mean())}


async def main() -> None:
    hooks: list[object] = [monitored.StopAtStepHook(last_step=STEPS)]
    hooks += {
        "stop7": [StopOnRank1At7()],
        "fail": [FailOnRank()],
        "sigterm": [SigtermOnRank1At5()],
        "partial": [CollectiveOnRank0()],
        "endfail": [EndFailsOnRank1()],
        "aborted": [AbortedOnRank1At3()],
        "frozen": [FreezeRank1At5()],
        "busy": [BusyOnRank0At3()],
        "paced": [Paced()],
    }.get(SCENARIO, [])
    checkpoint_dir = os.environ.get("CKPT_DIR")
    draws = []
    async with monitored.MonitoredTrainingSession(
        make_state(),
        hooks=hooks,
        scaffold=monitored.Scaffold(init_fn=init),
        checkpoint_dir=checkpoint_dir,
        save_checkpoint_steps=int(os.environ.get("SAVE_STEPS", "1000")) if checkpoint_dir else None,
        save_summaries_steps=None,
        log_step_count_steps=None,
    ) as sess:
        while not sess.should_stop():
            await sess.run(step)
        draws = sess.state.rng.normal(size=2).tolist()
        result = {
            "rank": RANK,
            "chief": sess.is_chief,
            "step": sess.state.global_step,
            "w": sess.state["w"].tolist(),
            "b": float(sess.state["b"]),
            "draws": draws,
            "fortran": sess.state["fortran"].tolist(),
            "transposed": sess.state["transposed"].tolist(),
            "pretrained": sess.state["pretrained"].tolist(),
            "pretrained_trainable": sess.state.is_trainable("pretrained"),
            "init_ran": INIT_RAN,
            "plugins": [info.name for info in sess.plugins],
        }
    (OUT / f"rank{RANK}.json").write_text(json.dumps(result))


anyio.run(main)
