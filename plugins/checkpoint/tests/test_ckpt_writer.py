"""The background writer, the stores, and the less travelled restore paths."""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import threading
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
from _standin_device import StandinCupy, standin_cupy

from monitored import Coordinator, TrainState
from monitored_checkpoint import (
    CheckpointDirectoryError,
    CheckpointError,
    CheckpointWriteError,
    Saver,
    restore,
)
from monitored_checkpoint._format import (
    DIGEST_FIELD,
    manifest_digest,
    read_arrays,
    read_manifest,
    take_snapshot,
    write_checkpoint,
)
from monitored_checkpoint._store import open_store
from monitored_checkpoint._writer import BackgroundWriter

__all__ = ["standin_cupy"]  # the stand-in CuPy fixture


# -- the writer ----------------------------------------------------------------------------------
def test_writer_runs_one_write_at_a_time_and_reports_the_path() -> None:
    writer = BackgroundWriter()
    gate = threading.Event()
    job = writer.submit(1, "dir/model.ckpt-1", lambda: gate.wait(10) and "dir/model.ckpt-1")
    assert writer.busy
    with pytest.raises(RuntimeError, match="still in flight"):
        writer.submit(2, "dir/model.ckpt-2", lambda: "x")
    gate.set()
    assert writer.wait_blocking(10)
    assert job.path == "dir/model.ckpt-1"
    assert job.error is None
    assert job.seconds is not None
    assert job.seconds >= 0
    second = writer.submit(2, "dir/model.ckpt-2", lambda: "dir/model.ckpt-2")
    assert writer.wait_blocking(10)
    assert second.path == "dir/model.ckpt-2"
    writer.close()


def test_writer_failure_goes_to_the_coordinator_with_path_step_and_cause() -> None:
    coord = Coordinator()
    writer = BackgroundWriter(coord)

    def fail() -> str:
        raise PermissionError(13, "Permission denied", "/ro/model.ckpt-7.json")

    job = writer.submit(7, "/ro/model.ckpt-7", fail)
    assert writer.wait_blocking(10)
    assert isinstance(job.error, CheckpointWriteError)
    assert coord.should_stop()
    assert coord.exception is job.error
    assert "writing checkpoint /ro/model.ckpt-7 (step 7) failed: PermissionError" in str(job.error)
    assert isinstance(job.error.__cause__, PermissionError)
    writer.close()


def test_writer_without_coordinator_logs_the_failure(caplog: pytest.LogCaptureFixture) -> None:
    writer = BackgroundWriter()

    def fail() -> str:
        raise OSError(28, "No space left on device")

    job = writer.submit(3, "d/model.ckpt-3", fail)
    assert writer.wait_blocking(10)
    assert job.error is not None
    assert "No space left on device" in caplog.text
    writer.close()


def test_writer_thread_ends_when_closed_and_restarts_on_demand() -> None:
    coord = Coordinator()
    writer = BackgroundWriter(coord, name="test-writer")
    writer.submit(1, "a", lambda: "a")
    writer.wait_blocking(10)
    [thread] = [t for t in threading.enumerate() if t.name == "test-writer"]
    assert not thread.daemon, "an exiting interpreter waits for a write in flight"
    writer.close()
    thread.join(5)
    assert not thread.is_alive()
    writer.submit(2, "b", lambda: "b")
    assert writer.wait_blocking(10)
    assert writer.pending is not None
    assert writer.pending.path == "b"
    coord.request_stop()  # a stop request ends it too
    for t in threading.enumerate():
        if t.name == "test-writer":
            t.join(5)
            assert not t.is_alive()


@pytest.mark.anyio
async def test_writer_wait_does_not_block_the_event_loop() -> None:
    import anyio

    writer = BackgroundWriter()
    gate = threading.Event()
    writer.submit(1, "a", lambda: gate.wait(10) and "a")
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while not gate.is_set():
            ticks += 1
            await anyio.sleep(0.01)

    async with anyio.create_task_group() as tg:
        tg.start_soon(tick)
        await anyio.sleep(0.05)
        gate.set()
        job = await writer.wait()
    assert job is not None
    assert job.path == "a"
    assert ticks >= 2
    writer.close()


# -- stores ---------------------------------------------------------------------------------------
def test_empty_directory_name_is_refused() -> None:
    with pytest.raises(CheckpointDirectoryError, match="empty"):
        open_store("")


