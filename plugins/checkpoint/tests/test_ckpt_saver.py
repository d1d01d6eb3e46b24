"""Saver: naming, the state file, rotation, restore with fallback, following a job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import anyio
import fsspec
import numpy as np
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from monitored import TrainState
from monitored_checkpoint import (
    CheckpointDirectoryError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    CheckpointVersionError,
    CorruptCheckpointError,
    CorruptCheckpointWarning,
    ForeignCheckpointError,
    NoValidCheckpointError,
    Saver,
    checkpoint_state,
    checkpoints_iterator,
    latest_checkpoint,
    restore,
    restore_latest,
    wait_for_new_checkpoint,
)
from monitored_checkpoint import _saver as saver_module
from monitored_checkpoint._store import LocalStore, open_store


def _save_steps(directory: str, state: TrainState, steps: Any, saver: Saver | None = None) -> Saver:
    saver = saver or Saver()
    for step in steps:
        state.global_step = step
        state["w"][0, 0] = step
        saver.save(state, f"{directory}/model.ckpt")
    return saver


def _listing(directory: str) -> list[str]:
    return sorted(os.listdir(directory))


def _corrupt(path: str) -> None:
    with open(path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 0xFF]))


# -- saving and rotation ------------------------------------------------------------------------
def test_save_returns_the_tf1_path_and_writes_two_files(ckpt_dir: str, state: TrainState) -> None:
    state.global_step = 4
    path = Saver().save(state, os.path.join(ckpt_dir, "model.ckpt"))
    assert path == os.path.join(ckpt_dir, "model.ckpt-4")
    assert _listing(ckpt_dir) == ["checkpoint", "model.ckpt-4.json", "model.ckpt-4.safetensors"]
    assert latest_checkpoint(ckpt_dir) == path


def test_global_step_argument_names_the_checkpoint(ckpt_dir: str, state: TrainState) -> None:
    path = Saver().save(state, os.path.join(ckpt_dir, "model.ckpt"), global_step=42)
    assert path.endswith("model.ckpt-42")
    other = make_fresh(state)
    assert restore(other, path).step == 42
    assert other.global_step == 42


def make_fresh(state: TrainState) -> TrainState:
    return TrainState({n: np.zeros_like(a) for n, a in state.items()}, seed=123)


def test_keeps_the_five_newest_like_tf1(ckpt_dir: str, state: TrainState) -> None:
    saver = _save_steps(ckpt_dir, state, range(11))
    steps = sorted(int(n.split("-")[1].split(".")[0]) for n in os.listdir(ckpt_dir) if "ckpt" in n)
    assert sorted(set(steps)) == [6, 7, 8, 9, 10]
    assert saver.last_checkpoints == [
        os.path.join(ckpt_dir, f"model.ckpt-{s}") for s in range(6, 11)
    ]
    saved = checkpoint_state(ckpt_dir)
    assert saved is not None
    assert saved.model_checkpoint_path == os.path.join(ckpt_dir, "model.ckpt-10")
    assert [Path(p).name for p in saved.all_model_checkpoint_paths] == [
        f"model.ckpt-{s}" for s in range(6, 11)
    ]
    assert len(saved.all_model_checkpoint_timestamps) == 5
    assert saved.ours


def test_state_file_is_tf1_text_format_with_a_marker(ckpt_dir: str, state: TrainState) -> None:
    _save_steps(ckpt_dir, state, [1, 2])
    lines = Path(ckpt_dir, "checkpoint").read_text().splitlines()
    assert lines[0].startswith("# monitored-checkpoint state file")
    assert lines[1] == 'model_checkpoint_path: "model.ckpt-2"'
    assert lines[2:4] == [
        'all_model_checkpoint_paths: "model.ckpt-1"',
        'all_model_checkpoint_paths: "model.ckpt-2"',
    ]
    assert lines[-1].startswith("last_preserved_timestamp: ")


def test_max_to_keep_none_keeps_every_file(ckpt_dir: str, state: TrainState) -> None:
    _save_steps(ckpt_dir, state, range(8), Saver(max_to_keep=None))
    assert len([n for n in os.listdir(ckpt_dir) if n.endswith(".json")]) == 8
    saved = checkpoint_state(ckpt_dir)
    assert saved is not None
    assert [Path(p).name for p in saved.all_model_checkpoint_paths] == ["model.ckpt-7"]


def test_keep_checkpoint_every_n_hours_preserves_old_ones(
    ckpt_dir: str, state: TrainState, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1_000_000.0]
    monkeypatch.setattr(saver_module.time, "time", lambda: clock[0])
    monkeypatch.setattr("monitored_checkpoint._format.time.time", lambda: clock[0])
    saver = Saver(max_to_keep=2, keep_checkpoint_every_n_hours=1)
    for step in range(12):
        clock[0] += 1200  # 20 minutes per checkpoint
        _save_steps(ckpt_dir, state, [step], saver)
    kept = sorted(int(n.split("-")[1][:-5]) for n in os.listdir(ckpt_dir) if n.endswith(".json"))
    # Listed: the 2 newest; preserved: of the older ones, one per hour counted
    # from the saver's creation (as TF1's), 20 minutes before step 0: steps 2, 5 and 8.
    assert kept == [2, 5, 8, 10, 11]
    saved = checkpoint_state(ckpt_dir)
    assert saved is not None
    assert [Path(p).name for p in saved.all_model_checkpoint_paths] == [
        "model.ckpt-10",
        "model.ckpt-11",
    ]


def test_a_new_saver_adopts_the_kept_list(ckpt_dir: str, state: TrainState) -> None:
    _save_steps(ckpt_dir, state, range(4), Saver(max_to_keep=3))
    saver = _save_steps(ckpt_dir, state, [4], Saver(max_to_keep=3))
    assert [Path(p).name for p in saver.last_checkpoints] == [
        "model.ckpt-2",
        "model.ckpt-3",
        "model.ckpt-4",
    ]
    assert not Path(ckpt_dir, "model.ckpt-1.json").exists()


def test_recover_last_checkpoints_rotates_adopted_ones(ckpt_dir: str, state: TrainState) -> None:
    _save_steps(ckpt_dir, state, [1], Saver())
    Path(ckpt_dir, "checkpoint").unlink()
    saver = Saver(max_to_keep=1)
    saver.recover_last_checkpoints([os.path.join(ckpt_dir, "model.ckpt-1")])
    _save_steps(ckpt_dir, state, [2], saver)
    assert not Path(ckpt_dir, "model.ckpt-1.json").exists()


def test_resaving_a_step_replaces_it(ckpt_dir: str, state: TrainState) -> None:
    saver = _save_steps(ckpt_dir, state, [3, 3])
    assert [Path(p).name for p in saver.last_checkpoints] == ["model.ckpt-3"]


def test_saver_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="max_to_keep"):
        Saver(max_to_keep=-1)
    with pytest.raises(ValueError, match="keep_checkpoint_every_n_hours"):
        Saver(keep_checkpoint_every_n_hours=0)
    with pytest.raises(ValueError, match="basename"):
        Saver().save(TrainState(), "dir/")


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_prepare_removes_leftovers_of_interrupted_saves(ckpt_dir: str, state: TrainState) -> None:
    os.makedirs(ckpt_dir)
    leftover = Path(ckpt_dir, f".model.ckpt-3.safetensors.tmp-{_dead_pid()}-abcd")
    leftover.write_bytes(b"half")
    Saver().prepare(os.path.join(ckpt_dir, "model.ckpt"))
    assert not leftover.exists()


def test_prepare_keeps_temporary_files_a_live_process_is_writing(
    ckpt_dir: str, state: TrainState
) -> None:
    os.makedirs(ckpt_dir)
    in_flight = Path(ckpt_dir, f".model.ckpt-3.safetensors.tmp-{os.getpid()}-abcd")
    in_flight.write_bytes(b"being written")
    Saver().prepare(os.path.join(ckpt_dir, "model.ckpt"))
    assert in_flight.exists()


def test_nothing_is_left_behind_by_a_failed_write(
    ckpt_dir: str, state: TrainState, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(file: Any, data: Any) -> None:
        raise OSError(28, "No space left on device")

    # The data file's write fails, by chunks (a store's file) or in one writev (local).
    monkeypatch.setattr("monitored_checkpoint._format.write_all", broken)
    monkeypatch.setattr("monitored_checkpoint._store._RawFile.write_views", broken)
    with pytest.raises(OSError, match="No space left"):
        Saver().save(state, os.path.join(ckpt_dir, "model.ckpt"))
    assert _listing(ckpt_dir) == []


# -- directories ----------------------------------------------------------------------------------
def test_missing_directory_is_created_with_parents(tmp_path: Path, state: TrainState) -> None:
    target = tmp_path / "a" / "b" / "ckpt"
    Saver().save(state, str(target / "model.ckpt"))
    assert (target / "checkpoint").exists()


def test_directory_that_cannot_be_created_is_a_clear_error(
    tmp_path: Path, state: TrainState
) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointDirectoryError, match=r"file/ckpt does not exist and cannot"):
        Saver().prepare(str(tmp_path / "file" / "ckpt" / "model.ckpt"))


def test_directory_that_is_a_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "ckpt").write_text("x")
    with pytest.raises(CheckpointDirectoryError, match=r"ckpt is a file, not a directory") as info:
        Saver().prepare(str(tmp_path / "ckpt" / "model.ckpt"))
    assert "does not exist" not in str(info.value)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root ignores permissions")
def test_read_only_directory_is_a_clear_error(tmp_path: Path) -> None:
    target = tmp_path / "ro"
    target.mkdir()
    target.chmod(0o555)
    try:
        with pytest.raises(CheckpointDirectoryError, match="ro is not writable"):
            Saver().prepare(str(target / "model.ckpt"))
    finally:
        target.chmod(0o755)


class ReadOnlyMemoryFileSystem(MemoryFileSystem):  # type: ignore[misc]
    """A memory filesystem that refuses every write, like a read-only mount."""

    protocol = "romem"

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if "r" not in mode:
            raise PermissionError(13, "Permission denied", path)
        return super()._open(path, mode, **kwargs)


def test_non_writable_fsspec_directory_is_a_clear_error() -> None:
    fsspec.register_implementation("romem", ReadOnlyMemoryFileSystem, clobber=True)
    with pytest.raises(CheckpointDirectoryError, match=r"romem://ro/ckpt is not writable.*denied"):
        Saver().prepare("romem://ro/ckpt/model.ckpt")


def test_unknown_url_protocol_is_a_clear_error() -> None:
    with pytest.raises(CheckpointDirectoryError, match="nosuchfs://x.*no filesystem"):
        Saver().prepare("nosuchfs://x/model.ckpt")


def test_memory_filesystem_end_to_end(mem_dir: str, state: TrainState) -> None:
    _save_steps(mem_dir, state, range(7), Saver(max_to_keep=2))
    assert latest_checkpoint(mem_dir) == f"{mem_dir}/model.ckpt-6"
    fresh = make_fresh(state)
    manifest = restore_latest(fresh, mem_dir)
    assert manifest is not None
    assert manifest.step == 6
    np.testing.assert_array_equal(fresh["w"], state["w"])
    names = sorted(fsspec.filesystem("memory").ls(mem_dir[len("memory://") :], detail=False))
    assert [Path(n).name for n in names] == [
        "checkpoint",
        "model.ckpt-5.json",
        "model.ckpt-5.safetensors",
        "model.ckpt-6.json",
        "model.ckpt-6.safetensors",
    ]


# -- latest_checkpoint and checkpoint_state ---------------------------------------------------
def test_latest_checkpoint_of_missing_or_empty_directory_is_none(ckpt_dir: str) -> None:
    assert latest_checkpoint(ckpt_dir) is None
    os.makedirs(ckpt_dir)
    assert latest_checkpoint(ckpt_dir) is None
    assert checkpoint_state(ckpt_dir) is None


def test_latest_checkpoint_without_state_file_uses_the_manifests(
    ckpt_dir: str, state: TrainState
) -> None:
    _save_steps(ckpt_dir, state, [3, 10, 7])
    assert latest_checkpoint(ckpt_dir) == os.path.join(ckpt_dir, "model.ckpt-7"), "newest saved"
    Path(ckpt_dir, "checkpoint").unlink()
    assert latest_checkpoint(ckpt_dir) == os.path.join(ckpt_dir, "model.ckpt-10"), "highest step"
    Path(ckpt_dir, "checkpoint").write_text("garbage")
    assert latest_checkpoint(ckpt_dir) == os.path.join(ckpt_dir, "model.ckpt-10")


def test_latest_checkpoint_skips_a_listed_checkpoint_without_manifest(
    ckpt_dir: str, state: TrainState
) -> None:
    _save_steps(ckpt_dir, state, [1, 2])
    Path(ckpt_dir, "model.ckpt-2.json").unlink()
    assert latest_checkpoint(ckpt_dir) == os.path.join(ckpt_dir, "model.ckpt-1")
    with pytest.raises(ValueError, match="latest_filename"):
        latest_checkpoint(ckpt_dir, latest_filename="other")


def test_damaged_state_file_is_reported(ckpt_dir: str, state: TrainState) -> None:
    _save_steps(ckpt_dir, state, [1])
    Path(ckpt_dir, "checkpoint").write_text("# monitored-checkpoint state file\nnonsense\n")
    with pytest.raises(CorruptCheckpointError, match="checkpoint: the state file cannot be parsed"):
        checkpoint_state(ckpt_dir)


# -- restore_latest ------------------------------------------------------------------------------
def test_restore_latest_of_missing_directory_is_a_fresh_start(
    ckpt_dir: str, state: TrainState
) -> None:
    assert restore_latest(state, ckpt_dir) is None


def test_restore_latest_restores_arrays_step_and_rng(ckpt_dir: str, state: TrainState) -> None:
    state.rng.random(3)
    _save_steps(ckpt_dir, state, [5])
    expected_draw = np.random.Generator(np.random.PCG64()).bit_generator
    expected_draw.state = state.rng.bit_generator.state
    fresh = make_fresh(state)
    manifest = restore_latest(fresh, ckpt_dir)
    assert manifest is not None
    assert manifest.step == 5
    assert fresh.global_step == 5
    for name in state:
        assert fresh[name].tobytes() == state[name].tobytes()
    assert fresh.rng.random(4).tolist() == state.rng.random(4).tolist()


def test_restore_into_an_empty_state_creates_the_entries(ckpt_dir: str, state: TrainState) -> None:
    _save_steps(ckpt_dir, state, [2])
    empty = TrainState()
    restore_latest(empty, ckpt_dir)
    assert sorted(empty) == sorted(state)
    assert empty["w"].dtype == np.float32


def test_restore_keeps_references_to_state_arrays(ckpt_dir: str, state: TrainState) -> None:
    _save_steps(ckpt_dir, state, [2])
    fresh = make_fresh(state)
    held = fresh["w"]
    restore_latest(fresh, ckpt_dir)
    assert fresh["w"] is held
    np.testing.assert_array_equal(held, state["w"])


def test_restore_into_non_contiguous_entry_copies_in_place(ckpt_dir: str) -> None:
    state = TrainState({"t": np.arange(6.0).reshape(2, 3).T.copy()})
    _save_steps_plain(ckpt_dir, state)
    target = np.zeros((3, 2)).T.copy().T  # Fortran order: not C-contiguous
    fresh = TrainState({"t": target})
    restore_latest(fresh, ckpt_dir)
    assert fresh["t"] is target
    np.testing.assert_array_equal(target, state["t"])


def _save_steps_plain(directory: str, state: TrainState) -> None:
    Saver().save(state, f"{directory}/model.ckpt")


def test_corrupt_newest_falls_back_with_a_warning(ckpt_dir: str, state: TrainState) -> None:
    _save_steps(ckpt_dir, state, [1, 2, 3])
    _corrupt(os.path.join(ckpt_dir, "model.ckpt-3.safetensors"))
    fresh = make_fresh(state)
    with pytest.warns(CorruptCheckpointWarning) as caught:
        manifest = restore_latest(fresh, ckpt_dir)
    assert manifest is not None
    assert manifest.step == 2
    assert fresh["w"][0, 0] == 2
    [warning] = caught
    message = str(warning.message)
    assert "model.ckpt-3" in message
    assert "checksum mismatch" in message
    assert "restoring the older" in message
    assert "model.ckpt-2" in message


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda d: Path(d, "model.ckpt-3.json").write_text("{bad json"), "not valid JSON"),
        (lambda d: Path(d, "model.ckpt-3.safetensors").unlink(), "data file is missing"),
        (lambda d: os.truncate(Path(d, "model.ckpt-3.safetensors"), 50), "truncated"),
        (lambda d: Path(d, "model.ckpt-3.json").unlink(), "does not exist"),
    ],
    ids=["bad-json", "missing-data", "truncated", "missing-manifest"],
)
def test_every_kind_of_damage_falls_back(
    ckpt_dir: str, state: TrainState, damage: Any, reason: str
) -> None:
    _save_steps(ckpt_dir, state, [1, 2, 3])
    damage(ckpt_dir)
    fresh = make_fresh(state)
    with pytest.warns(CorruptCheckpointWarning, match=rf"model\.ckpt-3.*{reason}"):
        manifest = restore_latest(fresh, ckpt_dir)
    assert manifest is not None
    assert manifest.step == 2


def test_several_damaged_checkpoints_each_get_a_warning(ckpt_dir: str, state: TrainState) -> None:
    _save_steps(ckpt_dir, state, [1, 2, 3])
    _corrupt(os.path.join(ckpt_dir, "model.ckpt-3.safetensors"))
    Path(ckpt_dir, "model.ckpt-2.json").write_text("")
    with pytest.warns(CorruptCheckpointWarning) as caught:
        manifest = restore_latest(make_fresh(state), ckpt_dir)
    assert manifest is not None
    assert manifest.step == 1
    assert len(caught) == 2


def test_no_valid_checkpoint_is_an_error_not_a_fresh_start(
    ckpt_dir: str, state: TrainState
) -> None:
    _save_steps(ckpt_dir, state, [1, 2])
    _corrupt(os.path.join(ckpt_dir, "model.ckpt-1.safetensors"))
    Path(ckpt_dir, "model.ckpt-2.json").write_text("{")
    with pytest.raises(NoValidCheckpointError) as raised:
        restore_latest(make_fresh(state), ckpt_dir)
    message = str(raised.value)
    assert "none can be restored" in message
    assert "refusing to start afresh" in message
    assert "model.ckpt-1.safetensors: checksum mismatch" in message
    assert "model.ckpt-2.json: the manifest is not valid JSON" in message


def test_state_file_naming_deleted_checkpoints_is_an_error(
    ckpt_dir: str, state: TrainState
) -> None:
    _save_steps(ckpt_dir, state, [1])
    for name in ("model.ckpt-1.json", "model.ckpt-1.safetensors"):
        Path(ckpt_dir, name).unlink()
    with pytest.raises(NoValidCheckpointError, match=r"model\.ckpt-1 does not exist"):
        restore_latest(make_fresh(state), ckpt_dir)


def test_damaged_state_file_falls_back_to_the_manifests(ckpt_dir: str, state: TrainState) -> None:
    _save_steps(ckpt_dir, state, [1, 2])
    Path(ckpt_dir, "checkpoint").write_text("# monitored-checkpoint state file\n???\n")
    with pytest.warns(CorruptCheckpointWarning, match="state file cannot be parsed"):
        manifest = restore_latest(make_fresh(state), ckpt_dir)
    assert manifest is not None
    assert manifest.step == 2


def test_empty_state_file_falls_back_to_the_manifests(ckpt_dir: str, state: TrainState) -> None:
    _save_steps(ckpt_dir, state, [4])
    Path(ckpt_dir, "checkpoint").write_bytes(b"")
    with pytest.warns(CorruptCheckpointWarning, match="state file"):
        manifest = restore_latest(make_fresh(state), ckpt_dir)
    assert manifest is not None
    assert manifest.step == 4


def test_a_committed_checkpoint_missing_from_the_state_file_is_a_fallback(
    ckpt_dir: str, state: TrainState
) -> None:
    # A save killed between its manifest and the state file: the state file's
    # newest is restored; the unlisted one stays available as a fallback.
    _save_steps(ckpt_dir, state, [1, 2])
    listed = Path(ckpt_dir, "checkpoint").read_text()
    _save_steps(ckpt_dir, state, [3])
    Path(ckpt_dir, "checkpoint").write_text(listed)
    manifest = restore_latest(make_fresh(state), ckpt_dir)
    assert manifest is not None
    assert manifest.step == 2
    _corrupt(os.path.join(ckpt_dir, "model.ckpt-2.safetensors"))
    _corrupt(os.path.join(ckpt_dir, "model.ckpt-1.safetensors"))
    with pytest.warns(CorruptCheckpointWarning):
        manifest = restore_latest(make_fresh(state), ckpt_dir)
    assert manifest is not None
    assert manifest.step == 3


def test_only_leftovers_of_a_first_save_is_a_fresh_start(ckpt_dir: str, state: TrainState) -> None:
    _save_steps(ckpt_dir, state, [0])
    Path(ckpt_dir, "model.ckpt-0.json").unlink()  # killed before the manifest
    Path(ckpt_dir, "checkpoint").unlink()
    Path(ckpt_dir, ".model.ckpt-0.json.tmp-1-ab").write_text("{")
    Path(ckpt_dir, "events.out.tfevents.123.host").write_bytes(b"x")
    assert restore_latest(make_fresh(state), ckpt_dir) is None


@pytest.mark.parametrize(
    ("files", "kind"),
    [
        (
            {"checkpoint": 'model_checkpoint_path: "model.ckpt-5"\n', "model.ckpt-5.index": ""},
            "TensorFlow checkpoints",
        ),
        ({"checkpoint": 'model_checkpoint_path: "x"\n'}, "did not write"),
        ({"checkpoint": "\x00\x01binary"}, "did not write"),
        ({"weights.safetensors": "not ours"}, "did not write"),
        ({"model.ckpt-5.data-00000-of-00001": ""}, "TensorFlow checkpoints"),
    ],
    ids=["tf1", "foreign-state-file", "binary-state-file", "foreign-safetensors", "tf1-data"],
)
def test_another_projects_directory_is_refused(
    ckpt_dir: str, state: TrainState, files: dict[str, str], kind: str
) -> None:
    os.makedirs(ckpt_dir)
    for name, content in files.items():
        Path(ckpt_dir, name).write_text(content)
    with pytest.raises(ForeignCheckpointError, match=kind) as raised:
        restore_latest(make_fresh(state), ckpt_dir)
    assert "use a directory of its own" in str(raised.value)


def test_saving_over_another_projects_state_file_is_refused(
    ckpt_dir: str, state: TrainState
) -> None:
    os.makedirs(ckpt_dir)
    Path(ckpt_dir, "checkpoint").write_text('model_checkpoint_path: "model.ckpt-5"\n')
    with pytest.raises(ForeignCheckpointError, match="ckpt holds"):
        Saver().save(state, os.path.join(ckpt_dir, "model.ckpt"))
    assert Path(ckpt_dir, "checkpoint").read_text() == 'model_checkpoint_path: "model.ckpt-5"\n'


def test_mismatching_names_are_named(ckpt_dir: str, state: TrainState) -> None:
    _save_steps(ckpt_dir, state, [1])
    other = TrainState({"w": np.zeros((8, 3), np.float32), "gamma": np.zeros(3)})
    with pytest.raises(
        CheckpointMismatchError,
        match=r"model\.ckpt-1 \(step 1\) does not match the state: it lacks the state entries "
        r"\['gamma'\] \(it holds \['b', 'count'\] instead\)",
    ):
        restore_latest(other, ckpt_dir)


def test_mismatching_shapes_and_dtypes_are_named(ckpt_dir: str, state: TrainState) -> None:
    _save_steps(ckpt_dir, state, [1])
    other = TrainState(
        {"w": np.zeros((4, 3), np.float32), "b": np.zeros(3, np.float32), "count": np.array(0)}
    )
    with pytest.raises(CheckpointMismatchError) as raised:
        restore_latest(other, ckpt_dir)
    message = str(raised.value)
    assert "entry 'w' has shape (8, 3) in the checkpoint and (4, 3) in the state" in message
    assert "entry 'b' has dtype float64 in the checkpoint and float32 in the state" in message
    np.testing.assert_array_equal(other["w"], 0), "nothing was overwritten"


def test_mismatching_rng_is_named(ckpt_dir: str, state: TrainState) -> None:
    _save_steps(ckpt_dir, state, [1])
    other = make_fresh(state)
    other.rng = np.random.Generator(np.random.MT19937(0))
    with pytest.raises(CheckpointMismatchError, match="RNG state is for 'PCG64'.*'MT19937'"):
        restore_latest(other, ckpt_dir)


def test_extra_entries_cannot_be_added_to_a_created_state(ckpt_dir: str, state: TrainState) -> None:
    _save_steps(ckpt_dir, state, [1])
    other = TrainState({"w": np.zeros((8, 3), np.float32)})
    other.finalize()
    with pytest.raises(CheckpointMismatchError, match=r"holds entries \['b', 'count'\]"):
        restore_latest(other, ckpt_dir)


def test_mismatch_is_not_silently_skipped_for_an_older_checkpoint(
    ckpt_dir: str, state: TrainState
) -> None:
    state["extra"] = np.zeros(2)
    _save_steps(ckpt_dir, state, [1])  # would fit
    del state["extra"]
    _save_steps(ckpt_dir, state, [2])
    state["extra"] = np.zeros(2)
    with pytest.raises(CheckpointMismatchError, match=r"model\.ckpt-2.*lacks.*'extra'"):
        restore_latest(make_fresh(state), ckpt_dir)


def test_newer_format_is_an_error_not_a_fallback(ckpt_dir: str, state: TrainState) -> None:
    _save_steps(ckpt_dir, state, [1, 2])
    path = Path(ckpt_dir, "model.ckpt-2.json")
    doc = json.loads(path.read_text())
    doc["format_version"] = 99
    path.write_text(json.dumps(doc))
    with pytest.raises(CheckpointVersionError, match="version 99"):
        restore_latest(make_fresh(state), ckpt_dir)


def test_restore_of_a_missing_path_is_not_found(ckpt_dir: str, state: TrainState) -> None:
    with pytest.raises(CheckpointNotFoundError, match=r"model\.ckpt-3 does not exist"):
        Saver().restore(state, os.path.join(ckpt_dir, "model.ckpt-3"))


def test_latest_checkpoint_takes_only_checkpoints_whose_files_are_both_there(
    ckpt_dir: str, state: TrainState
) -> None:
    # A copy in name order brings the state file, then the manifest, then the data file.
    _save_steps(ckpt_dir, state, [1, 2])
    data = Path(ckpt_dir, "model.ckpt-2.safetensors")
    arriving = data.read_bytes()
    data.unlink()
    assert latest_checkpoint(ckpt_dir) == os.path.join(ckpt_dir, "model.ckpt-1")
    Path(ckpt_dir, "checkpoint").unlink()
    assert latest_checkpoint(ckpt_dir) == os.path.join(ckpt_dir, "model.ckpt-1")
    data.write_bytes(arriving)
    assert latest_checkpoint(ckpt_dir) == os.path.join(ckpt_dir, "model.ckpt-2")


def _flood(directory: str, count: int, first_step: int) -> None:
    """``count`` junk manifests newer than any checkpoint: the format marker, no data file."""
    for step in range(first_step, first_step + count):
        Path(directory, f"model.ckpt-{step}.json").write_text('{"format": "monitored-checkpoint"}')


def test_a_flood_of_junk_manifests_is_listed_not_read(
    ckpt_dir: str, state: TrainState, monkeypatch: pytest.MonkeyPatch
) -> None:
    _save_steps(ckpt_dir, state, [5])
    Path(ckpt_dir, "checkpoint").unlink()
    _flood(ckpt_dir, 10_000, 100)
    opened: list[str] = []
    real_open, real_read = LocalStore.open_file, LocalStore.read_bytes

    def counting(self: Any, name: str) -> Any:
        opened.append(name)
        return real_open(self, name)

    def counting_reads(self: Any, name: str, limit: int) -> bytes:
        opened.append(name)
        return real_read(self, name, limit)

    monkeypatch.setattr(LocalStore, "open_file", counting)
    monkeypatch.setattr(LocalStore, "read_bytes", counting_reads)
    real = os.path.join(ckpt_dir, "model.ckpt-5")
    assert latest_checkpoint(ckpt_dir) == real
    assert opened == []
    iterator = checkpoints_iterator(ckpt_dir, timeout=0, poll_secs=0)
    assert next(iterator) == real
    assert opened == ["model.ckpt-5.json"]  # its manifest, checked before it is yielded
    assert list(iterator) == []
    assert opened == ["model.ckpt-5.json"]


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files of a local store opened or read from now on, in order."""
    opened: list[str] = []
    real_open, real_read = LocalStore.open_file, LocalStore.read_bytes

    def counting(self: Any, name: str) -> Any:
        opened.append(name)
        return real_open(self, name)

    def counting_reads(self: Any, name: str, limit: int) -> bytes:
        opened.append(name)
        return real_read(self, name, limit)

    monkeypatch.setattr(LocalStore, "open_file", counting)
    monkeypatch.setattr(LocalStore, "read_bytes", counting_reads)
    return opened


