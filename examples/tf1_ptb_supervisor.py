"""A port of TF1's PTB language model script (``tf.train.Supervisor``) to ``monitored``.

tensorflow/models' ``tutorials/rnn/ptb/ptb_word_lm.py`` trains a word-level
recurrent language model under a ``Supervisor``: ``sv.managed_session()``, a
learning rate assigned at the start of each epoch, a validation pass after each
training epoch and a test pass at the end, all in the same managed session, and
``sv.saver.save(session, save_path, global_step=sv.global_step)``. This is that
program for ``monitored`` (our own code; the text is a tiny synthetic one drawn
from a fixed Markov chain instead of the Penn Treebank, the model a one-layer
tanh RNN with hand-written backprop through time instead of an LSTM), keeping
the original's structure so the two read side by side:

* ``PTBInput``/``ptb_producer`` -> :func:`batch_of`: batch *i* of an epoch is a
  function of *i* only, so a resumed run reads the same batches;
* ``PTBModel`` -> :func:`forward`/:func:`train_step`/:func:`eval_step`; the
  RNN state carried from batch to batch (TF1 fed ``final_state`` back as
  ``initial_state``) is a ``trainable=False`` state entry while training, so a
  checkpoint taken mid-epoch holds it; dropout draws from ``state.rng``;
* ``m.assign_lr(session, lr)`` -> a step that assigns the ``lr`` entry (it does
  not advance the global step, and the session does not warn about it, nor
  about the validation and test steps: see docs/supervisor.md);
* ``session.run(m.lr)`` -> ``session.fetch("lr")``;
* ``tf.summary.scalar("Training Loss", ...)`` under ``name_scope("Train")`` ->
  ``summaries.scalar("Train/Training Loss", ...)`` in the step, written as TF1's
  tag ``Train/Training_Loss``; the validation perplexity of each epoch is
  written with ``sv.summary_computed`` (the pattern for values a rarely run
  step computes);
* the epoch loop starts at the epoch and batch the restored global step is in,
  so a run killed mid-epoch and started again ends bit for bit where an
  uninterrupted one does.

Run: ``python examples/tf1_ptb_supervisor.py --save-path runs/ptb``
(``--max-max-epoch``, ``--stop-at-step``, ``--seed``).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
from typing import Any

import anyio
import numpy as np

import monitored
from monitored import Supervisor, TrainState

try:
    import monitored_summaries as summaries
except ImportError:  # pragma: no cover - the workspace installs it
    summaries = None  # type: ignore[assignment]

log = logging.getLogger("tf1_ptb_supervisor")


@dataclasses.dataclass(frozen=True)
class SmallConfig:
    """The original's ``SmallConfig``, scaled to a vocabulary of 24 words."""

    init_scale: float = 0.1
    learning_rate: float = 0.1
    max_grad_norm: float = 5.0
    num_steps: int = 5
    hidden_size: int = 32
    max_epoch: int = 2
    max_max_epoch: int = 4
    keep_prob: float = 0.9
    lr_decay: float = 0.5
    batch_size: int = 8
    vocab_size: int = 24


def synthetic_text(config: SmallConfig, seed: int) -> tuple[np.ndarray, ...]:
    """Train, valid and test word ids drawn from one fixed Markov chain (``ptb_raw_data``)."""
    rng = np.random.default_rng(seed)
    transitions = rng.dirichlet(np.full(config.vocab_size, 0.2), size=config.vocab_size)
    cumulative = np.cumsum(transitions, axis=1)
    words = np.empty(2000 + 500 + 500, dtype=np.int64)
    words[0] = 0
    draws = rng.random(len(words))
    for i in range(1, len(words)):
        row = cumulative[words[i - 1]]
        words[i] = min(int(np.searchsorted(row, draws[i])), config.vocab_size - 1)
    return words[:2000], words[2000:2500], words[2500:]