def test_file_url_is_a_local_store(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/ckpt")
    assert store.atomic
    store.ensure_directory()
    assert (tmp_path / "ckpt").is_dir()


def test_fsspec_directory_blocked_by_a_file(mem_dir: str) -> None:
    fs = fsspec.filesystem("memory")
    root = mem_dir[len("memory://") :]
    fs.pipe(f"{root}/blocker", b"x")
    with pytest.raises(CheckpointDirectoryError, match="blocker"):
        Saver().prepare(f"{mem_dir}/blocker/ckpt/model.ckpt")


def test_fsspec_store_removes_a_torn_file_after_a_failed_write(mem_dir: str) -> None:
    store = open_store(mem_dir)
    store.ensure_directory()

    def half(file: Any) -> None:
        file.write(b"half")
        raise OSError(5, "Input/output error")

    with pytest.raises(OSError, match="Input/output"):
        store.write("x.bin", half)
    assert store.list() == []


def test_local_store_lists_a_file_path_as_an_error(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(CheckpointDirectoryError, match="not a directory"):
        open_store(str(tmp_path / "f")).list()


# -- restore paths --------------------------------------------------------------------------------
def test_cupy_arrays_restore_as_numpy_without_cupy(
    ckpt_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed: the fallback is not taken")
    state = TrainState({"w": np.arange(3.0)})
    Saver().save(state, f"{ckpt_dir}/model.ckpt")
    manifest = Path(ckpt_dir, "model.ckpt-0.json")
    doc = json.loads(manifest.read_text())
    doc["arrays"]["w"]["module"] = "cupy"
    doc[DIGEST_FIELD] = manifest_digest(doc)  # an edit the manifest's checksum would refuse
    manifest.write_text(json.dumps(doc))
    restored = TrainState()
    with caplog.at_level(logging.INFO, logger="monitored.checkpoint"):
        restore(restored, f"{ckpt_dir}/model.ckpt-0")
    assert isinstance(restored["w"], np.ndarray)
    assert "saved from CuPy, which is not installed; restored as NumPy" in caplog.text


def test_bfloat16_needs_ml_dtypes_to_read(ckpt_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import ml_dtypes

    state = TrainState({"w": np.ones(3, dtype=ml_dtypes.bfloat16)})
    store = open_store(ckpt_dir)
    store.ensure_directory()
    write_checkpoint(store, "model.ckpt-0", take_snapshot(state))
    real = importlib.import_module

    def no_ml_dtypes(name: str, *args: Any) -> Any:
        if name == "ml_dtypes":
            raise ImportError("No module named 'ml_dtypes'")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", no_ml_dtypes)
    with pytest.raises(CheckpointError, match="bfloat16 arrays.*pip install ml-dtypes"):
        read_arrays(store, read_manifest(store, "model.ckpt-0"))


def test_unknown_dtype_in_a_manifest_is_damage(ckpt_dir: str) -> None:
    state = TrainState({"w": np.ones(3)})
    Saver().save(state, f"{ckpt_dir}/model.ckpt")
    manifest = Path(ckpt_dir, "model.ckpt-0.json")
    doc = json.loads(manifest.read_text())
    doc["arrays"]["w"]["dtype"] = "float128"
    manifest.write_text(json.dumps(doc))
    store = open_store(ckpt_dir)
    with pytest.raises(CheckpointError, match="unknown dtype 'float128'"):
        read_arrays(store, read_manifest(store, "model.ckpt-0"))


@pytest.mark.gpu
def test_cupy_state_round_trips_through_host_memory(ckpt_dir: str) -> None:
    cupy = pytest.importorskip("cupy")
    try:
        cupy.cuda.runtime.getDeviceCount()
    except Exception:
        pytest.skip("no CUDA device")
    state = TrainState(
        {
            "w": cupy.arange(12, dtype=cupy.float32).reshape(3, 4),
            "h": cupy.arange(5, dtype=cupy.float16),
            "t": cupy.arange(6.0).reshape(2, 3).T,  # not contiguous
            "count": cupy.asarray(7, dtype=cupy.int64),  # 0-d
        }
    )
    Saver().save(state, f"{ckpt_dir}/model.ckpt")
    doc = json.loads(Path(ckpt_dir, "model.ckpt-0.json").read_text())
    assert {a["module"] for a in doc["arrays"].values()} == {"cupy"}
    target = TrainState({n: cupy.zeros_like(a) for n, a in state.items()})
    held = target["w"]
    restore(target, f"{ckpt_dir}/model.ckpt-0")
    assert target["w"] is held, "restored into the existing device array"
    fresh = TrainState()
    restore(fresh, f"{ckpt_dir}/model.ckpt-0")
    for name, array in state.items():
        assert isinstance(fresh[name], cupy.ndarray)
        assert cupy.asnumpy(fresh[name]).tobytes() == cupy.asnumpy(array).tobytes()
        assert cupy.asnumpy(target[name]).tobytes() == cupy.asnumpy(array).tobytes()
        assert fresh[name].shape == array.shape
    assert int(fresh["count"]) == 7


def test_cupy_entries_0d_and_strided_round_trip_on_the_standin(
    ckpt_dir: str, standin_cupy: StandinCupy
) -> None:
    """The CuPy paths of save and restore, on the stand-in CuPy (CI has no GPU)."""
    cupy = standin_cupy.module
    state = TrainState(
        {
            "w": cupy.arange(12, dtype=cupy.float32).reshape(3, 4),
            "t": cupy.arange(6.0).reshape(2, 3).T,  # not contiguous
            "count": cupy.asarray(7, dtype=cupy.int64),  # 0-d
            "scale": cupy.asarray(np.float32(0.5)),  # 0-d
        }
    )
    Saver().save(state, f"{ckpt_dir}/model.ckpt")
    doc = json.loads(Path(ckpt_dir, "model.ckpt-0.json").read_text())
    assert {a["module"] for a in doc["arrays"].values()} == {"cupy"}
    assert doc["arrays"]["count"]["shape"] == []
    target = TrainState({n: cupy.zeros_like(a) for n, a in state.items()})
    target["t"] = cupy.zeros((2, 3)).T  # a strided target: ``set`` refuses it
    held = target["t"]
    restore(target, f"{ckpt_dir}/model.ckpt-0")
    assert target["t"] is held, "restored into the existing device array"
    fresh = TrainState()
    restore(fresh, f"{ckpt_dir}/model.ckpt-0")
    for name, array in state.items():
        for restored in (fresh[name], target[name]):
            assert isinstance(restored, cupy.ndarray)
            assert restored.shape == array.shape
            assert restored.get().tobytes() == array.get().tobytes()
