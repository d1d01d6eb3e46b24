"""Exact resume: a run stopped at step k and resumed ends bitwise identical to one
that was never stopped, with shuffle_batch and several workers (checkpoint plugin)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import monitored
from monitored import data

checkpoint = pytest.importorskip("monitored_checkpoint")

EXAMPLES = (
    np.random.default_rng(1).normal(size=(37, 3)),
    np.arange(37, dtype=np.int64),
)


def make_pipeline(feed: bool, batch_size: int = 5, seed: int | None = 7) -> data.Pipeline:
    return data.shuffle_batch(
        EXAMPLES,
        batch_size=batch_size,
        capacity=20,
        min_after_dequeue=10,
        num_threads=3,
        seed=seed,
        enqueue_many=True,
        allow_smaller_final_batch=True,
        num_epochs=3,
        feed="batch" if feed else False,
    )


async def train(
    directory: Path | None, last_step: int, feed: bool, pipeline: data.Pipeline | None = None
) -> tuple[monitored.TrainState, list[list[int]], data.Pipeline]:
    state = monitored.TrainState({"w": np.zeros(3)}, seed=3)
    pipeline = pipeline or make_pipeline(feed)
    seen: list[list[int]] = []

    def step(state: monitored.TrainState, batch: tuple[np.ndarray, np.ndarray]) -> dict[str, Any]:
        x, labels = batch
        seen.append(labels.tolist())
        noise = state.rng.normal(size=3) * 1e-3
        state["w"] = state["w"] * 0.9 + x.mean(axis=0) + noise
        state.global_step += 1
        return {"w": state["w"]}

    hooks: list[object] = [pipeline, monitored.StopAtStepHook(last_step=last_step)]
    if directory is not None:
        hooks.append(
            checkpoint.CheckpointSaverHook(
                directory, save_steps=1, asynchronous=False, handle_signals=False
            )
        )
    async with monitored.MonitoredSession(state, hooks=hooks) as sess:
        if feed:
            while not sess.should_stop():
                await sess.run(step)
        else:
            async for batch in pipeline:
                await sess.run(step, batch)
                if sess.should_stop():
                    break
    return state, seen, pipeline


@pytest.mark.parametrize("feed", [True, False], ids=["feed", "async-for"])
async def test_stopped_at_step_k_and_resumed_is_bitwise_identical(
    tmp_path: Path, feed: bool
) -> None:
    straight, straight_seen, _ = await train(None, 20, feed)
    first, first_seen, _ = await train(tmp_path, 7, feed)
    assert first.global_step == 7
    resumed, resumed_seen, pipeline = await train(tmp_path, 20, feed)
    assert resumed.global_step == 20
    assert first_seen + resumed_seen == straight_seen
    assert resumed["w"].tobytes() == straight["w"].tobytes()
    assert pipeline.plugin_state()["next"] == 20


async def test_the_end_of_the_epochs_ends_a_resumed_run_where_a_straight_one_ends(
    tmp_path: Path,
) -> None:
    straight, straight_seen, _ = await train(None, 1000, feed=True)
    assert straight.global_step == 23  # ceil(3 * 37 / 5): the last batch is smaller
    assert len(straight_seen[-1]) == 3 * 37 - 22 * 5
    await train(tmp_path, 21, feed=True)
    resumed, resumed_seen, _ = await train(tmp_path, 1000, feed=True)
    assert resumed.global_step == 23
    assert resumed_seen == straight_seen[21:]
    assert resumed["w"].tobytes() == straight["w"].tobytes()


async def test_a_drawn_seed_is_saved_and_restored(tmp_path: Path) -> None:
    first = make_pipeline(True, seed=None)
    await train(tmp_path, 4, True, first)
    second = make_pipeline(True, seed=None)
    assert second.seed != first.seed
    await train(tmp_path, 6, True, second)
    assert second.seed == first.seed


async def test_resuming_with_another_configuration_is_a_clear_error(tmp_path: Path) -> None:
    await train(tmp_path, 3, True)
    with pytest.raises(data.ResumeMismatchError, match=r"batch_size=5 \(now 6\)"):
        await train(tmp_path, 6, True, make_pipeline(True, batch_size=6))
