"""The background writer, the stores, and the less travelled restore paths."""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
import warnings
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
    latest_checkpoint,
    restore,
    restore_latest,
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
    # A daemon: an exit waits for a write in flight through a bounded exit
    # handler instead (tested with real processes below).
    assert thread.daemon
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


def test_a_started_writer_waits_idle_for_its_first_write_and_ends_when_closed() -> None:
    coord = Coordinator()
    writer = BackgroundWriter(coord, name="test-started-writer")
    writer.start()  # the saver hook's begin: the first save's step does not start it
    [thread] = [t for t in threading.enumerate() if t.name == "test-started-writer"]
    assert thread.is_alive()
    assert not writer.busy
    first = writer.submit(1, "a", lambda: "a")
    assert writer.wait_blocking(10)
    second = writer.submit(2, "b", lambda: "b")
    assert writer.wait_blocking(10)
    assert [first.path, second.path] == ["a", "b"]
    # Each write has its own `done` (the next one's is made ahead by the thread).
    assert first.done is not second.done
    assert first.done.is_set()
    assert second.done.is_set()
    assert [t for t in threading.enumerate() if t.name == "test-started-writer"] == [thread]
    writer.close()
    thread.join(5)
    assert not thread.is_alive()


def test_a_write_submitted_as_the_idle_thread_ends_is_not_lost() -> None:
    """The thread ends only with nothing queued: a write handed over while it
    decides to end runs, in it or in a new thread (many trials)."""
    writer = BackgroundWriter(name="test-racing-writer")
    for step in range(200):
        writer.start()
        writer.close()  # the thread may be ending now
        job = writer.submit(step, f"s{step}", lambda step=step: f"s{step}")
        assert writer.wait_blocking(10), f"write {step} was lost"
        assert job.path == f"s{step}"
    writer.close()


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
def test_a_local_write_of_many_buffers_survives_short_writevs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``writev`` may write less than asked: every byte still lands, in order."""
    from monitored_checkpoint import _store

    real = os.writev
    calls: list[int] = []

    def short(fd: int, buffers: list[Any]) -> int:
        calls.append(len(buffers))
        first = memoryview(buffers[0]).cast("B")
        return real(fd, [first[: max(1, first.nbytes // 3)]])  # a third of the first, at most

    monkeypatch.setattr(_store.os, "writev", short)
    parts = [bytes([i]) * (7 + 5 * i) for i in range(40)]  # more than one writev takes
    store = open_store(str(tmp_path))
    store.write("f.bin", lambda f: f.write_views([memoryview(p) for p in parts]))  # type: ignore[attr-defined]
    assert (tmp_path / "f.bin").read_bytes() == b"".join(parts)
    assert max(calls) <= 16
    assert len(calls) > len(parts)


def test_temporary_names_are_unique_and_name_their_process_also_in_a_fork() -> None:
    from monitored_checkpoint import _store
    from monitored_checkpoint._saver import _writer_alive

    names = {_store._temp_names.next() for _ in range(1000)}
    assert len(names) == 1000
    assert all(n.startswith(f"{os.getpid()}-") for n in names)
    assert _writer_alive(f".model.ckpt-1.json.tmp-{next(iter(names))}")
    # A fork, in a fresh single-threaded interpreter: the child's names carry its pid.
    script = textwrap.dedent(
        """
        import os
        from monitored_checkpoint import _store

        parent = _store._temp_names.next()
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(write, _store._temp_names.next().encode())
            os._exit(0)
        os.close(write)
        child = os.read(read, 100).decode()
        os.waitpid(pid, 0)
        print(os.getpid(), pid, parent, child)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    ).stdout.split()
    parent_pid, child_pid, parent_name, child_name = out
    assert parent_name.startswith(f"{parent_pid}-")
    assert child_name.startswith(f"{child_pid}-"), "a forked child names its files with its pid"


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


