"""Sweep the demo's learning rate and hidden size with Optuna, pruning poor trials early.

The demo's network (one hidden layer in plain NumPy, scikit-learn's handwritten
digits) is trained by ``monitored.train_and_evaluate`` once per trial, with the
held-out accuracy evaluated every ``--eval-every`` steps. Each evaluation is
reported to the trial by ``OptunaPruningHook`` (``monitored-optuna``); when
Optuna's ``MedianPruner`` finds a trial worse than the median of the finished
ones at the same step, the session stops cleanly (its checkpoint written when
``--checkpoint-dir`` is given) and the trial ends as pruned.
``monitored_optuna.optimize`` runs ``--concurrency`` trials at once in one event
loop through Optuna's ask/tell interface.

With ``--storage sqlite:///runs/sweep.db`` the study lives in a SQLite file
(its directory is made if missing): run the script in several terminals (or on
several machines sharing a database server's URL) and they work on the one
study; ``optuna-dashboard sqlite:///runs/sweep.db`` shows it. Such a study
records each running trial's heartbeat (``--heartbeat`` seconds): a trial
whose process died (killed, out of memory, a lost machine) is failed once it
has missed them for twice that, and retried with its parameters by the next
run of the script, from its last checkpoint with ``--checkpoint-dir``; a trial
interrupted by Ctrl-C is retried the same way. Each trial keeps its
checkpoints under the number of the trial it retries
(``monitored_optuna.original_trial_number``).

Run it with ``python examples/sweep.py`` (``--trials``, ``--steps``,
``--concurrency``, ``--storage``, ``--checkpoint-dir``).
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

import anyio
import numpy as np
import optuna
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import monitored
from monitored_optuna import OptunaPruningHook, optimize, original_trial_number

log = logging.getLogger("sweep")


def load_data(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Digits scaled to [0, 1], split 80/20 into train and held-out test sets."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=seed, stratify=y
    )
    return x_train, x_test, y_train, y_test


def forward(state: monitored.TrainState, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    hidden = np.maximum(x @ state["w1"] + state["b1"], 0)
    return hidden, hidden @ state["w2"] + state["b2"]


def make_train_step(
    optimizer: monitored.MomentumOptimizer, x_train: np.ndarray, y_train: np.ndarray
) -> Any:
    """A step on a batch of 32 drawn with the state's RNG (checkpointed with the state)."""

    def train_step(state: monitored.TrainState) -> dict[str, Any]:
        index = state.rng.integers(0, len(y_train), 32)
        x, y = x_train[index], y_train[index]
        hidden, logits = forward(state, x)
        logits -= logits.max(axis=1, keepdims=True)
        probs = np.exp(logits)
        probs /= probs.sum(axis=1, keepdims=True)
        loss = -np.log(probs[np.arange(len(y)), y] + 1e-12).mean()
        d_logits = probs
        d_logits[np.arange(len(y)), y] -= 1
        d_logits /= len(y)
        d_hidden = (d_logits @ state["w2"].T) * (hidden > 0)
        grads = {
            "w2": hidden.T @ d_logits,
            "b2": d_logits.sum(axis=0),
            "w1": x.T @ d_hidden,
            "b1": d_hidden.sum(axis=0),
        }
        optimizer.apply_gradients(state, grads)  # global_step += 1
        return {"loss": loss}

    return train_step


def eval_step(
    state: monitored.TrainState,
    batch: tuple[np.ndarray, np.ndarray],
    metrics: dict[str, monitored.metrics.Metric],
) -> None:
    x, y = batch
    metrics["accuracy"].update(y, forward(state, x)[1].argmax(axis=1))


async def objective(
    trial: optuna.trial.Trial,
    steps: int,
    eval_every: int,
    seed: int = 0,
    checkpoint_dir: str | None = None,
) -> float:
    """Train one trial's network; its final held-out accuracy, or ``TrialPruned``."""
    learning_rate = trial.suggest_float("learning_rate", 1e-3, 0.5, log=True)
    n_hidden = trial.suggest_int("hidden", 8, 128, log=True)
    x_train, x_test, y_train, y_test = load_data(seed)
    optimizer = monitored.MomentumOptimizer(learning_rate, momentum=0.9)

    def init_params(state: monitored.TrainState) -> None:
        shapes = {"w1": (64, n_hidden), "b1": (n_hidden,), "w2": (n_hidden, 10), "b2": (10,)}
        for name, shape in shapes.items():
            scale = np.sqrt(2 / shape[0]) if len(shape) == 2 else 0.0
            state[name] = (state.rng.normal(0, 1, shape) * scale).astype(np.float32)
        optimizer.create_slots(state)

    held_out = [(x_test[i : i + 128], y_test[i : i + 128]) for i in range(0, len(y_test), 128)]
    # One directory per study, then per trial: a checkpoint of another study's trial of
    # the same number is refused, never trained on under this trial's parameters. A retry
    # of a dead or interrupted trial uses that trial's directory: it goes on from there.
    model_dir = (
        None
        if checkpoint_dir is None
        else os.path.join(
            checkpoint_dir, trial.study.study_name, f"trial-{original_trial_number(trial)}"
        )
    )
    result = await monitored.train_and_evaluate(
        monitored.TrainSpec(
            make_train_step(optimizer, x_train, y_train),
            max_steps=steps,
            # Each held-out evaluation is reported to the trial, which may be pruned.
            hooks=[OptunaPruningHook(trial, "accuracy")],
        ),
        monitored.EvalSpec(
            eval_step,
            {"accuracy": monitored.metrics.Accuracy()},
            input_fn=lambda: held_out,
            throttle_secs=0,
        ),
        model_dir=model_dir,
        state=monitored.TrainState(seed=seed + trial.number),
        scaffold=monitored.Scaffold(init_fn=init_params),
        min_eval_frequency=eval_every,
        save_checkpoint_steps=eval_every,
        log_step_count_steps=None,
    )
    accuracy = float(result.metrics["accuracy"])
    log.info("trial %d: %s -> held-out accuracy %.3f", trial.number, trial.params, accuracy)
    return accuracy