def epoch_size(data: np.ndarray, config: SmallConfig) -> int:
    return (len(data) // config.batch_size - 1) // config.num_steps


def batch_of(data: np.ndarray, i: int, config: SmallConfig) -> tuple[np.ndarray, np.ndarray]:
    """Batch ``i`` of an epoch: ``ptb_producer``'s inputs and targets (shifted by one)."""
    batch_len = len(data) // config.batch_size
    grid = data[: config.batch_size * batch_len].reshape(config.batch_size, batch_len)
    start = i * config.num_steps
    return grid[:, start : start + config.num_steps], grid[
        :, start + 1 : start + 1 + config.num_steps
    ]


#: The model's variables (``tf.trainable_variables()``).
TRAINED = ("embedding", "rnn/U", "rnn/b", "softmax_w", "softmax_b")


def make_init(config: SmallConfig) -> Any:
    def init(state: TrainState) -> None:
        """``tf.random_uniform_initializer(-init_scale, init_scale)``, from the state's RNG."""
        scale, vocab, hidden = config.init_scale, config.vocab_size, config.hidden_size
        shapes = {
            "embedding": (vocab, hidden),
            "rnn/U": (hidden, hidden),
            "rnn/b": (hidden,),
            "softmax_w": (hidden, vocab),
            "softmax_b": (vocab,),
        }
        for name, shape in shapes.items():
            state[name] = state.rng.uniform(-scale, scale, shape)

    return init


def new_state(config: SmallConfig, seed: int) -> TrainState:
    """The learning rate and the carried RNN state are TF1's non-trainable variables."""
    return TrainState(
        {"lr": np.zeros(()), "rnn/state": np.zeros((config.batch_size, config.hidden_size))},
        seed=seed,
        non_trainable=["lr", "rnn/state"],
    )


def forward(
    state: TrainState, x: np.ndarray, y: np.ndarray, h0: np.ndarray, keep: np.ndarray | None
) -> tuple[float, list[Any], np.ndarray]:
    """The cost (summed over time, averaged over the batch) and what backprop needs."""
    hs, steps = [h0], []
    cost = 0.0
    batch = x.shape[0]
    for t in range(x.shape[1]):
        h = np.tanh(state["embedding"][x[:, t]] + hs[-1] @ state["rnn/U"] + state["rnn/b"])
        hs.append(h)
        out = h if keep is None else h * keep[t]
        logits = out @ state["softmax_w"] + state["softmax_b"]
        logits -= logits.max(axis=1, keepdims=True)
        probs = np.exp(logits)
        probs /= probs.sum(axis=1, keepdims=True)
        cost -= float(np.log(probs[np.arange(batch), y[:, t]]).sum()) / batch
        steps.append((out, probs))
    return cost, [hs, steps], hs[-1]


def train_step(
    state: TrainState, x: np.ndarray, y: np.ndarray, config: SmallConfig
) -> dict[str, Any]:
    """One SGD step with truncated backprop through time and global-norm clipping."""
    batch, num_steps = x.shape
    keep = None
    if config.keep_prob < 1:
        masks = state.rng.random((num_steps, batch, config.hidden_size)) < config.keep_prob
        keep = masks / config.keep_prob
    cost, (hs, steps), final = forward(state, x, y, state["rnn/state"], keep)
    grads = {name: np.zeros_like(state[name]) for name in TRAINED}
    dh_next = np.zeros_like(final)
    for t in reversed(range(num_steps)):
        out, probs = steps[t]
        d_logits = probs.copy()
        d_logits[np.arange(batch), y[:, t]] -= 1
        d_logits /= batch
        grads["softmax_w"] += out.T @ d_logits
        grads["softmax_b"] += d_logits.sum(axis=0)
        d_out = d_logits @ state["softmax_w"].T
        dh = (d_out if keep is None else d_out * keep[t]) + dh_next
        da = dh * (1 - hs[t + 1] ** 2)
        np.add.at(grads["embedding"], x[:, t], da)
        grads["rnn/U"] += hs[t].T @ da
        grads["rnn/b"] += da.sum(axis=0)
        dh_next = da @ state["rnn/U"].T
    clipped, _ = monitored.clip_by_global_norm(grads, config.max_grad_norm)
    lr = float(state["lr"])
    OPTIMIZER.apply_gradients(state, clipped, learning_rate=lr)  # global_step += 1
    state["rnn/state"][...] = final
    if summaries is not None:
        summaries.scalar("Train/Training Loss", cost)
        summaries.scalar("Train/Learning Rate", lr)
    return {"cost": cost}


def eval_step(state: TrainState, x: np.ndarray, y: np.ndarray, h: np.ndarray) -> dict[str, Any]:
    """The validation and test model: no dropout, its RNN state carried by the loop."""
    cost, _, final = forward(state, x, y, h, None)
    return {"cost": cost, "final_state": final}


def assign_lr(state: TrainState, lr_value: float) -> None:
    """``m.assign_lr(session, lr_value)``."""
    state["lr"][...] = lr_value


def reset_rnn_state(state: TrainState) -> None:
    """``session.run(model.initial_state)`` at the start of a training epoch: zeros."""
    state["rnn/state"][...] = 0.0


OPTIMIZER = monitored.GradientDescentOptimizer(1.0)  # the rate is fed: state["lr"]


async def run_epoch(
    session: monitored.MonitoredSession,
    sv: Supervisor,
    data: np.ndarray,
    config: SmallConfig,
    *,
    training: bool,
    start: int = 0,
) -> float:
    """Runs the model on the given data (``run_epoch``); returns the perplexity."""
    costs, iters = 0.0, 0
    h = np.zeros((config.batch_size, config.hidden_size))
    size = epoch_size(data, config)
    for step in range(start, size):
        x, y = batch_of(data, step, config)
        if training:
            if sv.should_stop():
                break
            outputs = await session.run(train_step, x, y, config)
        else:
            outputs = await session.run(eval_step, x, y, h)
            h = outputs["final_state"]
        costs += outputs["cost"]
        iters += config.num_steps
        if training and step % (size // 5 or 1) == 0:
            log.info("%.3f perplexity: %.3f", step / size, math.exp(costs / iters))
    return math.exp(costs / iters) if iters else float("nan")


async def main(
    save_path: str | None,
    *,
    max_max_epoch: int = SmallConfig.max_max_epoch,
    stop_at_step: int | None = None,
    seed: int = 0,
) -> tuple[TrainState, dict[str, float]]:
    """Train, validate each epoch, test at the end; returns the state and the perplexities."""
    config = dataclasses.replace(SmallConfig(), max_max_epoch=max_max_epoch)
    train_data, valid_data, test_data = synthetic_text(config, seed)
    size = epoch_size(train_data, config)
    state = new_state(config, seed)
    hooks = [monitored.StopAtStepHook(last_step=stop_at_step)] if stop_at_step else []
    sv = Supervisor(
        state,
        logdir=save_path,
        init_fn=make_init(config),
        hooks=hooks,
        save_model_secs=600,
        save_summaries_secs=5,
    )
    results: dict[str, float] = {}
    async with sv.managed_session() as session:
        # A restored run picks up in the epoch and at the batch its global step is in.
        first_epoch, position = divmod(sv.global_step, size)
        for i in range(first_epoch, config.max_max_epoch):
            lr_decay = config.lr_decay ** max(i + 1 - config.max_epoch, 0.0)
            await session.run(assign_lr, config.learning_rate * lr_decay)
            log.info("Epoch: %d Learning rate: %.3f", i + 1, float(session.fetch("lr")))
            if i != first_epoch or position == 0:
                await session.run(reset_rnn_state)
            start = position if i == first_epoch else 0
            train_perplexity = await run_epoch(
                session, sv, train_data, config, training=True, start=start
            )
            log.info("Epoch: %d Train Perplexity: %.3f", i + 1, train_perplexity)
            if sv.should_stop():
                break
            valid_perplexity = await run_epoch(session, sv, valid_data, config, training=False)
            log.info("Epoch: %d Valid Perplexity: %.3f", i + 1, valid_perplexity)
            results[f"valid/{i + 1}"] = valid_perplexity
            if sv.summary_writer is not None:
                sv.summary_computed(session, {"Valid/Validation Perplexity": valid_perplexity})
        else:
            test_perplexity = await run_epoch(session, sv, test_data, config, training=False)
            log.info("Test Perplexity: %.3f", test_perplexity)
            results["test"] = test_perplexity
            if save_path:
                log.info("Saving model to %s.", save_path)
                sv.saver.save(session, save_path, global_step=sv.global_step)
    return state, results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--save-path", default="runs/ptb")
    parser.add_argument("--max-max-epoch", type=int, default=SmallConfig.max_max_epoch)
    parser.add_argument("--stop-at-step", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    final, perplexities = anyio.run(
        lambda: main(
            args.save_path,
            max_max_epoch=args.max_max_epoch,
            stop_at_step=args.stop_at_step,
            seed=args.seed,
        )
    )
    print(
        f"step {final.global_step}: " + ", ".join(f"{k} {v:.3f}" for k, v in perplexities.items())
    )
