"""TensorFlow's ``checkpoint_management_test.py``, ported to the ``monitored-checkpoint``
plugin (skipped without it).

TF's ``tf.train.Checkpoint`` becomes a :class:`~monitored.TrainState`;
``checkpoint.save(prefix)`` (a save outside any manager, which keeps every
checkpoint and tracks none) becomes ``Saver(max_to_keep=None).save``.
``mock.patch(checkpoint_management.time)`` becomes a fake clock for the
plugin's saver and snapshot. A manager numbers a checkpoint by the state's global
step (TF: by a save counter of the checkpoint's), so each TF ``manager.save()``
here follows one step (``state.global_step += 1``): the numbers are TF's.
"""

from __future__ import annotations

import logging
import os
import pathlib
from pathlib import Path

import numpy as np
import pytest
from _tf1 import FakeClock

from monitored import TrainState

ckpt = pytest.importorskip("monitored_checkpoint")
from monitored_checkpoint import _format, _saver  # noqa: E402

exists = ckpt.checkpoint_exists


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """TF's ``mock.patch.object(checkpoint_management, "time")``."""
    fake = FakeClock(0.0)
    monkeypatch.setattr(_saver, "time", fake)
    monkeypatch.setattr(_format, "time", fake)
    return fake


def saved(state: TrainState, manager: ckpt.CheckpointManager) -> str:
    """One TF ``manager.save()``: a step, then a save numbered by it."""
    state.global_step += 1
    path = manager.save()
    assert path is not None
    return path


# -- LatestCheckpointWithRelativePaths ------------------------------------------------------------
def test_LatestCheckpointWithRelativePaths_testNameCollision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deliberate difference: saves are always ``<prefix>-<step>``, so a basename
    ``checkpoint`` never collides with the state file (TF: ``ValueError`` without a step)."""
    monkeypatch.chdir(tmp_path)
    os.mkdir("train")
    state = TrainState({"a": np.zeros(())})
    saver = ckpt.Saver()
    path = saver.save(state, os.path.join("train", "checkpoint"))
    assert path.endswith("checkpoint-0")
    assert ckpt.latest_checkpoint("train") is not None
    saver.save(state, os.path.join("train", "checkpoint"), global_step=1)
    assert ckpt.latest_checkpoint("train") is not None


def test_LatestCheckpointWithRelativePaths_testRelativePath(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    os.mkdir("train")
    filepath = os.path.join("train", "snapshot")
    state = TrainState({"v0": np.asarray(0.0, np.float32)})
    save = ckpt.Saver()
    save.save(state, filepath, global_step=0)
    state["v0"] += 1.0
    save.save(state, filepath, global_step=1)
    state["v0"] += 1.0
    save.save(state, filepath, global_step=2)

    fresh = TrainState({"v0": np.asarray(-1.0, np.float32)})
    name = ckpt.latest_checkpoint("train")
    assert name is not None
    ckpt.Saver().restore(fresh, name)
    assert fresh["v0"] == 2.0


# -- CheckpointStateTest ----------------------------------------------------------------------------
def test_CheckpointStateTest_testAbsPath(tmp_path: Path) -> None:
    save_dir = str(tmp_path / "abs_paths")
    abs_path = os.path.join(save_dir, "model-0")
    state = ckpt.generate_checkpoint_state_proto(save_dir, abs_path)
    assert state.model_checkpoint_path == abs_path
    assert os.path.isabs(state.model_checkpoint_path)
    assert len(state.all_model_checkpoint_paths) == 1
    assert state.all_model_checkpoint_paths[-1] == abs_path


def test_CheckpointStateTest_testRelPath() -> None:
    train_dir = "train"
    model = os.path.join(train_dir, "model-0")
    state = ckpt.generate_checkpoint_state_proto(train_dir, model)
    assert state.model_checkpoint_path == "model-0"
    assert len(state.all_model_checkpoint_paths) == 1
    assert state.all_model_checkpoint_paths[-1] == "model-0"


def test_CheckpointStateTest_testAllModelCheckpointPaths(tmp_path: Path) -> None:
    save_dir = str(tmp_path / "all_models_test")
    abs_path = os.path.join(save_dir, "model-0")
    for paths in [None, [], [os.path.join(save_dir, "model-2")]]:
        state = ckpt.generate_checkpoint_state_proto(
            save_dir, abs_path, all_model_checkpoint_paths=paths
        )
        assert state.model_checkpoint_path == abs_path
        assert os.path.isabs(state.model_checkpoint_path)
        assert len(state.all_model_checkpoint_paths) == (len(paths) + 1 if paths else 1)
        assert state.all_model_checkpoint_paths[-1] == abs_path


def test_CheckpointStateTest_testUpdateCheckpointState(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TF lists ``save_dir/model-0``, outside ``train``; a deliberate difference refuses
    that (a state file names checkpoints of its own directory only). Within it, TF's
    assertions hold."""
    monkeypatch.chdir(tmp_path)
    os.mkdir("train")
    abs_path = os.path.join(str(tmp_path), "model-0")
    rel_path = os.path.join("train", "model-2")
    with pytest.raises(ValueError, match="not a file of the directory"):
        ckpt.update_checkpoint_state("train", rel_path, all_model_checkpoint_paths=[abs_path])
    abs_path = os.path.join(str(tmp_path), "train", "model-0")
    ckpt.update_checkpoint_state("train", rel_path, all_model_checkpoint_paths=[abs_path, rel_path])
    state = ckpt.get_checkpoint_state("train")
    assert state is not None
    assert state.model_checkpoint_path == rel_path
    assert len(state.all_model_checkpoint_paths) == 2
    assert state.all_model_checkpoint_paths[-1] == rel_path
    assert state.all_model_checkpoint_paths[0] == os.path.join("train", "model-0")


