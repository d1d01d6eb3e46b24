"""``monitored checkpoint ls|show|diff|verify`` and ``load_variable``.

The commands run in-process through ``monitored``'s own entry point (so through
the ``register_commands`` hook, as a user's shell does), and once as the real
``monitored`` console script. The hostile directories are those of
``test_ckpt_hostile.py``: every command either answers or gives the plugin's
error with a non-zero exit status, never a traceback or a hang, and nothing
outside the directory is touched.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from monitored import TrainState
from monitored._cli import main
from monitored_checkpoint import (
    CheckpointError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    CorruptCheckpointWarning,
    NoValidCheckpointError,
    Saver,
    list_variables,
    load_variable,
    restore_latest,
)
from monitored_checkpoint._inspect import ArrayStats, array_stats

# The hostile scenes and crafted cases of test_ckpt_hostile.py, loaded from its file
# (test modules are not importable by name here); its fixtures become this module's.
_spec = importlib.util.spec_from_file_location(
    "ckpt_hostile_cases", Path(__file__).with_name("test_ckpt_hostile.py")
)
assert _spec is not None
assert _spec.loader is not None
hostile = sys.modules.setdefault(_spec.name, importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(hostile)
template = hostile.template
scene = hostile.scene
nothing_executes = hostile.nothing_executes

#: Generous: each command here takes milliseconds; only a hang gets near it.
GUARD_SECS = 60.0


def _state(seed: int = 0) -> TrainState:
    rng = np.random.default_rng(seed)
    return TrainState(
        {
            "w": rng.standard_normal((8, 3)).astype(np.float32),
            "b": np.array([1.0, np.nan, 3.0]),
            "count": np.array(seed, dtype=np.int64),
        },
        seed=seed,
    )


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A directory of checkpoints of steps 2, 3 and 4; step 2 is kept forever, 4 is newest."""
    directory = tmp_path / "run"
    state = _state()
    # Any checkpoint rotated out is preserved: one per 1e-9 hours.
    saver = Saver(max_to_keep=2, keep_checkpoint_every_n_hours=1e-9)
    saver.prepare(f"{directory}/model.ckpt")
    for step in (2, 3, 4):
        state.global_step = step
        state["w"][0, 0] = step
        saver.save(
            state,
            f"{directory}/model.ckpt",
            plugin_states={"early_stopping": {"version": 1, "state": {"best": 0.5}}},
        )
    return directory


