"""The sweep of docs/optuna.md, run as written: trials are pruned before their end.

The page's code block is executed with the pieces it leaves to the reader
(a step, an evaluation, the data) filled in with a small classification
problem on which a poor learning rate shows early.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState

import monitored

DOCS = Path(__file__).parents[3] / "docs" / "optuna.md"

optuna.logging.set_verbosity(optuna.logging.WARNING)


def docs_sweep() -> str:
    """The page's first Python block: the whole sweep."""
    match = re.search(r"```python\n(.*?)```", DOCS.read_text(), flags=re.DOTALL)
    assert match is not None, "docs/optuna.md has no Python block"
    return match.group(1)


def pieces() -> dict[str, Any]:
    """What the docs' code calls and leaves to the reader: softmax regression on blobs."""
    rng = np.random.default_rng(0)
    centers = rng.normal(0, 1.5, (4, 8))
    labels = rng.integers(0, 4, 1200)
    x = (centers[labels] + rng.normal(0, 1.0, (1200, 8))).astype(np.float32)
    x_train, y_train, x_test, y_test = x[:1000], labels[:1000], x[1000:], labels[1000:]

    def make_train_step(lr: float) -> Any:
        def train_step(state: monitored.TrainState) -> dict[str, Any]:
            index = state.rng.integers(0, len(y_train), 32)
            logits = x_train[index] @ state["w"]
            probs = np.exp(logits - logits.max(axis=1, keepdims=True))
            probs /= probs.sum(axis=1, keepdims=True)
            probs[np.arange(32), y_train[index]] -= 1
            state["w"] -= lr * (x_train[index].T @ probs / 32).astype(np.float32)
            state.global_step += 1
            return {}

        return train_step

    def eval_step(state: monitored.TrainState, batch: Any, metrics: dict[str, Any]) -> None:
        x, y = batch
        metrics["accuracy"].update(y, (x @ state["w"]).argmax(axis=1))

    return {
        "make_train_step": make_train_step,
        "eval_step": eval_step,
        "metrics": lambda: {"accuracy": monitored.metrics.Accuracy()},
        "held_out": lambda: [(x_test, y_test)],
        "new_state": lambda seed: monitored.TrainState(
            {"w": np.zeros((8, 4), np.float32)}, seed=seed
        ),
    }


def test_the_docs_sweep_prunes_trials_before_their_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD")  # checkpoints need the plugin
    monkeypatch.setenv("MONITORED_DISABLE_PLUGINS", "progress,summaries")
    namespace = pieces()
    exec(docs_sweep(), namespace)
    study: optuna.Study = namespace["study"]
    trials = study.trials
    assert len(trials) == 32
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(pruned) + len(complete) == 32
    assert len(pruned) >= 8, "a sweep that barely prunes"
    # Judged every 100 steps: the pruned ones stopped long before step 2000.
    assert all(max(t.intermediate_values) <= 1000 for t in pruned)
    assert all(sorted(t.intermediate_values) == list(range(100, 2001, 100)) for t in complete)
    assert (tmp_path / "runs" / "lr-sweep" / "trial-31").is_dir()
