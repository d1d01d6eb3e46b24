"""TensorFlow's ``saver_test.py`` tests of checkpoint rotation (``MaxToKeepTest``,
``RecoverLastCheckpointsTest``, ``KeepCheckpointEveryNHoursTest``), ported to the
``monitored-checkpoint`` plugin's ``Saver`` (skipped without it).

TF's ``save.save(sess, dir/"s1")`` writes ``s1``; saves here are always
``<prefix>-<step>`` (a deliberate difference), so the same call writes ``s1-0`` and
returns that path: the names differ by the suffix, the scenarios and assertions
are TF's. ``mock.patch(saver_module.time)`` becomes a fake clock for the saver.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

import numpy as np
import pytest
from _tf1 import FakeClock

from monitored import TrainState

ckpt = pytest.importorskip("monitored_checkpoint")
from monitored_checkpoint import _format, _saver  # noqa: E402

exists = ckpt.checkpoint_exists


def assert_checkpoint_state(
    model_checkpoint_path: str, all_paths: list[str], save_dir: str
) -> None:
    state = ckpt.get_checkpoint_state(save_dir)
    assert state is not None
    assert state.model_checkpoint_path == model_checkpoint_path
    assert list(state.all_model_checkpoint_paths) == all_paths


@pytest.fixture
def v() -> TrainState:
    return TrainState({"v": np.asarray(10.0, np.float32)})


def test_MaxToKeepTest_testMaxToKeepEager(tmp_path: Path, v: TrainState) -> None:
    save_dir = str(tmp_path / "max_to_keep_non_sharded")
    save = ckpt.Saver(max_to_keep=2)
    s1 = save.save(v, os.path.join(save_dir, "s1"))
    assert [s1] == save.last_checkpoints
    assert exists(s1)
    assert_checkpoint_state(s1, [s1], save_dir)

    s2 = save.save(v, os.path.join(save_dir, "s2"))
    assert [s1, s2] == save.last_checkpoints
    assert exists(s1)
    assert exists(s2)
    assert_checkpoint_state(s2, [s1, s2], save_dir)

    s3 = save.save(v, os.path.join(save_dir, "s3"))
    assert [s2, s3] == save.last_checkpoints
    assert not exists(s1)
    assert exists(s2)
    assert exists(s3)
    assert_checkpoint_state(s3, [s2, s3], save_dir)

    # A second helper, identical to the first.
    save2 = ckpt.Saver(max_to_keep=2)
    save2.set_last_checkpoints(save.last_checkpoints)

    # Adding s2 again (the old s2 is removed first, then the new one appended).
    s2 = save.save(v, os.path.join(save_dir, "s2"))
    assert [s3, s2] == save.last_checkpoints
    assert not exists(s1)
    assert exists(s3)
    assert exists(s2)
    assert_checkpoint_state(s2, [s3, s2], save_dir)

    # Adding s1 (s3 is deleted as the oldest in the list).
    s1 = save.save(v, os.path.join(save_dir, "s1"))
    assert [s2, s1] == save.last_checkpoints
    assert not exists(s3)
    assert exists(s2)
    assert_checkpoint_state(s1, [s2, s1], save_dir)

    s2 = save2.save(v, os.path.join(save_dir, "s2"))
    assert [s3, s2] == save2.last_checkpoints
    assert exists(s1)  # created by the first helper
    assert not exists(s3)  # deleted by the first helper


def test_MaxToKeepTest_testNonSharded(tmp_path: Path, v: TrainState) -> None:
    """TF's third helper knows no checkpoint; here a new saver reads the state file it
    finds (a deliberate difference), so it tracks what the file lists: its first
    save lists ``[s1, s2]`` where TF's lists ``[s2]``; the rest is TF's."""
    save_dir = str(tmp_path / "max_to_keep_non_sharded")
    save = ckpt.Saver(max_to_keep=2)
    assert save.last_checkpoints == []

    s1 = save.save(v, os.path.join(save_dir, "s1"))
    assert [s1] == save.last_checkpoints
    assert exists(s1)
    assert_checkpoint_state(s1, [s1], save_dir)

    s2 = save.save(v, os.path.join(save_dir, "s2"))
    assert [s1, s2] == save.last_checkpoints
    assert exists(s1)
    assert exists(s2)
    assert_checkpoint_state(s2, [s1, s2], save_dir)

    s3 = save.save(v, os.path.join(save_dir, "s3"))
    assert [s2, s3] == save.last_checkpoints
    assert not exists(s1)
    assert exists(s2)
    assert exists(s3)
    assert_checkpoint_state(s3, [s2, s3], save_dir)

    save2 = ckpt.Saver(max_to_keep=2)
    save2.set_last_checkpoints(save.last_checkpoints)
    save3 = ckpt.Saver(max_to_keep=2)

    # The first helper.
    s2 = save.save(v, os.path.join(save_dir, "s2"))
    assert [s3, s2] == save.last_checkpoints
    assert not exists(s1)
    assert exists(s3)
    assert exists(s2)
    assert_checkpoint_state(s2, [s3, s2], save_dir)

    s1 = save.save(v, os.path.join(save_dir, "s1"))
    assert [s2, s1] == save.last_checkpoints
    assert not exists(s3)
    assert exists(s2)
    assert exists(s1)
    assert_checkpoint_state(s1, [s2, s1], save_dir)

    # The second helper.
    s2 = save2.save(v, os.path.join(save_dir, "s2"))
    assert [s3, s2] == save2.last_checkpoints
    assert exists(s1)  # created by the first helper
    assert not exists(s3)  # deleted by the first helper
    assert exists(s2)
    assert_checkpoint_state(s2, [s3, s2], save_dir)

    s1 = save2.save(v, os.path.join(save_dir, "s1"))
    assert [s2, s1] == save2.last_checkpoints
    assert not exists(s3)
    assert exists(s2)
    assert exists(s1)
    assert_checkpoint_state(s1, [s2, s1], save_dir)

    # The third helper: it reads the state file ([s2, s1]) on its first save.
    s2 = save3.save(v, os.path.join(save_dir, "s2"))
    assert [s1, s2] == save3.last_checkpoints  # TF: [s2]
    assert exists(s1)
    assert not exists(s3)
    assert exists(s2)
    assert_checkpoint_state(s2, [s1, s2], save_dir)  # TF: [s2]

    s1 = save3.save(v, os.path.join(save_dir, "s1"))
    assert [s2, s1] == save3.last_checkpoints
    assert not exists(s3)
    assert exists(s2)
    assert exists(s1)
    assert_checkpoint_state(s1, [s2, s1], save_dir)


def test_MaxToKeepTest_testNoMaxToKeep(tmp_path: Path, v: TrainState) -> None:
    save_dir = str(tmp_path / "no_max_to_keep")
    save_dir2 = str(tmp_path / "max_to_keep_0")

    save = ckpt.Saver(max_to_keep=None)
    assert save.last_checkpoints == []
    s1 = save.save(v, os.path.join(save_dir, "s1"))
    assert save.last_checkpoints == []
    assert exists(s1)
    s2 = save.save(v, os.path.join(save_dir, "s2"))
    assert save.last_checkpoints == []
    assert exists(s2)

    save2 = ckpt.Saver(max_to_keep=0)
    assert save2.last_checkpoints == []
    s1 = save2.save(v, os.path.join(save_dir2, "s1"))
    assert save2.last_checkpoints == []
    assert exists(s1)
    s2 = save2.save(v, os.path.join(save_dir2, "s2"))
    assert save2.last_checkpoints == []
    assert exists(s2)


def test_RecoverLastCheckpointsTest_test_recover_last_checkpoints(
    tmp_path: Path, v: TrainState
) -> None:
    save_dir = str(tmp_path / "recover_last_checkpoints")
    save = ckpt.Saver(max_to_keep=10)
    assert save.last_checkpoints == []

    s1 = save.save(v, os.path.join(save_dir, "ckpt"), 1)
    s2 = save.save(v, os.path.join(save_dir, "ckpt"), 2)
    s3 = save.save(v, os.path.join(save_dir, "ckpt"), 3)
    assert [s1, s2, s3] == save.last_checkpoints
    assert exists(s1)
    assert exists(s2)
    assert exists(s3)
    assert_checkpoint_state(s3, [s1, s2, s3], save_dir)

    # Another saver recovers the last checkpoints.
    save2 = ckpt.Saver(max_to_keep=10)
    assert save2.last_checkpoints == []
    save2.recover_last_checkpoints([s1, s2, s3])
    assert [s1, s2, s3] == save2.last_checkpoints

    # A checkpoint removed from disk is left out.
    for fname in glob.glob(f"{s1}.*"):
        os.remove(fname)
    assert not exists(s1)

    save3 = ckpt.Saver(max_to_keep=10)
    assert save3.last_checkpoints == []
    save3.recover_last_checkpoints([s1, s2, s3])
    assert [s2, s3] == save3.last_checkpoints
    s4 = save3.save(v, os.path.join(save_dir, "ckpt"), 4)
    assert_checkpoint_state(s4, [s2, s3, s4], save_dir)


def test_KeepCheckpointEveryNHoursTest_testNonSharded(
    tmp_path: Path, v: TrainState, monkeypatch: pytest.MonkeyPatch
) -> None:
    save_dir = str(tmp_path / "keep_checkpoint_every_n_hours")
    start_time = 1484695987.209386
    clock = FakeClock(start_time)
    monkeypatch.setattr(_saver, "time", clock)
    monkeypatch.setattr(_format, "time", clock)
    # Keeps the last 2 checkpoints plus one every 0.7 seconds.
    save = ckpt.Saver(max_to_keep=2, keep_checkpoint_every_n_hours=0.7 / 3600)
    assert save.last_checkpoints == []

    # One second later, so that s1 is old enough to keep.
    clock.value = start_time + 1.0
    s1 = save.save(v, os.path.join(save_dir, "s1"))
    assert [s1] == save.last_checkpoints

    s2 = save.save(v, os.path.join(save_dir, "s2"))
    assert [s1, s2] == save.last_checkpoints

    # [s1, s2]: the next save would delete s1, but s1 is older than 0.7 s: kept.
    s3 = save.save(v, os.path.join(save_dir, "s3"))
    assert [s2, s3] == save.last_checkpoints

    # [s2, s3] and s1 on disk: s2, as close in time to s1, is deleted.
    s4 = save.save(v, os.path.join(save_dir, "s4"))
    assert [s3, s4] == save.last_checkpoints

    assert exists(s1)
    assert not exists(s2)
    assert exists(s3)
    assert exists(s4)
