"""The processes of ``test_evaluator_beside_a_trainer.py``: a trainer, a copier, evaluators.

Run as ``python _evaluator_roles.py <role> <json arguments>``; each role is a
real process doing what its counterpart in production does, so that the tests
race them for real (no mocks, no shared memory, only the directory).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np

import monitored
from monitored import metrics as m

#: The step of the trainer's last checkpoint: the evaluators stop once they evaluated it.
FINAL_STEP = 1_000_000


def trainer(directory: str, seconds: float, size: int, keep: int, ready: str) -> None:
    """Save every step for ``seconds`` (once ``ready`` exists), keeping the newest ``keep``.

    Every entry of ``w`` equals the step, so an evaluator can tell a
    consistent checkpoint from a mix of two. The last checkpoint is of step
    :data:`FINAL_STEP`, as if training jumped there. Prints how many were saved.
    """
    from monitored_checkpoint import Saver

    deadline = time.monotonic() + 120
    while not os.path.exists(ready):  # the evaluator is up: they race from the first save
        if time.monotonic() > deadline:
            raise TimeoutError("the evaluator never started")
        time.sleep(0.01)
    saver = Saver(max_to_keep=keep)
    state = monitored.TrainState({"w": np.zeros(size)})
    end = time.monotonic() + seconds
    saved = 0
    while state.global_step < FINAL_STEP:
        state.global_step = state.global_step + 1 if time.monotonic() < end else FINAL_STEP
        state["w"].fill(state.global_step)
        saver.save(state, os.path.join(directory, "model.ckpt"))
        saved += 1
    print(json.dumps({"saved": saved}))


def copier(source: str, target: str, mode: str, done: str) -> None:
    """Copy ``source`` into ``target`` file by file, in name order, until ``done`` exists.

    ``rsync`` mode copies each file whole under a temporary name and renames it
    into place (a manifest lands before its data file); ``inplace`` writes each
    file where it goes, in small pieces, slowly (``cp`` over a slow link). Files gone from ``source`` are
    removed from ``target`` after each pass (``rsync --delete``).
    """
    copied: dict[str, tuple[int, int]] = {}
    finishing = False
    while True:
        finishing = finishing or os.path.exists(done)
        names = sorted(n for n in os.listdir(source) if not n.startswith("."))
        changed = False
        for name in names:
            try:
                info = os.stat(os.path.join(source, name))
                if copied.get(name) == (info.st_ino, info.st_mtime_ns):
                    continue
                data = Path(source, name).read_bytes()
            except FileNotFoundError:
                continue  # rotated away meanwhile
            _copy(data, os.path.join(target, name), mode)
            copied[name] = (info.st_ino, info.st_mtime_ns)
            changed = True
        for name in set(os.listdir(target)) - set(names):
            if not name.startswith("."):
                Path(target, name).unlink(missing_ok=True)
                copied.pop(name, None)
        if finishing and not changed:
            return
        time.sleep(0.005)


def _copy(data: bytes, path: str, mode: str) -> None:
    if mode == "rsync":
        temporary = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.partial")
        Path(temporary).write_bytes(data)
        os.replace(temporary, path)
        return
    with open(path, "wb") as file:
        for start in range(0, len(data), 1 << 16):
            file.write(data[start : start + (1 << 16)])
            file.flush()
            time.sleep(0.002)  # a slow link: the file is seen half written for a while


def eval_step(state: monitored.TrainState, metrics: dict[str, m.Metric]) -> None:
    w = state["w"]
    metrics["w"].update(w[:1])
    metrics["spread"].update(np.array([w.max() - w.min()]))  # 0 unless two states were mixed
    raise StopIteration  # one step per evaluation


def _metrics() -> dict[str, m.Metric]:
    return {"w": m.Mean(), "spread": m.Mean()}


def evaluator(
    directory: str, how: str, timeout: float, template: int, ready: str, out: str
) -> None:
    """Follow ``directory`` (``evaluate_repeatedly`` or ``Experiment.continuous_eval``).

    Ends once it has evaluated the checkpoint of :data:`FINAL_STEP`, or after
    ``timeout`` seconds without a new checkpoint (a failure: the tests check).

    With a ``template`` size, each checkpoint is restored into a state that
    has ``w`` already: in place, after a first pass verified the whole file,
    so a rotation has that pass's whole time to delete the file. Writes each
    result (step, ``w``, spread, path) to ``out`` as JSON; any exception ends
    the process with its traceback.
    """
    from monitored.evaluation import Experiment, evaluate_repeatedly

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    async def follow() -> list[Any]:
        if how == "repeatedly":
            return await evaluate_repeatedly(
                directory,
                eval_step,
                _metrics(),
                eval_interval_secs=0,
                timeout=timeout,
                poll_secs=0.005,
                summary_dir=None,
                until=lambda result: result.global_step >= FINAL_STEP,
                state_fn=(lambda: monitored.TrainState({"w": np.zeros(template)}))
                if template
                else None,
            )
        experiment = Experiment(
            lambda state: None,
            eval_step,
            _metrics(),
            model_dir=directory,
            continuous_eval_throttle_secs=0,
            log_step_count_steps=None,
            train_steps=FINAL_STEP,
        )
        return await experiment.continuous_eval(delay_secs=0, timeout=timeout)

    Path(ready).touch()  # the trainer starts now: the evaluator follows from its first save
    results = anyio.run(follow)
    Path(out).write_text(
        json.dumps(
            [
                [r.global_step, r.metrics["w"], r.metrics["spread"], r.checkpoint_path]
                for r in results
            ]
        )
    )


def read_only(directory: str, out: str) -> None:
    """Evaluate a directory this process may only read, each way an evaluator can."""
    from monitored.evaluation import Experiment, evaluate_once, evaluate_repeatedly

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    async def evaluate() -> list[int]:
        once = await evaluate_once(eval_step, _metrics(), checkpoint_dir=directory)
        repeated = await evaluate_repeatedly(
            directory, eval_step, _metrics(), eval_interval_secs=0, timeout=0.1, poll_secs=0.05
        )
        experiment = Experiment(
            lambda state: None,
            eval_step,
            _metrics(),
            model_dir=directory,
            log_step_count_steps=None,
        )
        followed = await experiment.continuous_eval(
            delay_secs=0, throttle_delay_secs=0, timeout=0.1
        )
        evaluated = await experiment.evaluate(delay_secs=0)
        return [r.global_step for r in (once, *repeated, *followed, evaluated)]

    Path(out).write_text(json.dumps(anyio.run(evaluate)))


if __name__ == "__main__":
    role, arguments = sys.argv[1], json.loads(sys.argv[2])
    {"trainer": trainer, "copier": copier, "evaluator": evaluator, "read_only": read_only}[role](
        **arguments
    )
