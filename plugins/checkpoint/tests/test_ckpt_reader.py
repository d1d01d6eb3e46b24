"""read_checkpoint, list_variables and resolve_checkpoint: reading arrays without a state."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from monitored import TrainState
from monitored_checkpoint import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    Saver,
    UnsafeCheckpointError,
    list_variables,
    read_checkpoint,
    resolve_checkpoint,
)


@pytest.fixture
def run(tmp_path: Path) -> Path:
    state = TrainState({"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(2)})
    saver = Saver()
    for step in (1, 2):
        state["b"] += 1
        saver.save(state, tmp_path / "run" / "model.ckpt", global_step=step)
    return tmp_path / "run"


def test_a_directory_names_its_newest_checkpoint_and_a_path_itself(run: Path) -> None:
    assert resolve_checkpoint(run) == str(run / "model.ckpt-2")
    assert resolve_checkpoint(f"{run}/") == str(run / "model.ckpt-2")
    assert resolve_checkpoint(run / "model.ckpt-1") == str(run / "model.ckpt-1")


def test_read_checkpoint_gives_the_manifest_and_every_array(run: Path) -> None:
    manifest, arrays = read_checkpoint(run / "model.ckpt-1")
    assert manifest.step == 1
    assert sorted(arrays) == ["a", "b"]
    np.testing.assert_array_equal(arrays["a"], np.arange(6).reshape(2, 3))
    np.testing.assert_array_equal(arrays["b"], np.full(2, 2.0))


def test_list_variables_reads_names_and_shapes(run: Path) -> None:
    assert list_variables(run) == [("a", (2, 3)), ("b", (2,))]


def test_nothing_there_is_named(tmp_path: Path) -> None:
    with pytest.raises(CheckpointNotFoundError, match="nowhere"):
        resolve_checkpoint(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointNotFoundError, match="empty is a directory without a checkpoint"):
        read_checkpoint(tmp_path / "empty")


def test_a_directory_is_a_directory_even_beside_a_same_named_json_file(
    run: Path, tmp_path: Path
) -> None:
    """``runs/pretrained/`` with a config ``runs/pretrained.json`` beside it."""
    (tmp_path / "run.json").write_text('{"learning_rate": 0.1}')
    assert resolve_checkpoint(run) == str(run / "model.ckpt-2")
    assert resolve_checkpoint(f"{run}/") == str(run / "model.ckpt-2")
    manifest, _ = read_checkpoint(run)
    assert manifest.step == 2
    assert list_variables(run) == [("a", (2, 3)), ("b", (2,))]
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty.json").write_text("{}")
    with pytest.raises(CheckpointNotFoundError, match="empty is a directory without a checkpoint"):
        read_checkpoint(tmp_path / "empty")


def test_a_directory_on_an_fsspec_filesystem_is_resolved_as_one() -> None:
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    state = TrainState({"a": np.zeros(2, np.float32)})
    Saver().save(state, "memory://resolve/run/model.ckpt", global_step=3)
    fs.pipe("/resolve/run.json", b"{}")
    try:
        assert resolve_checkpoint("memory://resolve/run") == "memory://resolve/run/model.ckpt-3"
        assert resolve_checkpoint("memory://resolve/run/model.ckpt-3").endswith("model.ckpt-3")
    finally:
        fs.rm("/resolve", recursive=True)


def test_damage_and_hostile_files_are_refused(run: Path, tmp_path: Path) -> None:
    data = run / "model.ckpt-2.safetensors"
    data.write_bytes(data.read_bytes()[:-4])
    with pytest.raises(CorruptCheckpointError, match="model.ckpt-2.safetensors"):
        read_checkpoint(run)
    manifest = run / "model.ckpt-1.json"
    manifest.unlink()
    os.mkfifo(manifest)
    # A FIFO is not a manifest: named for what it is, never opened.
    with pytest.raises(
        UnsafeCheckpointError, match=r"model\.ckpt-1\.json is a FIFO, not a manifest"
    ):
        list_variables(run / "model.ckpt-1")
    assert list_variables(run) == [("a", (2, 3)), ("b", (2,))]  # model.ckpt-2's manifest