@pytest.mark.parametrize("state_file", ["none", "ours", "hostile", "foreign"])
def test_restore_latest_reads_only_the_checkpoint_it_restores_in_a_flooded_directory(
    ckpt_dir: str, state: TrainState, monkeypatch: pytest.MonkeyPatch, state_file: str
) -> None:
    # 10,000 manifests newer than the one checkpoint, without data files: a
    # resume reads the checkpoint it restores (and the state file), not them.
    _save_steps(ckpt_dir, state, [5])
    if state_file == "none":
        Path(ckpt_dir, "checkpoint").unlink()
    elif state_file == "hostile":  # a state file naming every junk manifest, newest last
        names = [f"model.ckpt-{step}" for step in [5, *range(100, 10_100)]]
        Path(ckpt_dir, "checkpoint").write_bytes(saver_module._format_state(names, [], 0.0))
    elif state_file == "foreign":  # another program's: damage here, as ours are beside it
        Path(ckpt_dir, "checkpoint").write_text("written by someone else\n")
    _flood(ckpt_dir, 10_000, 100)
    opened = _count_reads(monkeypatch)
    fresh = make_fresh(state)
    with pytest.warns(CorruptCheckpointWarning) as caught:
        manifest = restore_latest(fresh, ckpt_dir)
    assert manifest is not None
    assert manifest.step == 5
    assert fresh["w"][0, 0] == 5
    assert set(opened) <= {"checkpoint", "model.ckpt-5.json", "model.ckpt-5.safetensors"}
    # The state file's first bytes and its parse; the manifest; the data file
    # verified, then read into the state's arrays in place.
    assert len(opened) <= 5, opened
    # The skipped ones are named from the listing, a few of them, in one warning.
    [message] = [str(w.message) for w in caught if "incomplete" in str(w.message)]
    assert (
        "model.ckpt-10099 is incomplete: the data file is missing (model.ckpt-10099.safetensors"
        in message
    )
    assert "and 9990 more" in message
    assert "restoring the older" in message