async def sweep(
    study: optuna.Study,
    trials: int,
    steps: int,
    eval_every: int,
    concurrency: int,
    checkpoint_dir: str | None = None,
) -> optuna.Study:
    """Run ``trials`` trials of ``study``, ``concurrency`` at once."""
    await optimize(
        study,
        lambda trial: objective(trial, steps, eval_every, checkpoint_dir=checkpoint_dir),
        n_trials=trials,
        concurrency=concurrency,
    )
    return study


def open_storage(url: str, heartbeat: int = 60) -> optuna.storages.RDBStorage:
    """The database at ``url``, recording trials' heartbeats every ``heartbeat`` seconds.

    A trial with no heartbeat for ``2 * heartbeat`` seconds is taken for dead,
    failed, and retried with its parameters by Optuna's retry callback. The
    directory of a ``sqlite:///`` file is made if it is missing.
    """
    if url.startswith("sqlite:///") and not url.startswith("sqlite:///file:"):
        path = url[len("sqlite:///") :].partition("?")[0]
        if path and path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    # The callback's name since Optuna 4.9; RetryFailedTrialCallback before it.
    retry = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)
    if retry is not None:
        return optuna.storages.RDBStorage(
            url,
            heartbeat_interval=heartbeat,
            grace_period=2 * heartbeat,
            heartbeat_stale_trial_callback=retry(),
        )
    return optuna.storages.RDBStorage(
        url,
        heartbeat_interval=heartbeat,
        grace_period=2 * heartbeat,
        failed_trial_callback=optuna.storages.RetryFailedTrialCallback(),
    )


def new_study(
    storage: str | optuna.storages.BaseStorage | None = None,
    name: str | None = None,
    seed: int = 0,
    n_startup_trials: int = 2,
    n_warmup_steps: int = 50,
) -> optuna.Study:
    """A study maximizing accuracy that prunes a trial below the median of the finished ones.

    Pruning starts once ``n_startup_trials`` trials have finished, and judges
    evaluations after ``n_warmup_steps`` steps only (the first ones say little).
    """
    return optuna.create_study(
        study_name=name,
        storage=storage,
        load_if_exists=storage is not None,
        direction="maximize",
        sampler=optuna.samplers.TPESampler(seed=seed),
        pruner=optuna.pruners.MedianPruner(
            n_startup_trials=n_startup_trials, n_warmup_steps=n_warmup_steps
        ),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--steps", type=int, default=600, help="training steps per trial")
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=4, help="trials at once")
    parser.add_argument("--storage", default=None, help="e.g. sqlite:///runs/sweep.db")
    parser.add_argument("--study-name", default="sweep")
    parser.add_argument(
        "--checkpoint-dir", default=None, help="<study name>/trial-<number> in it per trial"
    )
    parser.add_argument(
        "--heartbeat", type=int, default=60, help="seconds between a trial's heartbeats"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    log.setLevel(logging.INFO)
    storage = None if args.storage is None else open_storage(args.storage, args.heartbeat)
    study = new_study(storage, args.study_name if args.storage else None)
    anyio.run(
        sweep,
        study,
        args.trials,
        args.steps,
        args.eval_every,
        args.concurrency,
        args.checkpoint_dir,
    )
    states = [t.state.name for t in study.trials]
    complete, pruned = states.count("COMPLETE"), states.count("PRUNED")
    counts = f"{len(states)} trials: {complete} complete, {pruned} pruned"
    if "COMPLETE" not in states:  # stopped (SIGTERM) before any trial finished
        print(f"{counts}; no trial has completed yet, so there is no best one")
        return
    print(f"{counts}; best held-out accuracy {study.best_value:.3f} with {study.best_params}")


if __name__ == "__main__":
    main()
