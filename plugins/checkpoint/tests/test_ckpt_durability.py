"""The order of a local save's ``fsync``s and renames (docs/checkpoint.md, Guarantees).

A power loss keeps what was ``fsync``-ed: a file's content once the file is
synced, a rename once its directory is. A save must never leave, after a power
loss, a manifest whose data file is missing or incomplete, and must have made
the checkpoint and the state file naming it durable when it returns. The real
calls are recorded (not replaced) while a real ``Saver`` writes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from monitored import TrainState
from monitored_checkpoint import Saver, latest_checkpoint, restore
from monitored_checkpoint import _store as store_module


class Calls:
    """Records ``fsync`` of files and directories and ``rename``s, in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, directory: Path) -> None:
        self.events: list[tuple[str, str]] = []
        real_fsync, real_replace = os.fsync, os.replace
        real_dir_sync = store_module._fsync_directory

        def fsync(fd: int) -> None:
            target = os.readlink(f"/proc/self/fd/{fd}") if os.path.exists("/proc/self") else "?"
            self.events.append(("fsync", os.path.basename(target)))
            real_fsync(fd)

        def replace(src: Any, dst: Any) -> None:
            real_replace(src, dst)
            self.events.append(("rename", os.path.basename(os.fspath(dst))))

        def dir_sync(path: str) -> None:
            real_dir_sync(path)
            self.events.append(("dirsync", os.path.basename(path)))

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "replace", replace)
        monkeypatch.setattr(store_module, "_fsync_directory", dir_sync)

    def index(self, event: tuple[str, str]) -> int:
        return self.events.index(event)


def _state(step: int) -> TrainState:
    state = TrainState({"w": np.arange(1000, dtype=np.float32) + step})
    state.global_step = step
    return state


@pytest.mark.skipif(not os.path.exists("/proc/self/fd"), reason="names of open files")
def test_a_save_syncs_data_before_its_manifest_can_appear_and_all_before_returning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "ckpt"
    saver = Saver(max_to_keep=1)
    saver.save(_state(1), str(directory / "model.ckpt"))  # the directory and its state exist
    calls = Calls(monkeypatch, directory)
    path = saver.save(_state(2), str(directory / "model.ckpt"))
    events = calls.events
    data, manifest = "model.ckpt-2.safetensors", "model.ckpt-2.json"

    data_synced = next(i for i, (k, n) in enumerate(events) if k == "fsync" and data in n)
    data_renamed = calls.index(("rename", data))
    manifest_synced = next(
        i for i, (k, n) in enumerate(events) if k == "fsync" and "model.ckpt-2.json" in n
    )
    manifest_renamed = calls.index(("rename", manifest))
    state_renamed = calls.index(("rename", "checkpoint"))
    dir_syncs = [i for i, (k, _) in enumerate(events) if k == "dirsync"]

    # The data file's content, then its rename, are durable before the manifest
    # can appear under its name.
    assert data_synced < data_renamed < manifest_renamed
    assert any(data_renamed < i < manifest_renamed for i in dir_syncs), events
    assert manifest_synced < manifest_renamed
    # The manifest's rename and the state file's are durable once save returns.
    assert state_renamed < dir_syncs[-1], events
    assert manifest_renamed < dir_syncs[-1]
    # Three files, two directory syncs (was: three of each).
    assert sum(k == "fsync" and n != directory.name for k, n in events) == 3, events
    assert len(dir_syncs) == 2, events

    assert latest_checkpoint(str(directory)) == path
    restored = TrainState()
    restore(restored, path)
    assert restored["w"].tolist() == _state(2)["w"].tolist()
    assert sorted(os.listdir(directory)) == sorted(["checkpoint", data, manifest]), "rotated"


@pytest.mark.skipif(not os.path.exists("/proc/self/fd"), reason="names of open files")
def test_the_writability_probe_at_a_sessions_start_syncs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "ckpt"
    calls = Calls(monkeypatch, directory)
    Saver().prepare(str(directory / "model.ckpt"))
    assert [k for k, _ in calls.events if k != "rename"] == [], calls.events
    assert os.listdir(directory) == [], "the probe is removed"
