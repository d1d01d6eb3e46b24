"""The in-step API: bad input gets errors naming the summary, the step and the problem."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import monitored_summaries as summaries
from monitored import MonitoredSession, StopAtStepHook, TrainState
from monitored_summaries import SummaryNameError, SummarySaverHook, SummaryValueError

pytestmark = pytest.mark.anyio


async def run_one(logdir: str, record: Callable[[], None]) -> None:
    def step(state: TrainState) -> None:
        state.global_step += 1
        record()

    hooks = [StopAtStepHook(last_step=1), SummarySaverHook(save_steps=1, output_dir=logdir)]
    async with MonitoredSession(TrainState(), hooks=hooks) as s:
        await s.run(step)


@pytest.mark.parametrize("name", ["", 3, None, b"loss"])
async def test_empty_or_non_string_name(logdir: str, name: Any) -> None:
    with pytest.raises(SummaryNameError, match=r"summaries.scalar at step 1: the summary name"):
        await run_one(logdir, lambda: summaries.scalar(name, 1.0))


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (lambda: summaries.scalar("loss", "1.0"), r"scalar 'loss' at step 1: expected a NumPy"),
        (lambda: summaries.scalar("loss", {"a": 1}), r"scalar 'loss' at step 1: expected a NumPy"),
        (
            lambda: summaries.scalar("loss", np.ones(3)),
            r"scalar 'loss' at step 1: expected one real number, got an array of shape \(3,\)",
        ),
        (lambda: summaries.histogram("w", None), r"histogram 'w' at step 1: expected a NumPy"),
        (
            lambda: summaries.histogram("w", np.array(["a"])),
            r"histogram 'w' at step 1: expected real numbers",
        ),
        (
            lambda: summaries.image("img", np.zeros((4, 4, 3))),
            r"image 'img' at step 1: expected a 4-D .* got shape \(4, 4, 3\)",
        ),
        (
            lambda: summaries.image("img", np.zeros((1, 4, 4, 2))),
            r"image 'img' at step 1: .*1, 3 or 4 channels",
        ),
        (
            lambda: summaries.image("img", np.zeros((1, 4, 4, 3), np.int32)),
            r"image 'img' at step 1: expected uint8, or floats in \[0, 1\], got dtype int32",
        ),
        (
            lambda: summaries.image("img", np.zeros((1, 4, 4, 3)), max_outputs=0),
            r"image 'img' at step 1: max_outputs must be a positive int",
        ),
        (
            lambda: summaries.audio("a", np.zeros(10), 8000),
            r"audio 'a' at step 1: expected floats of shape \[batch, frames\]",
        ),
        (
            lambda: summaries.audio("a", np.zeros((1, 10)), 0),
            r"audio 'a' at step 1: sample_rate must be a positive number",
        ),
        (lambda: summaries.text("t", 5), r"text 't' at step 1: expected a str"),
    ],
)
async def test_bad_values(logdir: str, record: Callable[[], None], message: str) -> None:
    with pytest.raises(SummaryValueError, match=message):
        await run_one(logdir, record)


async def test_non_finite_histogram_is_raised_from_the_next_step(logdir: str) -> None:
    def step(state: TrainState) -> None:
        state.global_step += 1
        summaries.histogram("w", np.array([1.0, np.nan]))

    hook = SummarySaverHook(save_steps=1, output_dir=logdir)
    with pytest.raises(
        summaries.SummaryError, match=r"histogram 'w' at step 1: 1 of 2 values are NaN"
    ):
        async with MonitoredSession(TrainState(), hooks=[StopAtStepHook(last_step=1), hook]) as s:
            await s.run(step)


def test_calls_outside_a_due_step_do_nothing() -> None:
    summaries.scalar("", object())
    summaries.histogram(3, None)  # type: ignore[arg-type]
    summaries.image("x", None)
    summaries.audio("x", None, 0)
    summaries.text("x", None)


def test_hparams_checks_its_input() -> None:
    with pytest.raises(SummaryNameError, match="summaries.hparams: names must be non-empty"):
        summaries.hparams({"": 1})
    with pytest.raises(
        SummaryValueError,
        match=r"summaries.hparams: 'layers' must be a str, bool or number, got list",
    ):
        summaries.hparams({"layers": [1, 2]})