def _cli(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    """``monitored checkpoint *argv`` in-process: (exit status, stdout, stderr)."""
    outcome: dict[str, Any] = {}

    def call() -> None:
        try:
            outcome["status"] = main(["checkpoint", *map(str, argv)])
        except SystemExit as exc:  # argparse's own usage errors
            outcome["status"] = exc.code
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(GUARD_SECS)
    assert not thread.is_alive(), f"monitored checkpoint {argv} hung"
    if "error" in outcome:
        raise AssertionError(f"monitored checkpoint {argv} raised") from outcome["error"]
    captured = capsys.readouterr()
    return outcome["status"], captured.out, captured.err


# -- ls -------------------------------------------------------------------------------------------
def test_ls_lists_step_time_size_arrays_newest_and_kept_forever(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = _cli(capsys, "ls", run)
    assert (status, err) == (0, "")
    header, *lines = out.splitlines()
    assert header.split() == ["step", "written", "size", "arrays", "notes", "name"]
    rows = [line.split() for line in lines]
    assert [row[0] for row in rows] == ["2", "3", "4"]
    assert [row[-1] for row in rows] == ["model.ckpt-2", "model.ckpt-3", "model.ckpt-4"]
    assert "kept forever" in lines[0]
    assert lines[1].split()[-2] == "-"
    assert "newest" in lines[2]
    size = (run / "model.ckpt-4.safetensors").stat().st_size + (
        run / "model.ckpt-4.json"
    ).stat().st_size
    assert f"{size / 1024:.1f} KiB" in lines[2]


def test_ls_json(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = _cli(capsys, "ls", "--json", run)
    assert status == 0
    rows = json.loads(out)
    assert [(r["step"], r["arrays"], r["newest"], r["kept_forever"]) for r in rows] == [
        (2, 3, False, True),
        (3, 3, False, False),
        (4, 3, True, False),
    ]
    assert rows[2]["path"] == str(run / "model.ckpt-4")
    assert rows[2]["size"] == sum(
        (run / f"model.ckpt-4{suffix}").stat().st_size for suffix in (".safetensors", ".json")
    )
    assert rows[2]["created"] > 0
    assert rows[2]["problem"] is None


def test_ls_without_a_state_file_cannot_tell_what_is_kept_forever(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (run / "checkpoint").unlink()
    rows = json.loads(_cli(capsys, "ls", "--json", run)[1])
    assert [r["kept_forever"] for r in rows] == [None, None, None]
    assert [r["newest"] for r in rows] == [False, False, True]


def test_ls_of_an_empty_directory_and_of_no_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _cli(capsys, "ls", tmp_path) == (0, f"No checkpoints in {tmp_path}.\n", "")
    status, out, err = _cli(capsys, "ls", tmp_path / "missing")
    assert (status, out) == (2, "")
    assert err == f"monitored checkpoint ls: error: {tmp_path / 'missing'} does not exist\n"
    (tmp_path / "file").write_text("x")
    (tmp_path / "dangling").symlink_to("nowhere")
    for entry, what in (
        ("file", "is not a directory of checkpoints"),
        ("dangling", "is a symbolic link to nowhere"),
    ):
        status, out, err = _cli(capsys, "ls", tmp_path / entry)
        assert (status, out) == (2, "")
        assert err == f"monitored checkpoint ls: error: {tmp_path / entry} {what}\n"


def test_ls_and_verify_of_a_parent_of_runs_name_the_runs(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``monitored checkpoint ls runs``: the subdirectories that hold checkpoints, by listing."""
    shutil.copytree(run, tmp_path / "run2")
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("x")
    status, out, err = _cli(capsys, "ls", tmp_path)
    assert (status, err) == (0, "")
    assert out.splitlines() == [
        f"No checkpoints in {tmp_path}.",
        "These subdirectories of it hold checkpoints:",
        f"  {run}",
        f"  {tmp_path / 'run2'}",
        f"List one: monitored checkpoint ls {run}",
    ]
    status, out, _ = _cli(capsys, "verify", tmp_path)
    assert status == 1
    assert out.splitlines()[0] == (
        f"problem: {tmp_path} holds no checkpoint (no manifest *.json); these subdirectories "
        f"of it hold some: {run}, {tmp_path / 'run2'}"
    )
    status, _, err = _cli(capsys, "show", tmp_path)
    assert status == 2
    assert err.endswith(f"these subdirectories of it hold some: {run}, {tmp_path / 'run2'}\n")


def test_ls_names_a_damaged_checkpoint_and_exits_1(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (run / "model.ckpt-3.json").write_text("{not json")
    status, out, err = _cli(capsys, "ls", run)
    assert status == 1
    assert "damaged" in out.splitlines()[2]
    # The problem names the file at fault, whose name starts with the checkpoint's.
    assert err.startswith(f"monitored checkpoint ls: error: {run / 'model.ckpt-3.json'}: ")
    assert "the manifest is not valid JSON" in err


def _damage(run: Path, name: str, how: str) -> None:
    if how == "manifest":
        (run / f"{name}.json").write_text("{not json")
    elif how == "truncated data":
        data = run / f"{name}.safetensors"
        data.write_bytes(data.read_bytes()[:-8])
    else:
        (run / f"{name}.safetensors").unlink()


@pytest.mark.parametrize("how", ["manifest", "truncated data"])
def test_ls_says_a_damaged_newest_is_skipped_and_which_checkpoint_a_restore_uses(
    run: Path, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    _damage(run, "model.ckpt-4", how)
    status, out, err = _cli(capsys, "ls", run)
    assert status == 1
    lines = out.splitlines()
    assert "damaged, newest, skipped by a restore" in lines[3]
    assert lines[2].split()[-2:] == ["restored", "model.ckpt-3"]
    assert lines[4] == (
        "the newest checkpoint, model.ckpt-4, is damaged: a restore skips it and uses "
        "model.ckpt-3 (step 3)"
    )
    at_fault = "model.ckpt-4.json:" if how == "manifest" else "model.ckpt-4: the data file"
    assert err.startswith(f"monitored checkpoint ls: error: {run / at_fault} ")
    if how == "truncated data":
        size = (run / "model.ckpt-4.safetensors").stat().st_size
        assert err.endswith(
            f"the data file model.ckpt-4.safetensors has {size} bytes, the manifest says "
            f"{size + 8}; it is truncated or was replaced\n"
        )
    rows = json.loads(_cli(capsys, "ls", "--json", run)[1])
    assert [(r["newest"], r["restored"]) for r in rows] == [
        (False, False),
        (False, True),
        (True, False),
    ]
    # What a restore really does.
    state = _state()
    with pytest.warns(CorruptCheckpointWarning, match="model.ckpt-4"):
        manifest = restore_latest(state, run)
    assert manifest is not None
    assert manifest.name == "model.ckpt-3" == rows[1]["name"]


def test_ls_a_checkpoint_without_its_data_file_is_damaged_and_not_the_newest(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As for ``latest_checkpoint``, a manifest without its data file is no checkpoint yet."""
    _damage(run, "model.ckpt-4", "missing data")
    status, out, err = _cli(capsys, "ls", run)
    assert status == 1
    lines = out.splitlines()
    assert lines[2].split()[-2:] == ["newest", "model.ckpt-3"]
    assert lines[3].split()[-2:] == ["damaged", "model.ckpt-4"]
    assert len(lines) == 4
    assert err == (
        f"monitored checkpoint ls: error: {run / 'model.ckpt-4'}: "
        "the data file model.ckpt-4.safetensors is missing\n"
    )
    rows = json.loads(_cli(capsys, "ls", "--json", run)[1])
    assert [(r["newest"], r["restored"]) for r in rows] == [
        (False, False),
        (True, True),
        (False, False),
    ]
    with pytest.warns(CorruptCheckpointWarning, match="model.ckpt-4"):
        manifest = restore_latest(_state(), run)
    assert manifest is not None
    assert manifest.name == "model.ckpt-3"


def test_ls_of_a_healthy_directory_restores_the_newest_and_says_nothing_more(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = _cli(capsys, "ls", run)
    assert status == 0
    assert out.splitlines()[-1].split()[-2:] == ["newest", "model.ckpt-4"]
    rows = json.loads(_cli(capsys, "ls", "--json", run)[1])
    assert [r["restored"] for r in rows] == [False, False, True]


def test_ls_restore_order_follows_the_state_file_as_a_restore_does(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The state file lists 3 and 4 (2 was rotated out, kept forever): with both damaged, a
    restore goes on by step to 2, and so does ls."""
    _damage(run, "model.ckpt-4", "manifest")
    _damage(run, "model.ckpt-3", "truncated data")
    out = _cli(capsys, "ls", run)[1]
    assert out.splitlines()[-1] == (
        "the newest checkpoint, model.ckpt-4, is damaged: a restore skips it and uses "
        "model.ckpt-2 (step 2)"
    )
    with pytest.warns(CorruptCheckpointWarning):
        manifest = restore_latest(_state(), run)
    assert manifest is not None
    assert manifest.name == "model.ckpt-2"


def test_ls_names_what_a_restore_uses_when_the_state_file_points_elsewhere(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A state file whose newest (3) is not the last it keeps (4): ``latest_checkpoint``
    answers 3, a restore tries 4 first; ls says both."""
    state_file = run / "checkpoint"
    text = state_file.read_text()
    state_file.write_text(
        text.replace(
            'model_checkpoint_path: "model.ckpt-4"', 'model_checkpoint_path: "model.ckpt-3"'
        )
    )
    status, out, _ = _cli(capsys, "ls", run)
    assert status == 0
    lines = out.splitlines()
    assert lines[2].split()[-2:] == ["newest", "model.ckpt-3"]
    assert lines[3].split()[-2:] == ["restored", "model.ckpt-4"]
    assert lines[4] == "a restore uses model.ckpt-4 (step 4)"
    manifest = restore_latest(_state(), run)
    assert manifest is not None
    assert manifest.name == "model.ckpt-4"


def test_ls_when_no_checkpoint_can_be_restored(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for step in (2, 3, 4):
        _damage(run, f"model.ckpt-{step}", "missing data")
    status, out, err = _cli(capsys, "ls", run)
    assert status == 1
    assert out.splitlines()[-1] == "no checkpoint here can be restored: each one is damaged"
    assert err.count(".safetensors is missing") == 3
    with pytest.raises(NoValidCheckpointError):
        restore_latest(_state(), run)


def _fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def _replace_with_link(path: Path, target: str) -> None:
    path.unlink(missing_ok=True)
    path.symlink_to(target)


def _replace_with_directory(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.mkdir()


#: Entries named like a checkpoint file that are no good one: what each makes ``ls`` and
#: ``verify`` say. Checkpoints 2, 3 and 4 stay good; 4 stays the newest and restored.
ODD_ENTRIES: dict[str, tuple[Callable[[Path], None], str, str]] = {
    "manifest-fifo": (
        lambda run: _fifo(run / "model.ckpt-5.json"),
        "model.ckpt-5",
        "model.ckpt-5.json is a FIFO, not a manifest; refused",
    ),
    "manifest-link-to-dev-zero": (
        lambda run: _replace_with_link(run / "model.ckpt-5.json", "/dev/zero"),
        "model.ckpt-5",
        "model.ckpt-5.json is a symbolic link to /dev/zero, outside",
    ),
    "manifest-is-a-directory": (
        lambda run: _replace_with_directory(run / "model.ckpt-5.json"),
        "model.ckpt-5",
        "model.ckpt-5.json is a directory, not a manifest; refused",
    ),
    "manifest-not-json": (
        lambda run: (run / "model.ckpt-9.json").write_text("{garbage"),
        "model.ckpt-9",
        "model.ckpt-9.json: the manifest is not valid JSON",
    ),
    "manifest-empty-object": (
        lambda run: (run / "model.ckpt-7.json").write_text("{}"),
        "model.ckpt-7",
        "model.ckpt-7.json is not a monitored-checkpoint manifest",
    ),
    "another-checkpoints-manifest": (
        lambda run: shutil.copy(run / "model.ckpt-2.json", run / "model.ckpt-8.json"),
        "model.ckpt-8",
        "model.ckpt-8.json: the manifest is incomplete or damaged (files must name exactly "
        "'model.ckpt-8.safetensors'",
    ),
    "data-file-without-manifest": (
        lambda run: shutil.copy(run / "model.ckpt-2.safetensors", run / "model.ckpt-5.safetensors"),
        "model.ckpt-5",
        "model.ckpt-5: its data file model.ckpt-5.safetensors has no manifest model.ckpt-5.json: "
        "an incomplete checkpoint",
    ),
    "directory-named-like-a-checkpoint": (
        lambda run: (run / "model.ckpt-6").mkdir(),
        "model.ckpt-6",
        "model.ckpt-6: a directory named like a checkpoint, which is two files "
        "(model.ckpt-6.json and model.ckpt-6.safetensors); a restore ignores it",
    ),
    "fifo-named-like-an-older-checkpoint": (
        lambda run: os.mkfifo(run / "model.ckpt-1"),
        "model.ckpt-1",
        "model.ckpt-1: a FIFO named like a checkpoint",
    ),
}


@pytest.mark.parametrize("case", list(ODD_ENTRIES))
def test_ls_and_verify_name_every_entry_named_like_a_checkpoint_file_that_is_no_good_one(
    run: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    make, name, problem = ODD_ENTRIES[case]
    make(run)
    if case == "data-file-without-manifest":
        # A save interrupted between its data file and its manifest: no damage, a
        # restore ignores it; ls and verify note it and exit 0.
        status, out, err = _cli(capsys, "ls", run)
        assert status == 0
        assert f"incomplete (no manifest), ignored by a restore  {name}" in out
        assert err.startswith(f"monitored checkpoint ls: note: {run}/")
        assert problem in err
        status, out, err = _cli(capsys, "verify", run)
        assert (status, err) == (0, "")
        assert [line for line in out.splitlines() if line.startswith("note: ")] == [
            next(line for line in out.splitlines() if problem in line)
        ]
        assert out.splitlines()[-1] == "3 checkpoints checked: all verified"
        return
    status, out, err = _cli(capsys, "ls", run)
    assert status == 1
    row = next(line.split() for line in out.splitlines()[1:] if line.endswith(f" {name}"))
    assert row[-2:] == ["damaged", name]  # neither newest nor kept forever
    assert "newest model.ckpt-4" in [" ".join(line.split()[-2:]) for line in out.splitlines()]
    assert err.startswith(f"monitored checkpoint ls: error: {run}/")
    assert problem in err
    assert err.count("\n") == 1
    rows = {r["name"]: r for r in json.loads(_cli(capsys, "ls", "--json", run)[1])}
    assert rows[name]["problem"] is not None
    assert problem in f"{rows[name]['path']}: {rows[name]['problem']}"
    assert rows[name]["kept_forever"] is None
    assert [n for n, r in rows.items() if r["restored"]] == ["model.ckpt-4"]
    status, out, err = _cli(capsys, "verify", run)
    assert (status, err) == (1, "")
    problems = [line for line in out.splitlines() if line.startswith("problem: ")]
    assert len(problems) == 1
    assert problems[0].startswith(f"problem: {run}/")
    assert problem in problems[0]
    checked = 3 if case.endswith("like-a-checkpoint") or "older" in case else 4
    assert out.splitlines()[-1] == f"{checked} checkpoints checked: 1 problem"


def test_verify_and_ls_name_every_odd_entry_at_once(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = [
        "manifest-not-json",
        "manifest-empty-object",
        "another-checkpoints-manifest",
        "data-file-without-manifest",
        "directory-named-like-a-checkpoint",
        "fifo-named-like-an-older-checkpoint",
    ]
    for case in cases:
        ODD_ENTRIES[case][0](run)
    status, out, err = _cli(capsys, "ls", run)
    assert status == 1
    assert [line.split()[-2] for line in out.splitlines()[1:]] == [
        "damaged",  # 1
        "forever",  # 2
        "-",  # 3
        "newest",  # 4
        "restore",  # 5: a data file without its manifest, "ignored by a restore"
        "damaged",  # 6
        "damaged",  # 7
        "damaged",  # 8
        "damaged",  # 9
    ]
    assert len(err.splitlines()) == len(cases)
    status, out, _ = _cli(capsys, "verify", run)
    assert status == 1
    said = [line for line in out.splitlines() if line.startswith(("problem: ", "note: "))]
    for case in cases:
        assert sum(ODD_ENTRIES[case][2] in line for line in said) == 1, case
    # The data file without its manifest is a note (a restore ignores it), not a problem.
    assert out.splitlines()[-1] == "6 checkpoints checked: 5 problems"


def test_a_kept_checkpoints_manifest_that_is_a_directory_is_named_as_one(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not "the state file lists model.ckpt-3, which has no manifest": it has one, a directory."""
    _replace_with_directory(run / "model.ckpt-3.json")
    refused = f"{run / 'model.ckpt-3.json'} is a directory, not a manifest; refused"
    assert _cli(capsys, "verify", run) == (
        1,
        f"problem: {refused}\n3 checkpoints checked: 1 problem\n",
        "",
    )
    status, out, err = _cli(capsys, "ls", run)
    assert status == 1
    assert out.splitlines()[2].split()[-2:] == ["damaged", "model.ckpt-3"]
    assert err == f"monitored checkpoint ls: error: {refused}\n"


def test_a_flood_of_json_files_of_other_series_costs_a_bounded_number_of_reads(
    run: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from monitored_checkpoint import _inspect

    for i in range(200):
        (run / f"trace{i:03d}-1.json").write_text("{}")
    reads: list[str] = []
    is_ours = _inspect._is_our_manifest

    def counted(store: Any, file: str) -> bool:
        reads.append(file)
        return is_ours(store, file)

    monkeypatch.setattr(_inspect, "_is_our_manifest", counted)
    assert _cli(capsys, "verify", run) == (0, "3 checkpoints checked: all verified\n", "")
    assert len(reads) == 20


def test_a_state_file_that_is_a_fifo_is_named_by_ls_and_verify(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _fifo(run / "checkpoint")
    refused = f"{run / 'checkpoint'} is a FIFO, not a state file; refused"
    status, out, err = _cli(capsys, "ls", run)
    assert status == 1
    assert err == f"monitored checkpoint ls: error: {refused}\n"
    assert out.splitlines()[-1].split()[-2:] == ["newest", "model.ckpt-4"]
    assert _cli(capsys, "verify", run) == (
        1,
        f"problem: {refused}\n3 checkpoints checked: 1 problem\n",
        "",
    )


def test_files_not_named_like_a_checkpoint_file_are_no_problem(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A profiler's timelines, event files (of a host ending in a number), notes, a killed
    save's leftovers: not checkpoints, not listed, not problems."""
    (run / "timeline-100.json").write_text('{"traceEvents": []}')
    (run / "events.out.tfevents.1700000000.worker-7").write_bytes(b"x")
    (run / "notes.txt").write_text("x")
    (run / ".model.ckpt-9.json.tmp-1-abcd1234").write_text("{")
    os.mkfifo(run / "a-fifo")
    (run / "logs").mkdir()
    status, out, err = _cli(capsys, "ls", run)
    assert (status, err) == (0, "")
    assert [line.split()[-1] for line in out.splitlines()[1:]] == [
        "model.ckpt-2",
        "model.ckpt-3",
        "model.ckpt-4",
    ]
    assert _cli(capsys, "verify", run) == (0, "3 checkpoints checked: all verified\n", "")


def test_a_series_whose_data_files_are_all_gone_is_still_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Manifests of ours are checkpoints whatever their series; a damaged one beside them too."""
    Saver().save(_state(), f"{tmp_path}/weights", global_step=5)
    (tmp_path / "weights-5.safetensors").unlink()
    (tmp_path / "checkpoint").unlink()
    (tmp_path / "weights-9.json").write_text("{garbage")
    status, out, _ = _cli(capsys, "verify", tmp_path)
    assert status == 3  # nothing restorable
    problems = [line for line in out.splitlines() if line.startswith("problem: ")]
    assert len(problems) == 2
    assert "weights-5.safetensors: the data file is missing" in problems[0]
    assert "weights-9.json: the manifest is not valid JSON" in problems[1]


#: Ways the newest checkpoint's data file can be no regular file of the right size.
DAMAGED_DATA: dict[str, tuple[Callable[[Path], None], str]] = {
    "fifo": (_fifo, "model.ckpt-4.safetensors is a FIFO, not a regular file; refused"),
    "link-to-dev-zero": (
        lambda path: _replace_with_link(path, "/dev/zero"),
        "model.ckpt-4.safetensors is a symbolic link to /dev/zero, outside",
    ),
    "directory": (_replace_with_directory, "model.ckpt-4.safetensors is a directory"),
    "truncated": (
        lambda path: path.write_bytes(path.read_bytes()[:-8]),
        "the data file model.ckpt-4.safetensors has",
    ),
}


@pytest.mark.parametrize("how", list(DAMAGED_DATA))
def test_a_damaged_newest_of_any_kind_stays_the_newest_and_show_and_diff_say_what_they_use(
    run: Path, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    damage, problem = DAMAGED_DATA[how]
    damage(run / "model.ckpt-4.safetensors")
    status, out, err = _cli(capsys, "ls", run)
    assert status == 1
    lines = out.splitlines()
    assert lines[3].endswith("damaged, newest, skipped by a restore  model.ckpt-4")
    assert lines[2].split()[-2:] == ["restored", "model.ckpt-3"]
    assert problem in err
    note = (
        f"using {run / 'model.ckpt-3'} (step 3), the checkpoint a restore of {run} uses: "
        f"the newest, model.ckpt-4, is skipped as damaged: "
    )
    status, out, err = _cli(capsys, "show", run)
    assert status == 0
    assert out.startswith(f"checkpoint {run / 'model.ckpt-3'}: step 3, ")
    assert err.startswith(f"monitored checkpoint show: note: {note}")
    assert problem in err
    assert err.count("\n") == 1
    status, out, err = _cli(capsys, "show", "--json", "--stats", run)
    assert status == 0
    assert json.loads(out)["step"] == 3  # the note is on stderr, stdout stays JSON
    assert err.startswith(f"monitored checkpoint show: note: {note}")
    status, out, err = _cli(capsys, "show", "--array", "count", run)
    assert (status, out) == (0, "count: int64 ()\n0\n")
    assert err.startswith(f"monitored checkpoint show: note: {note}")
    status, out, err = _cli(capsys, "diff", run, run / "model.ckpt-3")
    assert status == 0  # the same checkpoint: what a restore uses is model.ckpt-3
    assert out.splitlines()[0] == f"a: {run / 'model.ckpt-3'} (step 3)"
    assert out.splitlines()[-1] == "equal"
    assert err.startswith(f"monitored checkpoint diff: note: a: {note}")
    # What a restore really does.
    with pytest.warns(CorruptCheckpointWarning, match="model.ckpt-4"):
        manifest = restore_latest(_state(), run)
    assert manifest is not None
    assert manifest.name == "model.ckpt-3"


def test_show_of_a_directory_none_of_whose_checkpoints_can_be_restored(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for step in (2, 3, 4):
        _fifo(run / f"model.ckpt-{step}.safetensors")
    for argv in (("show", run), ("diff", run / "model.ckpt-2", run)):
        status, out, err = _cli(capsys, *argv)
        assert (status, out) == (2, "")
        assert err == (
            f"monitored checkpoint {argv[0]}: error: no checkpoint of {run} can be restored: "
            f"each is damaged (monitored checkpoint verify {run} names every problem); "
            f"{run / 'model.ckpt-4'}: the data file model.ckpt-4.safetensors cannot be read: "
            f"{run / 'model.ckpt-4.safetensors'} is a FIFO, not a regular file; refused\n"
        )


# -- show -----------------------------------------------------------------------------------------
def test_show_lists_every_array_and_the_plugin_states_from_the_manifest_alone(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The data file is damaged: show of the checkpoint reads its manifest only.
    (run / "model.ckpt-4.safetensors").write_bytes(b"garbage")
    status, out, err = _cli(capsys, "show", run / "model.ckpt-4")
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].startswith(f"checkpoint {run / 'model.ckpt-4'}: step 4, written ")
    assert lines[0].endswith(", format version 2")
    assert [line.split() for line in lines[1:5]] == [
        ["name", "dtype", "shape", "bytes"],
        ["b", "float64", "(3,)", "24"],
        ["count", "int64", "()", "8"],
        ["w", "float32", "(8,", "3)", "96"],
    ]
    assert lines[5] == "3 arrays, 128 bytes"
    assert lines[6] == 'plugin early_stopping: {"state": {"best": 0.5}, "version": 1}'


def test_show_stats_reads_and_verifies_every_array(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = _cli(capsys, "show", "--stats", run / "model.ckpt-3")
    assert status == 0
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:5]}
    assert rows["name"][-4:] == ["min", "max", "mean", "NaN"]
    assert rows["b"][-4:] == ["1", "3", "2", "1"]  # the NaN is counted, not averaged
    assert rows["count"][-4:] == ["0", "0", "0", "0"]
    w = load_variable(run / "model.ckpt-3", "w")
    assert rows["w"][-4:] == [
        f"{w.min():.6g}",
        f"{w.max():.6g}",
        f"{w.mean(dtype=np.float64):.6g}",
        "0",
    ]
    (run / "model.ckpt-3.safetensors").write_bytes(b"garbage")
    status, out, err = _cli(capsys, "show", "--stats", run / "model.ckpt-3")
    assert (status, out) == (2, "")
    assert err.startswith("monitored checkpoint show: error: ")
    assert "model.ckpt-3.safetensors" in err


def test_show_json(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = _cli(capsys, "show", "--json", "--stats", run)
    assert status == 0
    document = json.loads(out)
    assert document["step"] == 4
    assert document["plugins"] == {"early_stopping": {"version": 1, "state": {"best": 0.5}}}
    by_name = {entry["name"]: entry for entry in document["arrays"]}
    assert by_name["b"] == {
        "name": "b",
        "dtype": "float64",
        "shape": [3],
        "bytes": 24,
        "min": 1.0,
        "max": 3.0,
        "mean": 2.0,
        "nan": 1,
    }


def test_show_array_prints_one_array(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = _cli(capsys, "show", "--array", "b", run)
    assert status == 0
    assert out == "b: float64 (3,)\n[ 1., nan,  3.]\n"
    status, out, err = _cli(capsys, "show", "--array", "ww", run)
    assert (status, out) == (2, "")
    assert "holds no array 'ww'; did you mean 'w'?" in err
    status, _, err = _cli(capsys, "show", "--array", "w", "--stats", run)
    assert status == 2
    assert "--array prints one array's values" in err


def test_show_of_something_that_is_no_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nothing = tmp_path / "nothing"
    assert _cli(capsys, "show", nothing) == (
        2,
        "",
        f"monitored checkpoint show: error: {nothing} does not exist: it is no directory, and "
        "no checkpoint (there is no nothing.json beside it)\n",
    )
    assert _cli(capsys, "verify", tmp_path / "nowhere" / "model.ckpt-1") == (
        2,
        "",
        f"monitored checkpoint verify: error: {tmp_path / 'nowhere' / 'model.ckpt-1'} does not "
        f"exist: there is no directory {tmp_path / 'nowhere'}\n",
    )
    nothing.write_text("a file, not a checkpoint")
    assert _cli(capsys, "show", nothing) == (
        2,
        "",
        f"monitored checkpoint show: error: {nothing} is neither a checkpoint (there is no "
        "nothing.json beside it) nor a directory holding one\n",
    )
    status, _, err = _cli(capsys, "show", "bad\0path")
    assert status == 2
    # the NUL printed escaped (test_ckpt_cli_printing.py)
    assert err.startswith("monitored checkpoint show: error: bad\\x00path does not exist")


@pytest.mark.parametrize("suffix", [".json", ".safetensors"])
def test_show_verify_and_diff_take_a_manifests_or_a_data_files_path(
    run: Path, capsys: pytest.CaptureFixture[str], suffix: str
) -> None:
    """What a shell completes to names the checkpoint (``model.ckpt-3.json``)."""
    path = run / f"model.ckpt-3{suffix}"
    status, out, _ = _cli(capsys, "show", path)
    assert status == 0
    assert out.startswith(f"checkpoint {run / 'model.ckpt-3'}: step 3, ")
    assert _cli(capsys, "verify", path) == (0, "1 checkpoint checked: all verified\n", "")
    assert _cli(capsys, "diff", path, run / "model.ckpt-3")[0] == 0
    assert load_variable(path, "w")[0, 0] == 3
    status, out, err = _cli(capsys, "show", run / f"model.ckpt-9{suffix}")
    assert (status, out) == (2, "")
    assert err == (
        f"monitored checkpoint show: error: {run / f'model.ckpt-9{suffix}'} does not exist: it "
        "is no directory, and no checkpoint (there is no model.ckpt-9.json beside it)\n"
    )


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_checkpoint_named_by_path_whose_manifest_is_no_regular_file_says_what_it_is(
    run: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    manifest = run / "model.ckpt-4.json"
    _fifo(manifest) if kind == "fifo" else _replace_with_directory(manifest)
    refused = (
        f"{manifest} is a {'FIFO' if kind == 'fifo' else 'directory'}, not a manifest; refused"
    )
    for path in (run / "model.ckpt-4", manifest):
        assert _cli(capsys, "show", path) == (
            2,
            "",
            f"monitored checkpoint show: error: {refused}\n",
        )
        assert _cli(capsys, "verify", path) == (
            1,
            f"problem: {refused}\n1 checkpoint checked: 1 problem\n",
            "",
        )
    with pytest.raises(CorruptCheckpointError, match="not a manifest; refused"):
        load_variable(run / "model.ckpt-4", "w")


def test_show_array_suggests_names_whatever_their_case_and_lists_a_few(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = _cli(capsys, "show", "--array", "W", run)
    assert (status, out) == (2, "")
    assert err == (
        f"monitored checkpoint show: error: checkpoint {run / 'model.ckpt-4'} (step 4) holds no "
        "array 'W'; did you mean 'w'? (3 arrays: b, count, w)\n"
    )
    status, _, err = _cli(capsys, "show", "--array", "zzz", run)
    assert err.endswith("holds no array 'zzz' (3 arrays: b, count, w)\n")
    many = TrainState({f"layer{i}": np.zeros(1) for i in range(25)}, seed=0)
    Saver().save(many, f"{tmp_path}/many/model.ckpt", global_step=1)
    status, _, err = _cli(capsys, "show", "--array", "Layer7", tmp_path / "many")
    assert status == 2
    assert err.endswith(
        "holds no array 'Layer7'; did you mean 'layer7', 'layer17', 'layer9'? (25 arrays: "
        f"monitored checkpoint show {tmp_path / 'many' / 'model.ckpt-1'})\n"
    )


def test_an_operating_system_error_is_one_line_with_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A directory that is a symbolic link to itself cannot be listed (ELOOP).
    (tmp_path / "loop").symlink_to("loop")
    for command in ("show", "verify"):
        status, out, err = _cli(capsys, command, tmp_path / "loop" / "model.ckpt-1")
        assert (status, out) == (2, "")
        assert err == (
            f"monitored checkpoint {command}: error: OSError: [Errno 40] Too many levels of "
            f"symbolic links: '{tmp_path / 'loop'}'\n"
        )


# -- the Python functions (TF1's list_variables, load_variable) -----------------------------------
def test_load_variable_and_list_variables(run: Path) -> None:
    state = _state()
    assert list_variables(run) == [("b", (3,)), ("count", ()), ("w", (8, 3))]
    w = load_variable(run, "w")
    assert w.dtype == np.float32
    assert w[0, 0] == 4
    np.testing.assert_array_equal(w[1:], state["w"][1:])
    np.testing.assert_array_equal(load_variable(run / "model.ckpt-2", "b"), state["b"])
    with pytest.raises(CheckpointError, match=r"holds no array 'x' \(3 arrays"):
        load_variable(run, "x")
    with pytest.raises(CheckpointNotFoundError):
        load_variable(run / "model.ckpt-9", "w")
    (run / "model.ckpt-4.safetensors").write_bytes(b"garbage")
    with pytest.raises(CorruptCheckpointError, match=r"model\.ckpt-4\.safetensors"):
        load_variable(run, "w")


def test_array_stats_of_every_kind_of_array() -> None:
    assert array_stats(np.array([], np.float32)) == _stats(None, None, None, 0)
    assert array_stats(np.array([np.nan, np.nan])) == _stats(None, None, None, 2)
    assert array_stats(np.array([True, False, True])) == _stats(0, 1, 2 / 3, 0)
    assert array_stats(np.array([-(2**62), 2**62])) == _stats(-(2**62), 2**62, 0.0, 0)
    assert array_stats(np.array([3 + 4j, 0j], np.complex64)) == _stats(0.0, 5.0, 2.5, 0)
    assert array_stats(np.array([np.inf, 1.0, np.nan])) == _stats(1.0, np.inf, np.inf, 1)
    ml_dtypes = pytest.importorskip("ml_dtypes")
    half = np.array([1.5, -2.0], ml_dtypes.bfloat16)
    assert array_stats(half) == _stats(-2.0, 1.5, -0.25, 0)


def _stats(low: Any, high: Any, mean: Any, nan: int) -> ArrayStats:
    return ArrayStats(low, high, mean, nan)


# -- diff -----------------------------------------------------------------------------------------
def test_diff_of_a_checkpoint_and_its_copy_is_equal(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = tmp_path / "copy"
    copy.mkdir()
    for suffix in (".json", ".safetensors"):
        shutil.copy(run / f"model.ckpt-4{suffix}", copy / f"model.ckpt-4{suffix}")
    status, out, err = _cli(capsys, "diff", run, copy / "model.ckpt-4")
    assert (status, err) == (0, "")
    assert out.splitlines()[0] == f"a: {run / 'model.ckpt-4'} (step 4)"
    assert out.splitlines()[-1] == "equal"
    assert [line.split() for line in out.splitlines()[3:6]] == [
        ["b", "0"],
        ["count", "0"],
        ["w", "0"],
    ]


def test_diff_names_each_difference_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = _state(), _state()
    a["only_a"] = np.zeros(2)
    b["only_b"] = np.zeros(2)
    b["count"] = np.array(0, dtype=np.int32)  # dtype differs
    b["w"] = b["w"].copy()
    b["w"][2, 1] += 0.25
    b["b"] = np.array([1.0, 2.0, 3.0])  # a NaN on one side only
    b.rng.random()
    Saver().save(a, f"{tmp_path}/a/model.ckpt", plugin_states={"p": {"x": 1}})
    Saver().save(b, f"{tmp_path}/b/model.ckpt", global_step=5)
    status, out, err = _cli(capsys, "diff", tmp_path / "a", tmp_path / "b")
    assert (status, err) == (1, "")
    lines = out.splitlines()
    assert "only in a: only_a" in lines
    assert "only in b: only_b" in lines
    assert "differs in dtype or shape: count: int64 () in a, int32 () in b" in lines
    rows = {line.split()[0]: line.split()[1:] for line in lines if line.startswith(("b ", "w "))}
    assert rows["b"] == ["inf", "differs"]
    assert rows["w"] == ["0.25", "differs"]
    assert "the global step differs: 0 in a, 5 in b" in lines
    assert "the RNG state differs" in lines
    assert "plugin 'p' has a state in a only" in lines
    assert lines[-1] == "different"


def test_diff_says_which_checkpoint_holds_a_plugin_state_the_other_lacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = _state()
    Saver().save(state, f"{tmp_path}/a/model.ckpt", plugin_states={"p": {"x": 1}, "q": {"x": 1}})
    Saver().save(state, f"{tmp_path}/b/model.ckpt", plugin_states={"mlflow_run": {}, "q": {"x": 2}})
    status, out, _ = _cli(capsys, "diff", tmp_path / "a", tmp_path / "b")
    assert status == 1
    assert out.splitlines()[-4:] == [
        "plugin 'mlflow_run' has a state in b only",
        "plugin 'p' has a state in a only",
        "the state of plugin 'q' differs",
        "different",
    ]


def test_diff_sees_a_sign_of_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = TrainState({"z": np.array([0.0])}, seed=0)
    b = TrainState({"z": np.array([-0.0])}, seed=0)
    Saver().save(a, f"{tmp_path}/a/model.ckpt")
    Saver().save(b, f"{tmp_path}/b/model.ckpt")
    status, out, _ = _cli(capsys, "diff", tmp_path / "a", tmp_path / "b")
    assert status == 1
    assert out.splitlines()[3].split() == ["z", "0", "(bits", "differ)"]


def test_diff_of_a_missing_or_damaged_checkpoint_exits_2(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = _cli(capsys, "diff", run, run / "model.ckpt-9")
    assert (status, out) == (2, "")
    assert err.startswith("monitored checkpoint diff: error: ")
    (run / "model.ckpt-3.safetensors").write_bytes(b"garbage")
    status, _, err = _cli(capsys, "diff", run, run / "model.ckpt-3")
    assert status == 2
    assert "model.ckpt-3.safetensors" in err


# -- verify ---------------------------------------------------------------------------------------
def test_verify_a_good_directory_and_one_checkpoint(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _cli(capsys, "verify", run) == (0, "3 checkpoints checked: all verified\n", "")
    assert _cli(capsys, "verify", run / "model.ckpt-3") == (
        0,
        "1 checkpoint checked: all verified\n",
        "",
    )


def test_verify_names_every_problem_and_exits_3_when_nothing_is_restorable(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = bytearray((run / "model.ckpt-2.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (run / "model.ckpt-2.safetensors").write_bytes(bytes(data))
    manifest = json.loads((run / "model.ckpt-3.json").read_text())
    manifest["step"] = 30
    (run / "model.ckpt-3.json").write_text(json.dumps(manifest))
    (run / "model.ckpt-4.safetensors").unlink()
    status, out, err = _cli(capsys, "verify", run)
    assert (status, err) == (3, "")
    assert "nothing restorable: no checkpoint of this directory verifies" in out
    problems = [line for line in out.splitlines() if line.startswith("problem: ")]
    assert len(problems) == 3
    assert "model.ckpt-2.safetensors: checksum mismatch" in problems[0]
    assert "model.ckpt-3.json: the manifest's checksum" in problems[1]
    assert "model.ckpt-4.safetensors: the data file is missing" in problems[2]
    assert out.splitlines()[-1] == "3 checkpoints checked: 3 problems"


def test_verify_checks_the_state_file(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (run / "model.ckpt-3.json").unlink()
    (run / "model.ckpt-3.safetensors").unlink()
    status, out, _ = _cli(capsys, "verify", run)
    assert status == 1
    assert f"problem: {run / 'checkpoint'} lists model.ckpt-3, which has no manifest" in out
    (run / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-4"\n')
    status, out, _ = _cli(capsys, "verify", run)
    assert status == 1
    assert "was not written by monitored-checkpoint" in out


def test_verify_of_an_empty_or_missing_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = _cli(capsys, "verify", tmp_path)
    assert status == 1
    assert f"problem: {tmp_path} holds no checkpoint" in out
    status, out, err = _cli(capsys, "verify", tmp_path / "missing")
    assert (status, out) == (2, "")
    assert "missing does not exist: it is no directory, and no checkpoint" in err


# -- hostile directories ----------------------------------------------------------------------------
#: Crafted directories where verify finds no problem: nothing is wrong with them.
CLEAN = {"data-file-link-inside", "deeply-nested-unrelated-json"}


@pytest.mark.parametrize("case", list(hostile.CASES), ids=list(hostile.CASES))
def test_hostile_directories_get_the_plugins_error_never_a_traceback_or_a_hang(
    scene: Any, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    outside, before = hostile._prepare(scene, hostile.CASES[case])
    newest = scene.run / "model.ckpt-3"
    for argv, allowed in (
        (("ls", scene.run), {0, 1}),
        (("ls", "--json", scene.run), {0, 1}),
        (("show", scene.run), {0, 2}),
        (("show", newest), {0, 2}),
        (("show", "--stats", scene.run), {0, 2}),
        (("show", "--array", "w", newest), {0, 2}),
        (("diff", scene.run / "model.ckpt-1", scene.run), {0, 1, 2}),
        (("verify", scene.run), {0} if case in CLEAN else {1, 3}),
    ):
        status, out, err = _cli(capsys, *argv)
        assert status in allowed, (argv, status, out, err)
        assert "Traceback" not in out + err
        for line in err.splitlines():
            assert line.startswith(
                (
                    f"monitored checkpoint {argv[0]}: error: ",
                    f"monitored checkpoint {argv[0]}: note: ",
                )
            ), (argv, err)
        if status:
            assert err or argv[0] in ("verify", "diff"), argv
    hostile._check_files(scene, outside, before, written=-1)


# -- the real command -----------------------------------------------------------------------------
def test_the_monitored_script_runs_the_checkpoint_commands(run: Path) -> None:
    script = Path(sys.executable).with_name("monitored")
    done = subprocess.run(
        [str(script), "checkpoint", "ls", "--json", str(run)],
        capture_output=True,
        text=True,
        timeout=GUARD_SECS,
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert [row["step"] for row in json.loads(done.stdout)] == [2, 3, 4]
    os.mkfifo(run / "model.ckpt-4.safetensors.fifo")
    (run / "model.ckpt-4.safetensors").unlink()
    (run / "model.ckpt-4.safetensors.fifo").rename(run / "model.ckpt-4.safetensors")
    # Named by path: the checkpoint itself, not the one a restore of the directory uses.
    done = subprocess.run(
        [str(script), "checkpoint", "show", "--stats", str(run / "model.ckpt-4")],
        capture_output=True,
        text=True,
        timeout=GUARD_SECS,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == (
        f"monitored checkpoint show: error: {run / 'model.ckpt-4.safetensors'} is a FIFO, "
        "not a regular file; refused\n"
    )
    done = subprocess.run(
        [str(script), "checkpoint", "verify", str(run)],
        capture_output=True,
        text=True,
        timeout=GUARD_SECS,
    )
    assert done.returncode == 1
    assert "model.ckpt-4.safetensors is a FIFO" in done.stdout


@pytest.mark.parametrize("subcommand", ["show", "ls"])
def test_a_reader_that_goes_away_ends_a_checkpoint_command_quietly(
    run: Path, subcommand: str
) -> None:
    """``monitored checkpoint show DIR | head -1``: no "error: BrokenPipeError", status 1.

    The pipe's read end is closed before the command writes (as ``head`` closes it
    after its first line), so the write fails whatever the pipe's buffer size.
    """
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [Path(sys.executable).with_name("monitored"), "checkpoint", subcommand, run],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=GUARD_SECS,
        )
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (1, "")


# -- what a new user types ------------------------------------------------------------------------
def test_show_path_name_prints_the_array_as_array_does(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    by_option = _cli(capsys, "show", run, "--array", "b")
    assert by_option[0] == 0
    assert _cli(capsys, "show", run, "b") == by_option
    status, _, err = _cli(capsys, "show", run, "b", "--array", "w")
    assert status == 2
    assert "two arrays asked for: b and --array w" in err


@pytest.mark.parametrize("suffix", ["", ".json", ".safetensors"])
def test_ls_of_a_checkpoint_says_it_is_one_and_what_to_type(
    run: Path, capsys: pytest.CaptureFixture[str], suffix: str
) -> None:
    path = f"{run}/model.ckpt-4{suffix}"
    status, out, err = _cli(capsys, "ls", path)
    assert (status, out) == (2, "")
    assert f"{path} is a checkpoint, not a directory of them" in err
    assert f"'monitored checkpoint show {path}' lists its arrays" in err
    assert f"'monitored checkpoint ls {run}' the checkpoints beside it" in err


def test_a_mistyped_subcommand_gets_a_did_you_mean(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = _cli(capsys, "lss", run)
    assert status == 2
    assert "invalid choice: 'lss'" in err
    assert err.rstrip().endswith("did you mean 'ls'?")


def test_a_mistyped_checkpoint_command_gets_a_did_you_mean(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["checkpont", "ls", str(run)])
    assert exited.value.code == 2
    assert capsys.readouterr().err.rstrip().endswith("did you mean 'checkpoint'?")