def test_CheckpointStateTest_testFSPath(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    os.mkdir("train")
    rel_path = os.path.join("train", "model-2")
    ckpt.update_checkpoint_state(
        "train", rel_path, all_model_checkpoint_paths=[os.path.join("train", "model-0"), rel_path]
    )
    state = ckpt.get_checkpoint_state(pathlib.Path("train"))
    assert state is not None
    assert state.model_checkpoint_path == rel_path


def test_CheckpointStateTest_testUpdateCheckpointStateSaveRelativePaths(tmp_path: Path) -> None:
    """The file holds names relative to its directory; ``get_checkpoint_state`` gives full paths."""
    save_dir = str(tmp_path)
    abs_path2 = os.path.join(save_dir, "model-2")
    abs_path0 = os.path.join(save_dir, "model-0")
    ckpt.update_checkpoint_state(
        save_dir, abs_path2, all_model_checkpoint_paths=[abs_path0, abs_path2]
    )
    text = (tmp_path / "checkpoint").read_text()
    assert 'model_checkpoint_path: "model-2"' in text
    assert text.count("all_model_checkpoint_paths:") == 2
    assert 'all_model_checkpoint_paths: "model-0"' in text
    state = ckpt.get_checkpoint_state(save_dir)
    assert state is not None
    assert state.model_checkpoint_path == abs_path2
    assert len(state.all_model_checkpoint_paths) == 2
    assert state.all_model_checkpoint_paths[-1] == abs_path2
    assert state.all_model_checkpoint_paths[0] == abs_path0


def test_CheckpointStateTest_testCheckPointStateFailsWhenIncomplete(tmp_path: Path) -> None:
    (tmp_path / "checkpoint").write_text("")
    with pytest.raises(ValueError):
        ckpt.get_checkpoint_state(str(tmp_path))
    with pytest.raises(ckpt.CorruptCheckpointError, match="model_checkpoint_path"):
        ckpt.get_checkpoint_state(str(tmp_path))


def test_CheckpointStateTest_testCheckPointCompletesRelativePaths(tmp_path: Path) -> None:
    """Deliberate difference: ``./model.ckpt-687529`` is refused (not a plain name of the
    directory), where TF joins it to the directory."""
    (tmp_path / "checkpoint").write_text(
        'model_checkpoint_path: "./model.ckpt-687529"\n'
        'all_model_checkpoint_paths: "./model.ckpt-687500"\n'
        'all_model_checkpoint_paths: "./model.ckpt-687529"\n'
    )
    with pytest.raises(ckpt.CheckpointStateError, match="not a plain file name"):
        ckpt.get_checkpoint_state(str(tmp_path))


# -- SaverUtilsTest ---------------------------------------------------------------------------------
def test_SaverUtilsTest_testCheckpointExists(tmp_path: Path) -> None:
    state = TrainState({"v": np.asarray(1.0, np.float32)})
    saver = ckpt.Saver()
    path = str(tmp_path / "model")
    assert not exists(path + "-0")  # not saved yet
    prefix = saver.save(state, path)
    assert exists(prefix)
    latest = ckpt.latest_checkpoint(str(tmp_path))
    assert latest is not None
    assert exists(latest)
    assert not exists(str(tmp_path / "nowhere" / "model-0"))


def test_SaverUtilsTest_testGetCheckpointMtimes(tmp_path: Path) -> None:
    state = TrainState({"v": np.asarray(1.0, np.float32)})
    prefixes = [ckpt.Saver().save(state, str(tmp_path / name)) for name in ("2", "1")]
    mtimes = ckpt.get_checkpoint_mtimes(prefixes)
    assert len(mtimes) == 2
    assert mtimes[1] >= mtimes[0]
    assert ckpt.get_checkpoint_mtimes([str(tmp_path / "absent-0")]) == []


def test_SaverUtilsTest_testRemoveCheckpoint(tmp_path: Path) -> None:
    state = TrainState({"v": np.asarray(1.0, np.float32)})
    prefix = ckpt.Saver().save(state, str(tmp_path / "model"))
    assert exists(prefix)
    ckpt.remove_checkpoint(prefix)
    assert not exists(prefix)
    assert not any(tmp_path.glob("model-0*"))


# -- CheckpointManagerTest --------------------------------------------------------------------------
def test_CheckpointManagerTest_testDeletion(tmp_path: Path) -> None:
    state = TrainState()
    manager = ckpt.CheckpointManager(state, str(tmp_path), max_to_keep=3)
    first_path = saved(state, manager)
    second_path = saved(state, manager)
    third_path = saved(state, manager)
    fourth_path = saved(state, manager)
    assert exists(fourth_path)
    assert exists(third_path)
    assert exists(second_path)
    assert not exists(first_path)


def test_CheckpointManagerTest_testKeepAll(tmp_path: Path) -> None:
    state = TrainState()
    directory = str(tmp_path)
    manager = ckpt.CheckpointManager(state, directory, max_to_keep=None)
    first_path = saved(state, manager)
    second_path = saved(state, manager)
    third_path = saved(state, manager)
    assert exists(third_path)
    assert exists(second_path)
    assert exists(first_path)
    assert third_path == manager.latest_checkpoint
    assert [first_path, second_path, third_path] == manager.checkpoints
    del manager
    manager = ckpt.CheckpointManager(state, directory, max_to_keep=None)
    fourth_path = saved(state, manager)
    assert [first_path, second_path, third_path, fourth_path] == manager.checkpoints
    del manager
    manager = ckpt.CheckpointManager(state, directory, max_to_keep=3)
    assert [first_path, second_path, third_path, fourth_path] == manager.checkpoints
    assert exists(fourth_path)
    assert exists(third_path)
    assert exists(second_path)
    assert exists(first_path)
    fifth_path = saved(state, manager)
    assert [third_path, fourth_path, fifth_path] == manager.checkpoints
    assert exists(fifth_path)
    assert exists(fourth_path)
    assert exists(third_path)
    assert not exists(second_path)
    assert not exists(first_path)


def test_CheckpointManagerTest_testSaveRestoreState(tmp_path: Path, clock: FakeClock) -> None:
    directory = str(tmp_path)
    state = TrainState()
    clock.value = 3.0
    first_manager = ckpt.CheckpointManager(state, directory, max_to_keep=2)
    first_time = 10000.0
    first_name = os.path.join(directory, "ckpt-1")
    clock.value = first_time
    saved(state, first_manager)
    second_time = first_time + 3610.0
    second_name = os.path.join(directory, "ckpt-2")
    clock.value = second_time
    saved(state, first_manager)
    cs = ckpt.get_checkpoint_state(directory)
    assert cs is not None
    assert [first_time, second_time] == list(cs.all_model_checkpoint_timestamps)
    assert [first_name, second_name] == first_manager.checkpoints
    assert second_name == first_manager.latest_checkpoint
    del first_manager

    second_manager = ckpt.CheckpointManager(
        state, directory, max_to_keep=2, keep_checkpoint_every_n_hours=1.5
    )
    assert [first_name, second_name] == second_manager.checkpoints
    assert second_name == second_manager.latest_checkpoint
    third_name = os.path.join(directory, "ckpt-3")
    third_time = second_time + 3600.0 * 0.2
    clock.value = third_time
    saved(state, second_manager)
    assert exists(first_name)
    assert exists(second_name)
    assert [second_name, third_name] == second_manager.checkpoints
    cs = ckpt.get_checkpoint_state(directory)
    assert cs is not None
    assert first_time == cs.last_preserved_timestamp
    fourth_time = third_time + 3600.0 * 0.5
    clock.value = fourth_time
    fourth_name = os.path.join(directory, "ckpt-4")
    saved(state, second_manager)
    assert exists(first_name)
    assert not exists(second_name)
    assert [third_name, fourth_name] == second_manager.checkpoints
    fifth_time = fourth_time + 3600.0 * 0.5
    clock.value = fifth_time
    fifth_name = os.path.join(directory, "ckpt-5")
    saved(state, second_manager)
    assert [fourth_name, fifth_name] == second_manager.checkpoints
    cs = ckpt.get_checkpoint_state(directory)
    assert cs is not None
    assert first_time == cs.last_preserved_timestamp
    del second_manager
    third_manager = ckpt.CheckpointManager(
        state, directory, max_to_keep=2, keep_checkpoint_every_n_hours=1.5
    )
    assert fifth_name == third_manager.latest_checkpoint
    clock.value += 10.0
    saved(state, third_manager)
    sixth_name = os.path.join(directory, "ckpt-6")
    cs = ckpt.get_checkpoint_state(directory)
    assert cs is not None
    assert fourth_time == cs.last_preserved_timestamp
    assert exists(first_name)
    assert exists(fourth_name)
    assert exists(fifth_name)
    assert exists(sixth_name)
    assert not exists(second_name)
    assert not exists(third_name)
    assert [fifth_name, sixth_name] == third_manager.checkpoints


def test_CheckpointManagerTest_testContinueFromUnmanaged(tmp_path: Path) -> None:
    """A user's checkpoints saved beside the manager's are never deleted by it."""
    directory = str(tmp_path)
    prefix = os.path.join(directory, "unusual_prefix")
    state = TrainState()
    unmanaged = ckpt.Saver(max_to_keep=None)  # TF's checkpoint.save(prefix)
    state.global_step = 1
    first_path = unmanaged.save(state, prefix)
    state.global_step = 2
    second_path = unmanaged.save(state, prefix)
    state = TrainState()
    manager = ckpt.CheckpointManager(state, directory, max_to_keep=2)
    assert manager.latest_checkpoint is not None
    ckpt.restore(state, manager.latest_checkpoint)
    assert state.global_step == 2
    third_path = saved(state, manager)
    assert [third_path] == manager.checkpoints
    fourth_path = saved(state, manager)
    assert [third_path, fourth_path] == manager.checkpoints
    fifth_path = saved(state, manager)
    assert [fourth_path, fifth_path] == manager.checkpoints
    assert exists(first_path)
    assert exists(second_path)
    assert not exists(third_path)
    assert exists(fourth_path)
    assert exists(fifth_path)


def test_CheckpointManagerTest_testClockReset(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    directory = str(tmp_path)
    state = TrainState()
    clock.value = 10000.0
    first_manager = ckpt.CheckpointManager(
        state, directory, max_to_keep=1, keep_checkpoint_every_n_hours=1.0
    )
    first_path = saved(state, first_manager)
    clock.value += 3600.0
    second_path = saved(state, first_manager)
    clock.value += 3600.0
    third_path = saved(state, first_manager)
    assert not exists(first_path)
    assert exists(second_path)
    assert exists(third_path)
    assert [third_path] == first_manager.checkpoints
    cs = ckpt.get_checkpoint_state(directory)
    assert cs is not None
    assert cs.last_preserved_timestamp == 13600.0
    # Set the clock back in time.
    clock.value = 5000.0
    del first_manager
    with caplog.at_level(logging.WARNING, logger="monitored.checkpoint"):
        second_manager = ckpt.CheckpointManager(state, directory, max_to_keep=1)
    assert "behind the last preserved checkpoint timestamp" in caplog.text
    # Kept rather than guessed about: known, never deleted, not tracked.
    assert exists(second_path)
    assert third_path == second_manager.latest_checkpoint
    assert second_manager.checkpoints == []
    clock.value += 10.0
    fourth_path = saved(state, second_manager)
    assert exists(second_path)
    assert exists(third_path)
    assert fourth_path == second_manager.latest_checkpoint
    assert [fourth_path] == second_manager.checkpoints
    clock.value += 10.0
    fifth_path = saved(state, second_manager)
    assert exists(second_path)
    assert exists(third_path)
    assert [fifth_path] == second_manager.checkpoints
    cs = ckpt.get_checkpoint_state(directory)
    assert cs is not None
    assert cs.last_preserved_timestamp == 5000.0
    assert list(cs.all_model_checkpoint_timestamps) == [5020.0]


def test_CheckpointManagerTest_testCustomNumbering(tmp_path: Path) -> None:
    directory = str(tmp_path)
    state = TrainState({"step": np.zeros((), np.int64)})
    manager = ckpt.CheckpointManager(state, directory, max_to_keep=2)
    path = ""
    for i in range(5):
        path = manager.save(checkpoint_number=state["step"]) or ""
        assert path.endswith(f"-{2 * i}")
        state["step"] += 2
    last_path = manager.save(checkpoint_number=32)
    assert last_path is not None
    assert "-32" in last_path
    assert last_path == manager.latest_checkpoint
    assert last_path == ckpt.latest_checkpoint(directory)
    cs = ckpt.get_checkpoint_state(directory)
    assert cs is not None
    # Only the most recent two checkpoints are kept.
    assert [path, last_path] == list(cs.all_model_checkpoint_paths)


def test_CheckpointManagerTest_testCustomCheckpointPrefix(tmp_path: Path) -> None:
    state = TrainState()
    manager = ckpt.CheckpointManager(
        state, str(tmp_path), max_to_keep=2, checkpoint_name="ckpt_name"
    )
    path = manager.save(checkpoint_number=5)
    assert path is not None
    assert os.path.basename(path) == "ckpt_name-5"
    manager = ckpt.CheckpointManager(state, str(tmp_path), max_to_keep=2)
    path = manager.save(checkpoint_number=5)
    assert path is not None
    assert os.path.basename(path) == "ckpt-5"


def test_CheckpointManagerTest_testRestoreOrInitialize(tmp_path: Path) -> None:
    directory = str(tmp_path)
    init_prefix = os.path.join(directory, "init")
    init_path = ckpt.Saver().save(TrainState({"v": np.asarray(2.0, np.float32)}), init_prefix)

    state = TrainState({"v": np.asarray(1.0, np.float32)})
    manager = ckpt.CheckpointManager(
        state,
        os.path.join(directory, "ckpt"),
        max_to_keep=None,
        init_fn=lambda: ckpt.restore(state, init_path),
    )
    # The first call calls init_fn.
    assert manager.restore_or_initialize() is None
    assert state["v"] == 2.0
    # Save a checkpoint: the second call restores it.
    manager.save()
    assert manager.restore_or_initialize() is not None


def test_CheckpointManagerTest_testCheckpointManagerFSpathDirectory(tmp_path: Path) -> None:
    directory = pathlib.Path(tmp_path)
    state = TrainState({"v": np.asarray(0.0, np.float32)})
    manager = ckpt.CheckpointManager(state, directory, max_to_keep=2, checkpoint_name="ckpt_name")
    save_path = saved(state, manager)
    assert str(directory / "ckpt_name-1") == save_path
    assert manager.restore_or_initialize() == str(directory / "ckpt_name-1")


def test_CheckpointManagerTest_testLatestCheckpointFSpathDirectory(tmp_path: Path) -> None:
    directory = pathlib.Path(tmp_path)
    state = TrainState()
    manager = ckpt.CheckpointManager(state, directory, max_to_keep=2, checkpoint_name="ckpt_name")
    saved(state, manager)
    assert ckpt.latest_checkpoint(directory) == str(directory / "ckpt_name-1")


def test_CheckpointManagerTest_testCheckpointInterval(tmp_path: Path) -> None:
    state = TrainState({"v": np.asarray(1.0, np.float32), "step_counter": np.zeros((), np.int64)})
    manager = ckpt.CheckpointManager(
        state,
        str(tmp_path),
        max_to_keep=None,
        step_counter=state["step_counter"],
        checkpoint_interval=2,
    )
    assert manager.checkpoint_interval == 2
    # step_counter 0: an initial checkpoint.
    path = manager.save(check_interval=True)
    assert path is not None
    assert exists(path)
    # step_counter 1: none.
    state["step_counter"] += 1
    assert manager.save(check_interval=True) is None
    # step_counter 2: saved.
    state["step_counter"] += 1
    path = manager.save(check_interval=True)
    assert path is not None
    assert exists(path)
    # None when saving again at the same step counter.
    assert manager.save(check_interval=True) is None
    # step_counter 3: none.
    state["step_counter"] += 1
    assert manager.save(check_interval=True) is None
    # Always saved without the check.
    path = manager.save(check_interval=False)
    assert path is not None
    assert exists(path)


def test_CheckpointManagerTest_testCheckpointIntervalWithLastCheckpointStep(tmp_path: Path) -> None:
    state = TrainState({"v": np.asarray(1.0, np.float32), "step_counter": np.ones((), np.int64)})
    manager = ckpt.CheckpointManager(
        state,
        str(tmp_path),
        max_to_keep=None,
        step_counter=state["step_counter"],
        checkpoint_interval=2,
        last_checkpoint_step=1,
    )
    # step_counter 1: none.
    assert manager.save(check_interval=True) is None
    # step_counter 2: none, the interval starts at 1.
    state["step_counter"] += 1
    assert manager.save(check_interval=True) is None
    # step_counter 3: saved.
    state["step_counter"] += 1
    path = manager.save(check_interval=True)
    assert path is not None
    assert exists(path)


def test_CheckpointManagerTest_testCheckpointIntervalWithRestore(tmp_path: Path) -> None:
    directory = str(tmp_path)
    state = TrainState({"v": np.asarray(1.0, np.float32)})
    ckpt.Saver().save(state, os.path.join(directory, "ckpt"))
    manager = ckpt.CheckpointManager(
        state, directory, max_to_keep=None, step_counter=None, checkpoint_interval=2
    )
    assert manager.restore_or_initialize() is not None
    # Step 0 as restored: no save.
    assert manager.save() is None