def test_restore_latest_of_a_flood_without_a_checkpoint_reads_one_manifest(
    ckpt_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing restores; one manifest of ours shows the directory holds checkpoints,
    # so a run refuses to start afresh over them, after one read.
    os.makedirs(ckpt_dir)
    _flood(ckpt_dir, 10_000, 100)
    opened = _count_reads(monkeypatch)
    with pytest.raises(NoValidCheckpointError, match="none can be restored") as raised:
        restore_latest(TrainState({"w": np.zeros(2)}), ckpt_dir)
    assert opened == ["model.ckpt-10099.json"]
    assert "model.ckpt-10099 is incomplete: the data file is missing (model.ckpt-10099." in str(
        raised.value
    )
    assert "and 9990 more" in str(raised.value)


def test_restore_latest_over_manifests_of_someone_else_starts_afresh(ckpt_dir: str) -> None:
    # JSON files named like manifests, not ours, without data files: not checkpoints.
    os.makedirs(ckpt_dir)
    for step in (1, 2):
        Path(ckpt_dir, f"model.ckpt-{step}.json").write_text('{"someone": "else"}')
    assert restore_latest(TrainState({"w": np.zeros(2)}), ckpt_dir) is None


def test_checkpoints_iterator_skips_a_damaged_newest_once_until_it_changes(
    ckpt_dir: str, state: TrainState, caplog: pytest.LogCaptureFixture
) -> None:
    _save_steps(ckpt_dir, state, [1, 2])
    manifest = Path(ckpt_dir, "model.ckpt-2.json")
    good = manifest.read_bytes()
    manifest.write_bytes(good[: len(good) // 2])  # a manifest copied half way
    iterator = checkpoints_iterator(ckpt_dir, timeout=0, poll_secs=0)
    with caplog.at_level("INFO", logger="monitored.checkpoint"):
        assert [Path(p).name for p in iterator] == ["model.ckpt-1"]
        assert list(iterator) == []  # looked at again: unchanged, so not read, not warned
    warned = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1
    assert "skipping checkpoint" in warned[0].getMessage()
    assert "model.ckpt-2" in warned[0].getMessage()
    assert "not valid JSON" in warned[0].getMessage()
    manifest.write_bytes(good)  # the copy completes
    assert [Path(p).name for p in iterator] == ["model.ckpt-2"]


def test_checkpoints_iterator_skips_a_damaged_newest_on_an_fsspec_store_too(
    mem_dir: str, state: TrainState
) -> None:
    _save_steps(mem_dir, state, [1, 2])
    fs, root = fsspec.core.url_to_fs(mem_dir)
    manifest = f"{root}/model.ckpt-2.json"
    good = fs.cat_file(manifest)
    fs.pipe_file(manifest, good[:10])
    iterator = checkpoints_iterator(mem_dir, timeout=0, poll_secs=0)
    assert [p.rsplit("/", 1)[-1] for p in iterator] == ["model.ckpt-1"]
    assert list(iterator) == []
    fs.pipe_file(manifest, good)
    assert [p.rsplit("/", 1)[-1] for p in iterator] == ["model.ckpt-2"]


def test_checkpoints_iterator_yields_an_older_one_only_if_newer_than_the_last(
    ckpt_dir: str, state: TrainState
) -> None:
    saver = _save_steps(ckpt_dir, state, [1])
    iterator = checkpoints_iterator(ckpt_dir, timeout=0, poll_secs=0)
    assert Path(next(iterator)).name == "model.ckpt-1"
    _save_steps(ckpt_dir, state, [2, 3], saver)
    _corrupt(os.path.join(ckpt_dir, "model.ckpt-3.json"))
    assert [Path(p).name for p in iterator] == ["model.ckpt-2"]  # 3 is damaged: the next
    _corrupt(os.path.join(ckpt_dir, "model.ckpt-2.json"))
    assert list(iterator) == []  # 1 was yielded already: nothing new


def test_a_rejected_checkpoint_counts_as_never_yielded(
    ckpt_dir: str, state: TrainState, caplog: pytest.LogCaptureFixture
) -> None:
    saver = _save_steps(ckpt_dir, state, [1, 2])
    iterator = checkpoints_iterator(ckpt_dir, timeout=0, poll_secs=0)
    assert Path(next(iterator)).name == "model.ckpt-2"
    _save_steps(ckpt_dir, state, [3], saver)
    assert Path(next(iterator)).name == "model.ckpt-3"
    with caplog.at_level("INFO", logger="monitored.checkpoint"):
        iterator.reject(os.path.join(ckpt_dir, "model.ckpt-3"), "its data file is damaged")
        assert list(iterator) == []  # not 3 again (unchanged), and 2 was yielded before it
        iterator.reject(os.path.join(ckpt_dir, "model.ckpt-3"), "still damaged")
    messages = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert messages == [
        ("WARNING", f"skipping checkpoint {ckpt_dir}/model.ckpt-3: its data file is damaged"),
        ("INFO", f"skipping checkpoint {ckpt_dir}/model.ckpt-3 again: still damaged"),
    ]
    with pytest.raises(ValueError, match="not a checkpoint of"):
        iterator.reject("/elsewhere/model.ckpt-3", "why")
    with pytest.raises(ValueError, match="not a checkpoint of"):
        iterator.reject(os.path.join(ckpt_dir, "checkpoint"), "why")


def test_a_checkpoint_deleted_between_the_listing_and_its_manifest_is_passed_over(
    ckpt_dir: str, state: TrainState, monkeypatch: pytest.MonkeyPatch
) -> None:
    _save_steps(ckpt_dir, state, [1, 2])
    real_list = LocalStore.list

    def list_then_rotate(self: Any) -> list[str]:
        names: list[str] = real_list(self)
        for file in ("model.ckpt-2.json", "model.ckpt-2.safetensors"):  # the trainer's rotation
            Path(ckpt_dir, file).unlink(missing_ok=True)
        return names

    monkeypatch.setattr(LocalStore, "list", list_then_rotate)
    assert [Path(p).name for p in checkpoints_iterator(ckpt_dir, timeout=0)] == ["model.ckpt-1"]


def test_a_checkpoint_deleted_between_its_stamp_and_its_manifest_is_passed_over(
    ckpt_dir: str, state: TrainState, monkeypatch: pytest.MonkeyPatch
) -> None:
    _save_steps(ckpt_dir, state, [1, 2])
    real_stamp = LocalStore.stamp

    def stamp_then_rotate(self: Any, name: str) -> tuple[object, ...] | None:
        stamp = real_stamp(self, name)
        if name == "model.ckpt-2.safetensors":  # both stamped: now rotation strikes
            Path(ckpt_dir, "model.ckpt-2.json").unlink()
        return stamp

    monkeypatch.setattr(LocalStore, "stamp", stamp_then_rotate)
    assert [Path(p).name for p in checkpoints_iterator(ckpt_dir, timeout=0)] == ["model.ckpt-1"]


def test_store_stamps_change_when_a_file_is_rewritten(ckpt_dir: str, mem_dir: str) -> None:
    for directory in (ckpt_dir, mem_dir):
        store = open_store(directory)
        store.ensure_directory()
        assert store.stamp("a") is None
        store.write("a", lambda f: f.write(b"one"))
        first = store.stamp("a")
        assert first is not None
        assert store.stamp("a") == first
        time.sleep(0.01)
        store.write("a", lambda f: f.write(b"three"))
        assert store.stamp("a") not in (None, first)
        store.remove("a")
        assert store.stamp("a") is None


# -- following a training job --------------------------------------------------------------------
def test_wait_for_new_checkpoint_times_out(ckpt_dir: str) -> None:
    started = time.monotonic()
    assert wait_for_new_checkpoint(ckpt_dir, seconds_to_sleep=0.01, timeout=0.05) is None
    assert time.monotonic() - started < 1


def test_checkpoints_iterator_follows_a_writer(ckpt_dir: str, state: TrainState) -> None:
    saver = Saver()

    def train() -> None:
        for step in (1, 2, 3):
            time.sleep(0.05)
            _save_steps(ckpt_dir, state, [step], saver)

    writer = threading.Thread(target=train)
    writer.start()
    seen = []
    for path in checkpoints_iterator(ckpt_dir, timeout=1.0, poll_secs=0.01):
        seen.append(Path(path).name)
        if seen[-1] == "model.ckpt-3":
            break
    writer.join()
    assert seen[-1] == "model.ckpt-3"
    assert seen == sorted(set(seen)), "each checkpoint once, in order"


def test_checkpoints_iterator_stops_after_timeout_unless_told_to_go_on(ckpt_dir: str) -> None:
    calls = []

    def timeout_fn() -> bool:
        calls.append(1)
        return len(calls) >= 2

    assert list(checkpoints_iterator(ckpt_dir, timeout=0.02, poll_secs=0.01)) == []
    assert (
        list(checkpoints_iterator(ckpt_dir, timeout=0.02, timeout_fn=timeout_fn, poll_secs=0.01))
        == []
    )
    assert len(calls) == 2


def test_checkpoints_iterator_respects_min_interval(ckpt_dir: str, state: TrainState) -> None:
    saver = _save_steps(ckpt_dir, state, [1])
    iterator = checkpoints_iterator(ckpt_dir, min_interval_secs=0.2, timeout=1, poll_secs=0.01)
    assert Path(next(iterator)).name == "model.ckpt-1"
    started = time.monotonic()
    _save_steps(ckpt_dir, state, [2], saver)
    assert Path(next(iterator)).name == "model.ckpt-2"
    assert time.monotonic() - started >= 0.19


def test_sync_iteration_refuses_an_async_timeout_fn(ckpt_dir: str) -> None:
    async def timeout_fn() -> bool:
        return True

    iterator = checkpoints_iterator(ckpt_dir, timeout=0.01, timeout_fn=timeout_fn, poll_secs=0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the never-awaited coroutine
        with pytest.raises(TypeError, match="async for"):
            next(iterator)


@pytest.mark.anyio
async def test_checkpoints_iterator_is_async_too(ckpt_dir: str, state: TrainState) -> None:
    saver = Saver()
    seen: list[str] = []

    async def consume() -> None:
        async for path in checkpoints_iterator(ckpt_dir, timeout=0.5, poll_secs=0.01):
            seen.append(Path(path).name)

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        for step in (1, 2):
            await anyio.sleep(0.05)
            await anyio.to_thread.run_sync(_save_steps, ckpt_dir, state, [step], saver)
    assert seen == ["model.ckpt-1", "model.ckpt-2"]


@pytest.mark.anyio
async def test_async_iterator_awaits_an_async_timeout_fn(ckpt_dir: str) -> None:
    calls = []

    async def timeout_fn() -> bool:
        calls.append(1)
        return True

    seen = [
        p
        async for p in checkpoints_iterator(
            ckpt_dir, timeout=0.02, timeout_fn=timeout_fn, poll_secs=0.01
        )
    ]
    assert seen == []
    assert calls == [1]