# -- a write that never ends (a filesystem that stopped answering) --------------------------------
HUNG_CHILD = textwrap.dedent(
    """
    import sys

    import anyio
    import numpy as np

    from monitored import MonitoredSession, TrainState
    from monitored_checkpoint import CheckpointSaverHook
    from monitored_checkpoint import _store

    DIRECTORY, FIFO = sys.argv[1], sys.argv[2]
    real_write = _store.LocalStore.write


    def hung_write(self, name, writer, **kwargs):
        if not name.startswith("model.ckpt-2."):
            return real_write(self, name, writer, **kwargs)

        def half(file):
            file.write(b"half of a checkpoint")
            print("hung", flush=True)
            with open(FIFO, "wb"):  # no reader: blocks, as a write to a dead NFS server
                pass

        return real_write(self, name, half, **kwargs)


    _store.LocalStore.write = hung_write


    def step(state):
        state["w"] += 1
        state.global_step += 1
        if state.global_step == 4:
            raise RuntimeError("the step fails while checkpoint 2 is being written")


    async def main():
        state = TrainState({"w": np.zeros(4)})
        hook = CheckpointSaverHook(DIRECTORY, save_steps=2, handle_signals=False)
        async with MonitoredSession(state, hooks=[hook], stop_grace_period_secs=0.5) as s:
            while True:
                await s.run(step)


    anyio.run(main)
    """
)


SLOW_CHILD = textwrap.dedent(
    """
    import sys
    import time

    import numpy as np

    from monitored import TrainState
    from monitored_checkpoint import Saver
    from monitored_checkpoint._format import take_snapshot
    from monitored_checkpoint._writer import BackgroundWriter

    snapshot = take_snapshot(TrainState({"w": np.arange(4.0)}, global_step=7))
    saver = Saver()


    def slow():
        time.sleep(1.5)  # a slow store: the program ends while this write runs
        return saver.write(snapshot, sys.argv[1] + "/model.ckpt")


    BackgroundWriter().submit(7, sys.argv[1] + "/model.ckpt-7", slow)
    print("exiting", flush=True)
    """
)


def test_an_exit_waits_for_a_write_in_flight_that_finishes(tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    script = tmp_path / "child.py"
    script.write_text(SLOW_CHILD)
    child = subprocess.run(
        [sys.executable, str(script), str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout == "exiting\n"
    assert "still being written" not in child.stderr
    state = TrainState({"w": np.zeros(4)})
    manifest = restore_latest(state, str(directory))
    assert manifest is not None
    assert manifest.step == 7
    assert state["w"].tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX FIFOs")
@pytest.mark.parametrize("trial", range(3))
def test_a_write_hung_at_exit_is_waited_for_then_named_and_never_taken(
    tmp_path: Path, trial: int
) -> None:
    # The training fails while checkpoint 2 hangs half written: the process
    # exits after the bounded wait, naming the checkpoint, instead of hanging
    # in the interpreter's exit; the directory's newest checkpoint is still 0.
    directory, fifo = tmp_path / "ckpt", tmp_path / "dead-nfs"
    os.mkfifo(fifo)
    script = tmp_path / "child.py"
    script.write_text(HUNG_CHILD)
    env = {**os.environ, "MONITORED_CHECKPOINT_EXIT_WAIT_SECS": "1"}
    started = time.monotonic()
    try:
        child = subprocess.run(
            [sys.executable, str(script), str(directory), str(fifo)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the process never exited: {exc.stdout!r} {exc.stderr!r}")
    took = time.monotonic() - started
    assert child.returncode == 1, child.stderr
    assert "hung" in child.stdout
    assert "the step fails while checkpoint 2 is being written" in child.stderr
    assert (
        f"checkpoint {directory}/model.ckpt-2 (step 2) was still being written when the "
        "interpreter exited, after waiting 1." in child.stderr
    ), child.stderr
    assert "MONITORED_CHECKPOINT_EXIT_WAIT_SECS=1;" in child.stderr
    assert "may be incomplete; it is not taken as a checkpoint" in child.stderr
    assert took < 50
    assert latest_checkpoint(str(directory)) == str(directory / "model.ckpt-0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no damaged checkpoint to skip: none is taken
        manifest = restore_latest(TrainState({"w": np.zeros(4)}), str(directory))
    assert manifest is not None
    assert manifest.step == 0


def test_a_bad_exit_wait_is_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    for bad in ("soon", "-1", "nan"):
        monkeypatch.setenv("MONITORED_CHECKPOINT_EXIT_WAIT_SECS", bad)
        with pytest.raises(ValueError, match=f"MONITORED_CHECKPOINT_EXIT_WAIT_SECS={bad!r}"):
            BackgroundWriter()
