"""The pattern docs/data.md gives for shard files on disk, run as written there."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import monitored
from monitored import data

fsspec = pytest.importorskip("fsspec")
safetensors_numpy = pytest.importorskip("safetensors.numpy")


def write_shards(directory: Path, n: int) -> None:
    for i in range(n):
        x = np.full((4, 2), i, dtype=np.float32)
        np.savez(directory / f"train-{i:05d}.npz", x=x, y=np.full(4, i, dtype=np.int64))
        safetensors_numpy.save_file(
            {"x": x, "y": np.full(4, i, dtype=np.int64)},
            str(directory / f"{i:05d}.safetensors"),
        )


async def test_npz_shards_through_fsspec_feed_the_steps_in_order(tmp_path: Path) -> None:
    write_shards(tmp_path, 5)
    files = sorted(fsspec.open_files(f"{tmp_path}/train-*.npz"), key=lambda f: f.path)

    def load_npz(i: int) -> dict[str, np.ndarray]:
        with files[i] as f:  # IndexError after the last: the end
            z = np.load(f)
            return {"x": z["x"], "y": z["y"]}

    seen: list[int] = []

    def step(state: monitored.TrainState, x: np.ndarray, y: np.ndarray) -> None:
        assert x.shape == (4, 2)
        seen.append(int(y[0]))
        state.global_step += 1

    pipeline = data.prefetch(load_npz, buffer_size=4, num_workers=4, feed=None, name="train")
    async with monitored.MonitoredSession(hooks=[pipeline]) as sess:
        while not sess.should_stop():
            await sess.run(step)
    assert seen == [0, 1, 2, 3, 4]


async def test_safetensors_shards_through_fsspec_are_read_by_index(tmp_path: Path) -> None:
    write_shards(tmp_path, 3)

    def load_st(i: int) -> dict[str, np.ndarray]:
        with fsspec.open(f"{tmp_path}/{i:05d}.safetensors", "rb") as f:
            return dict(safetensors_numpy.load(f.read()))

    def until_missing(i: int) -> dict[str, np.ndarray]:
        try:
            return load_st(i)
        except FileNotFoundError:
            raise monitored.OutOfRangeError(f"no shard {i}") from None

    pipeline = data.prefetch(until_missing, num_workers=2)
    async with pipeline:
        got = [int(batch["y"][0]) async for batch in pipeline]
    assert got == [0, 1, 2]
