"""A checkpoint directory someone else wrote can at worst be refused.

Each case crafts a variant of a real directory (three good checkpoints, steps
1 to 3) and restores it as a user would: ``restore_latest``, ``latest_checkpoint``
+ ``restore``, and a ``MonitoredTrainingSession`` on an empty and on a filled
state. Every case asserts: nothing outside the directory changed, no pickle or
``numpy.load`` ran, no hang (each restore runs in a thread with a generous
guard), bounded memory (traced peak), the plugin's own error or the newest good
checkpoint with a warning, the good checkpoints and (after a failure) the
user's state unchanged. Property-based fuzzing of the state file, the manifest
and the safetensors header closes the file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import shutil
import struct
import tempfile
import threading
import tracemalloc
import warnings
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from monitored import MonitoredSession, MonitoredTrainingSession, Scaffold, TrainState
from monitored_checkpoint import (
    CheckpointDigestError,
    CheckpointError,
    CheckpointSaverHook,
    CheckpointWriteError,
    CorruptCheckpointError,
    CorruptCheckpointWarning,
    NoValidCheckpointError,
    Saver,
    UnsafeCheckpointError,
    checkpoint_digest,
    latest_checkpoint,
    restore,
    restore_latest,
)
from monitored_checkpoint import _saver as saver_module
from monitored_checkpoint._format import DIGEST_FIELD, MAX_MANIFEST_BYTES, manifest_digest
from monitored_checkpoint._saver import MAX_STATE_FILE_BYTES

GOOD_STEPS = (1, 2, 3)
MARKER = "# monitored-checkpoint state file (format 1)"
#: Generous: a restore here takes milliseconds; only a hang gets near it.
GUARD_SECS = 60.0
#: The directory holds kilobytes; a restore that allocates more than this trusted a size.
MEMORY_BOUND = 64 << 20


# -- the scene --------------------------------------------------------------------------------------
def _state(seed: int = 0) -> TrainState:
    rng = np.random.default_rng(seed)
    return TrainState(
        {
            "w": rng.standard_normal((8, 3)).astype(np.float32),
            "b": rng.standard_normal(3),
            "count": np.array(seed, dtype=np.int64),
        },
        seed=seed,
    )


def _filled() -> TrainState:
    """A user's state with the checkpoint's entries, holding values of its own."""
    state = TrainState({"w": np.full((8, 3), 7, np.float32), "b": np.full(3, 7.0)}, seed=9)
    state["count"] = np.array(7, dtype=np.int64)
    state.global_step = 77
    return state


def _init(state: TrainState) -> None:
    state["w"] = np.zeros((8, 3), np.float32)
    state["b"] = np.zeros(3)
    state["count"] = np.array(0, dtype=np.int64)


def _tree(root: Path) -> dict[str, bytes | str]:
    """Every entry under ``root``: file bytes, link targets, kinds of special files."""
    found: dict[str, bytes | str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            key = str(path.relative_to(root))
            if path.is_symlink():
                found[key] = "link -> " + os.readlink(path)
            elif path.is_dir():
                found[key] = "dir"
            elif path.is_file() and path.stat().st_size > 1 << 20:
                found[key] = f"big file of {path.stat().st_size} bytes, {path.stat().st_mtime_ns}"
            elif path.is_file():
                found[key] = path.read_bytes()
            else:
                found[key] = "special"
    return found


@dataclass
class Scene:
    """A good checkpoint directory ``run`` and, beside it, ``outside`` (not to be touched)."""

    run: Path
    outside: Path
    saved: dict[int, dict[str, np.ndarray]]
    rng: dict[int, dict[str, Any]]

    def doc(self, step: int) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads(self.manifest(step).read_text())
        return loaded

    def manifest(self, step: int) -> Path:
        return self.run / f"model.ckpt-{step}.json"

    def data(self, step: int) -> Path:
        return self.run / f"model.ckpt-{step}.safetensors"

    def put(self, step: int, doc: dict[str, Any], *, reseal: bool = True) -> None:
        """Write a manifest; ``reseal``: with a valid checksum, so other checks must catch it."""
        if reseal:
            doc[DIGEST_FIELD] = manifest_digest(doc)
        self.manifest(step).write_text(json.dumps(doc))

    def state_file(self, newest: str, names: list[str] | None = None) -> None:
        lines = [MARKER, f"model_checkpoint_path: {json.dumps(newest)}"]
        lines += [f"all_model_checkpoint_paths: {json.dumps(n)}" for n in (names or [newest])]
        (self.run / "checkpoint").write_text("\n".join(lines) + "\n")


def _make_scene(root: Path) -> Scene:
    run, outside = root / "run", root / "outside"
    state = _state()
    saved: dict[int, dict[str, np.ndarray]] = {}
    rngs: dict[int, dict[str, Any]] = {}
    saver = Saver(max_to_keep=5)
    for step in GOOD_STEPS:
        state.global_step = step
        state["w"][0, 0] = step
        state.rng.random()
        saver.save(state, f"{run}/model.ckpt")
        saved[step] = {n: np.array(a, copy=True) for n, a in state.items()}
        rngs[step] = state.rng_state
    # Outside: a real checkpoint of ours at step 50, files a rotation must never
    # delete, and a copy of a good data file (a link to it must still be refused).
    other = _state(5)
    other.global_step = 50
    Saver().save(other, f"{outside}/model.ckpt")
    (outside / "victim.json").write_text('{"mine": true}')
    (outside / "victim.safetensors").write_bytes(b"precious")
    shutil.copy(run / "model.ckpt-3.safetensors", outside / "copy-3.safetensors")
    (outside / "checkpoint-elsewhere").write_text(
        f'{MARKER}\nmodel_checkpoint_path: "model.ckpt-2"\n'
    )
    return Scene(run, outside, saved, rngs)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Scene:
    """Made once per module; each test works on a copy."""
    return _make_scene(tmp_path_factory.mktemp("hostile-template"))


def _copy_scene(template: Scene, root: Path) -> Scene:
    shutil.copytree(template.run, root / "run", symlinks=True)
    shutil.copytree(template.outside, root / "outside", symlinks=True)
    return Scene(root / "run", root / "outside", template.saved, template.rng)


@pytest.fixture
def scene(template: Scene, tmp_path: Path) -> Scene:
    return _copy_scene(template, tmp_path)


@pytest.fixture(autouse=True)
def nothing_executes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Restoring never unpickles or loads ``.npy``: no code can come from the directory."""

    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a checkpoint restore must not unpickle anything")

    for module, name in ((pickle, "load"), (pickle, "loads"), (np, "load")):
        monkeypatch.setattr(module, name, forbidden)


# -- guards ---------------------------------------------------------------------------------------
def _guarded(fn: Callable[[], Any]) -> Any:
    """``fn()`` in a thread: a hang fails the test instead of blocking the suite."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(GUARD_SECS)
    assert not thread.is_alive(), f"restore hung (still running after {GUARD_SECS} s)"
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


@dataclass
class Outcome:
    step: int | None  # restored step, None for a fresh start
    error: BaseException | None
    warned: list[str]
    peak: int


def _attempt(fn: Callable[[], Any]) -> Outcome:
    """Run a restore under every guard; only the plugin's own errors may come out."""
    tracemalloc.start()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                value = _guarded(fn)
                error = None
            except CheckpointError as exc:
                value, error = None, exc
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    for warning in caught:
        assert issubclass(warning.category, CorruptCheckpointWarning), warning
    assert peak < MEMORY_BOUND, f"restore allocated {peak} bytes"
    step = getattr(value, "step", value)
    return Outcome(step, error, [str(w.message) for w in caught], peak)


def _assert_restored(scene: Scene, state: TrainState, step: int) -> None:
    """``state`` holds exactly the good checkpoint of ``step``: arrays, step, RNG."""
    assert state.global_step == step
    for name, array in scene.saved[step].items():
        assert state[name].tobytes() == array.tobytes(), name
    assert state.rng_state == scene.rng[step]


def _assert_unchanged(state: TrainState, before: TrainState) -> None:
    assert state.global_step == before.global_step
    assert set(state) == set(before)
    for name in before:
        assert state[name].tobytes() == before[name].tobytes(), name
    assert state.rng_state == before.rng_state


# -- the crafted variants -------------------------------------------------------------------------
Craft = Callable[[Scene], None]


def _edit(step: int, change: Callable[[dict[str, Any]], None], *, reseal: bool = True) -> Craft:
    def craft(scene: Scene) -> None:
        doc = scene.doc(step)
        change(doc)
        scene.put(step, doc, reseal=reseal)

    return craft


def _raw_manifest(step: int, replace: Callable[[str], str]) -> Craft:
    def craft(scene: Scene) -> None:
        scene.manifest(step).write_text(replace(scene.manifest(step).read_text()))

    return craft


def _state_names(newest: Callable[[Scene], str]) -> Craft:
    def craft(scene: Scene) -> None:
        name = newest(scene)
        scene.state_file(name, ["model.ckpt-1", "model.ckpt-2", name])

    return craft


def _set(path: tuple[str, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return change


def _point_at(file: str) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        [info] = doc["files"].values()
        doc["files"] = {file: info}
        for entry in doc["arrays"].values():
            entry["file"] = file

    return change


def _fifo(which: str) -> Craft:
    def craft(scene: Scene) -> None:
        path = scene.run / which
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
        os.mkfifo(path)

    return craft


def _directory_instead(which: str) -> Craft:
    def craft(scene: Scene) -> None:
        (scene.run / which).unlink()
        (scene.run / which).mkdir()
        (scene.run / which / "x").write_text("x")

    return craft


def _link(which: str, target: Callable[[Scene], str | Path]) -> Craft:
    def craft(scene: Scene) -> None:
        path = scene.run / which
        path.unlink()
        path.symlink_to(target(scene))

    return craft


def _sparse(which: str, size: int, head: bytes) -> Craft:
    def craft(scene: Scene) -> None:
        path = scene.run / which
        path.write_bytes(head)
        os.truncate(path, size)

    return craft


def _copy_data_2_over_3(scene: Scene) -> None:
    shutil.copy(scene.data(2), scene.data(3))
    doc, older = scene.doc(3), scene.doc(2)
    doc["files"] = {"model.ckpt-3.safetensors": older["files"]["model.ckpt-2.safetensors"]}
    scene.put(3, doc)


def _downgrade_to_v1(scene: Scene) -> None:
    doc = scene.doc(3)
    doc["format_version"] = 1
    del doc[DIGEST_FIELD]
    doc["rng"] = scene.doc(1)["rng"]
    scene.put(3, doc, reseal=False)


def _inside_link(scene: Scene) -> None:
    (scene.run / "blobs").mkdir()
    scene.data(3).rename(scene.run / "blobs" / "3.safetensors")
    scene.data(3).symlink_to(Path("blobs", "3.safetensors"))


def _deep(text: str) -> str:
    return text.replace('"plugins": {}', '"plugins": {"x": ' + "[" * 100_000 + "]" * 100_000 + "}")


@dataclass(frozen=True)
class Case:
    craft: Craft
    #: The step ``restore_latest`` restores (None: a fresh start).
    expect: int | None
    #: Whether a CorruptCheckpointWarning must say why a checkpoint or file was skipped.
    warns: bool = True
    #: A directory sits where the session's next save must write: that save fails
    #: (``CheckpointWriteError`` naming it) after a good restore.
    blocks_next_save: bool = False


CASES: dict[str, Case] = {
    # 1. names that escape the directory
    "state-file-absolute-name": Case(
        _state_names(lambda s: str(s.outside / "model.ckpt-50")), expect=3
    ),
    "state-file-dotdot-name": Case(_state_names(lambda s: "../outside/model.ckpt-50"), expect=3),
    "state-file-dev-stdin": Case(_state_names(lambda s: "/dev/stdin"), expect=3),
    "manifest-data-file-etc-passwd": Case(_edit(3, _point_at("/etc/passwd")), expect=2),
    "manifest-data-file-dotdot": Case(
        _edit(3, _point_at("../outside/victim.safetensors")), expect=2
    ),
    # 2. hangs and unbounded reads
    "data-file-fifo": Case(_fifo("model.ckpt-3.safetensors"), expect=2),
    "manifest-fifo": Case(_fifo("model.ckpt-3.json"), expect=2),
    "state-file-fifo": Case(_fifo("checkpoint"), expect=3, warns=False),
    "data-file-link-to-dev-zero": Case(_link("model.ckpt-3.safetensors", lambda s: "/dev/zero"), 2),
    "state-file-1gb": Case(_sparse("checkpoint", 1 << 30, MARKER.encode() + b"\n"), expect=3),
    "manifest-1gb": Case(_sparse("model.ckpt-3.json", 1 << 30, b'{"format": "'), expect=2),
    # 3. sizes and types trusted before they are checked
    "shape-2**33": Case(_edit(3, _set(("arrays", "w", "shape"), [2**33])), expect=2),
    "extra-entry-2**40": Case(
        _edit(
            3,
            _set(
                ("arrays", "zz"),
                {
                    "dtype": "float32",
                    "shape": [2**40],
                    "module": "numpy",
                    "file": "model.ckpt-3.safetensors",
                },
            ),
        ),
        expect=2,
    ),
    "negative-shape": Case(_edit(3, _set(("arrays", "w", "shape"), [-8, -3])), expect=2),
    "overflowing-shape": Case(_edit(3, _set(("arrays", "w", "shape"), [2**70, 2**70])), 2),
    "float-shape": Case(_edit(3, _set(("arrays", "w", "shape"), [8.0, 3])), expect=2),
    "object-dtype": Case(_edit(3, _set(("arrays", "w", "dtype"), "object")), expect=2),
    "rng-array-dtype-S2000000000": Case(
        _edit(3, _set(("rng", "state"), {"__ndarray__": "S2000000000", "data": []})), expect=2
    ),
    "rng-array-too-long": Case(
        _edit(3, _set(("rng", "state"), {"__ndarray__": "uint64", "data": [1] * 70_000})), 2
    ),
    # 4. raw exceptions instead of the plugin's errors
    "deeply-nested-manifest": Case(_raw_manifest(3, _deep), expect=2),
    "deeply-nested-unrelated-json": Case(
        lambda s: (s.run / "notes-7.json").write_text("[" * 100_000 + "]" * 100_000),
        expect=3,
        warns=False,
    ),
    "5000-digit-step": Case(
        _raw_manifest(3, lambda t: t.replace('"step": 3', '"step": 1' + "0" * 5000)), expect=2
    ),
    "state-file-nul-byte": Case(_state_names(lambda s: "model.ckpt-2\u0000.x"), expect=3),
    "state-file-over-long-name": Case(_state_names(lambda s: "m" * 300 + "-2"), expect=3),
    "manifest-over-long-name": Case(_edit(3, _point_at("m" * 300)), expect=2),
    "data-file-is-a-directory": Case(
        _directory_instead("model.ckpt-3.safetensors"), expect=2, blocks_next_save=True
    ),
    "manifest-is-a-directory": Case(
        _directory_instead("model.ckpt-3.json"), expect=2, blocks_next_save=True
    ),
    "plugin-state-not-an-object": Case(_edit(3, _set(("plugins",), {"counter": 5})), 2),
    "rng-state-wrong-type": Case(_edit(3, _set(("rng", "state"), "x")), expect=2),
    "rng-state-missing": Case(_edit(3, _set(("rng",), {"bit_generator": "PCG64"})), expect=2),
    "rng-unknown-generator": Case(_edit(3, _set(("rng", "bit_generator"), "os.system")), 2),
    "created-beyond-float": Case(_edit(3, _set(("created",), 10**400)), expect=2),
    "crc-not-hex": Case(
        _edit(3, _set(("files", "model.ckpt-3.safetensors", "crc32"), "zzzzzzzz")), 2
    ),
    # 5. a manifest that lies
    "step-edited-5-to-5000": Case(_edit(3, _set(("step",), 5000), reseal=False), expect=2),
    "step-edited-and-resealed": Case(_edit(3, _set(("step",), 5000)), expect=2),
    "rng-edited": Case(_edit(3, _set(("rng", "state", "state"), 1), reseal=False), 2),
    "newest-points-at-older-data-file": Case(
        _edit(3, _point_at("model.ckpt-2.safetensors")), expect=2
    ),
    "older-data-file-copied-over-newest": Case(_copy_data_2_over_3, expect=2),
    "downgraded-to-format-1": Case(_downgrade_to_v1, expect=2),
    # 7. false alarms
    "random-bytes-state-file": Case(
        lambda s: (s.run / "checkpoint").write_bytes(os.urandom(300)), expect=3
    ),
    "tensorflow-state-file-beside-ours": Case(
        lambda s: (s.run / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-2"\n'),
        expect=3,
    ),
    # 8. links
    "data-file-link-inside": Case(_inside_link, expect=3, warns=False),
    "data-file-link-outside-identical": Case(
        _link("model.ckpt-3.safetensors", lambda s: s.outside / "copy-3.safetensors"), 2
    ),
    "state-file-link-outside": Case(
        _link("checkpoint", lambda s: s.outside / "checkpoint-elsewhere"), expect=3
    ),
    # every checkpoint lies: refused, not a fresh start
    "every-manifest-lies": Case(
        lambda s: [_edit(n, _set(("step",), 99), reseal=False)(s) for n in GOOD_STEPS], None
    ),
}


def _prepare(scene: Scene, case: Case) -> tuple[dict[str, bytes | str], dict[str, bytes | str]]:
    case.craft(scene)
    return _tree(scene.outside), _tree(scene.run)


def _check_files(scene: Scene, outside: dict[str, Any], run: dict[str, Any], written: int) -> None:
    """Outside untouched; inside, only the state file and checkpoint ``written`` may change."""
    assert _tree(scene.outside) == outside, "something outside the directory changed"
    after = _tree(scene.run)
    may_change = {"checkpoint", f"model.ckpt-{written}.json", f"model.ckpt-{written}.safetensors"}
    for name, content in run.items():
        if name not in may_change:
            assert after.get(name) == content, f"{name} changed"


# -- restore_latest ---------------------------------------------------------------------------------
@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
@pytest.mark.parametrize("filled", [False, True], ids=["empty", "filled"])
def test_restore_latest_refuses_or_falls_back(scene: Scene, case: Case, filled: bool) -> None:
    outside, run = _prepare(scene, case)
    state = _filled() if filled else TrainState(seed=9)
    before = _filled() if filled else TrainState(seed=9)
    result = _attempt(lambda: restore_latest(state, scene.run))
    if case.expect is None:
        assert isinstance(result.error, NoValidCheckpointError), result
        _assert_unchanged(state, before)
    else:
        assert result.error is None, result.error
        assert result.step == case.expect
        _assert_restored(scene, state, case.expect)
        assert bool(result.warned) == case.warns, result.warned
    _check_files(scene, outside, run, written=-1)


def test_the_warning_and_error_name_the_file_and_the_problem(scene: Scene) -> None:
    CASES["manifest-data-file-etc-passwd"].craft(scene)
    with pytest.warns(CorruptCheckpointWarning, match=r"model\.ckpt-3\.json.*exactly") as caught:
        restore_latest(TrainState(), scene.run)
    assert "bytes" not in str(caught[0].message), "the file outside was not even looked at"
    _fifo("model.ckpt-2.safetensors")(scene)
    with pytest.raises(UnsafeCheckpointError, match=r"model\.ckpt-2\.safetensors is a FIFO"):
        restore(TrainState(), scene.run / "model.ckpt-2")


def test_one_way_to_open_the_store_refuses_through_the_core_opener(scene: Scene) -> None:
    """Issue 25 §7: the store has no opener of its own; the core's refusal is the cause."""
    from monitored import UnsafeFileError

    _fifo("model.ckpt-2.safetensors")(scene)
    with pytest.raises(UnsafeCheckpointError, match="is a FIFO, not a regular file") as info:
        _guarded(lambda: restore(TrainState(), scene.run / "model.ckpt-2"))
    assert isinstance(info.value.__cause__, UnsafeFileError)
    (scene.run / "model.ckpt-3.json").unlink()
    with open(scene.run / "model.ckpt-3.json", "wb") as file:
        file.truncate(MAX_MANIFEST_BYTES + 1)  # sparse: claimed, never read
    with pytest.raises(UnsafeCheckpointError, match="more than the .* a manifest may have"):
        restore(TrainState(), scene.run / "model.ckpt-3")


# -- latest_checkpoint + restore --------------------------------------------------------------------
@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_latest_checkpoint_and_restore_are_confined(scene: Scene, case: Case) -> None:
    outside, run = _prepare(scene, case)
    state, before = _filled(), _filled()
    path = _guarded(lambda: latest_checkpoint(scene.run))
    assert path is not None
    assert os.path.dirname(path) == str(scene.run), "latest_checkpoint left the directory"
    result = _attempt(lambda: restore(state, path))
    if result.error is None:
        assert result.step in GOOD_STEPS
        _assert_restored(scene, state, result.step)
    else:
        assert isinstance(result.error, CorruptCheckpointError), result.error
        _assert_unchanged(state, before)
    _check_files(scene, outside, run, written=-1)


# -- a training session, as a user runs it -----------------------------------------------------------
def _train_one_step(directory: Path, state: TrainState) -> list[int]:
    seen: list[int] = []

    def step(s: TrainState) -> None:
        seen.append(s.global_step)
        s.global_step += 1

    async def main() -> None:
        async with MonitoredTrainingSession(
            state,
            checkpoint_dir=str(directory),
            save_checkpoint_steps=1,
            scaffold=Scaffold(init_fn=_init),
            log_step_count_steps=None,
        ) as sess:
            await sess.run(step)

    anyio.run(main)
    return seen


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
@pytest.mark.parametrize("filled", [False, True], ids=["empty", "filled"])
def test_a_session_resumes_from_the_newest_good_checkpoint(
    scene: Scene, case: Case, filled: bool
) -> None:
    outside, run = _prepare(scene, case)
    state = _filled() if filled else TrainState(seed=9)
    before = _filled()
    result = _attempt(lambda: _train_one_step(scene.run, state))
    if case.expect is None:
        assert isinstance(result.error, NoValidCheckpointError), result
        if filled:
            _assert_unchanged(state, before)
        _check_files(scene, outside, run, written=-1)
        return
    if case.blocks_next_save:
        assert isinstance(result.error, CheckpointWriteError), result
        assert "model.ckpt-3" in str(result.error)
        assert state.global_step == case.expect + 1, "it resumed from the expected step"
        _check_files(scene, outside, run, written=case.expect + 1)
        return
    assert result.error is None, result.error
    assert result.step == [case.expect], "the session did not resume from the expected step"
    assert bool(result.warned) == case.warns, result.warned
    assert state.global_step == case.expect + 1
    _check_files(scene, outside, run, written=case.expect + 1)
    assert not (scene.run / "model.ckpt-5000.json").exists()


def test_a_plugin_state_of_the_wrong_layout_names_the_plugin_and_falls_back(scene: Scene) -> None:
    _edit(3, _set(("plugins",), {"counter": {"version": "one", "state": []}}))(scene)
    with pytest.warns(CorruptCheckpointWarning, match=r"model\.ckpt-3.*plugin 'counter'"):
        manifest = restore_latest(TrainState(), scene.run, session_plugin_states=True)
    assert manifest is not None
    assert manifest.step == 2


# -- 1. rotation stays inside and deletes only what is ours ------------------------------------------
def test_rotation_never_deletes_outside_or_foreign_files(scene: Scene) -> None:
    (scene.run / "notes-1.json").write_text('{"not": "ours"}')
    (scene.run / "notes-1.safetensors").write_bytes(b"\x08" + b"\x00" * 7 + b'{"x": 1} ')
    outside = _tree(scene.outside)
    names = [
        str(scene.outside / "victim"),
        "../outside/victim",
        "notes-1",
        "model.ckpt-1",
        "model.ckpt-2",
        "model.ckpt-3",
    ]
    scene.state_file("model.ckpt-3", names)
    hook = CheckpointSaverHook(str(scene.run), save_steps=1, saver=Saver(max_to_keep=1))

    async def main() -> None:
        async with MonitoredSession(TrainState(seed=9), hooks=[hook]) as sess:
            for _ in range(3):
                await sess.run(lambda s: setattr(s, "global_step", s.global_step + 1))

    with pytest.warns(CorruptCheckpointWarning, match="not a plain file name"):
        anyio.run(main)
    assert _tree(scene.outside) == outside
    assert (scene.run / "notes-1.json").exists()
    assert (scene.run / "notes-1.safetensors").exists()


def test_rotation_of_a_state_file_listing_foreign_plain_names_spares_them(scene: Scene) -> None:
    (scene.run / "notes-1.json").write_text('{"not": "ours"}')
    (scene.run / "notes-1.safetensors").write_bytes(b"precious")
    scene.state_file("model.ckpt-3", ["notes-1", "model.ckpt-1", "model.ckpt-2", "model.ckpt-3"])
    saver = Saver(max_to_keep=1)
    state = _state()
    for step in (4, 5):
        state.global_step = step
        saver.save(state, f"{scene.run}/model.ckpt")
    assert (scene.run / "notes-1.json").read_text() == '{"not": "ours"}'
    assert (scene.run / "notes-1.safetensors").read_bytes() == b"precious"
    # Listed without timestamps, none of them was written by a rotating saver:
    # as TF1's CheckpointManager, the saver tracks (and deletes) none of them.
    assert scene.manifest(1).exists()
    assert not (scene.run / "model.ckpt-4.json").exists(), "what it saved itself is rotated"


def test_rotation_of_a_state_file_with_timestamps_spares_foreign_plain_names(
    scene: Scene,
) -> None:
    (scene.run / "notes-1.json").write_text('{"not": "ours"}')
    (scene.run / "notes-1.safetensors").write_bytes(b"precious")
    scene.state_file("model.ckpt-3", ["notes-1", "model.ckpt-1", "model.ckpt-2", "model.ckpt-3"])
    with (scene.run / "checkpoint").open("a") as file:
        file.write("".join(f"all_model_checkpoint_timestamps: {t}\n" for t in (2.0, 3.0, 4.0, 5.0)))
        file.write("last_preserved_timestamp: 1.0\n")
    saver = Saver(max_to_keep=1)
    state = _state()
    for step in (4, 5):
        state.global_step = step
        saver.save(state, f"{scene.run}/model.ckpt")
    assert (scene.run / "notes-1.json").read_text() == '{"not": "ours"}'
    assert (scene.run / "notes-1.safetensors").read_bytes() == b"precious"
    assert not scene.manifest(1).exists(), "our own old checkpoints are still rotated"


def test_a_state_file_naming_a_checkpoint_elsewhere_is_not_restored(scene: Scene) -> None:
    scene.state_file(str(scene.outside / "model.ckpt-50"))
    with pytest.warns(CorruptCheckpointWarning, match="not a plain file name"):
        manifest = restore_latest(TrainState(), scene.run)
    assert manifest is not None
    assert manifest.step == 3


# -- 6. a failed restore leaves the state as it was ---------------------------------------------------
def test_restore_of_a_file_failing_its_crc_leaves_the_state_alone(scene: Scene) -> None:
    data = bytearray(scene.data(3).read_bytes())
    data[-1] ^= 0xFF
    scene.data(3).write_bytes(bytes(data))
    state, before = _filled(), _filled()
    held = state["w"]
    with pytest.raises(CorruptCheckpointError, match="checksum mismatch"):
        restore(state, scene.run / "model.ckpt-3")
    _assert_unchanged(state, before)
    assert state["w"] is held


def test_a_bad_rng_state_fails_before_any_array_is_touched(scene: Scene) -> None:
    state_doc = {"key": {"__ndarray__": "uint32", "data": [1, 2, 3]}, "pos": 0}
    _edit(3, _set(("rng",), {"bit_generator": "PCG64", "state": state_doc}))(scene)
    state, before = _filled(), _filled()
    with pytest.raises(CorruptCheckpointError, match="not a valid PCG64 state"):
        restore(state, scene.run / "model.ckpt-3")
    _assert_unchanged(state, before)


# -- 7. decided from what the directory holds ----------------------------------------------------------
def test_a_killed_first_save_with_a_large_header_is_a_fresh_start(tmp_path: Path) -> None:
    # Enough arrays for a header over 1 MiB: only the data file of a first save
    # that was killed before its manifest.
    state = TrainState({f"layer{i:05d}.weight": np.zeros(1, np.float32) for i in range(20_000)})
    Saver().save(state, f"{tmp_path}/model.ckpt")
    (tmp_path / "model.ckpt-0.json").unlink()
    (tmp_path / "checkpoint").unlink()
    (length,) = struct.unpack("<Q", (tmp_path / "model.ckpt-0.safetensors").read_bytes()[:8])
    assert length > 1 << 20
    assert restore_latest(TrainState(), tmp_path) is None


def test_a_torn_data_file_of_a_first_save_on_a_store_without_rename_is_a_fresh_start(
    mem_dir: str,
) -> None:
    import fsspec

    state = _state()
    Saver().save(state, f"{mem_dir}/model.ckpt")
    fs = fsspec.filesystem("memory")
    root = mem_dir.removeprefix("memory://")
    torn = fs.cat_file(f"{root}/model.ckpt-0.safetensors")[:20]
    for name in fs.ls(root, detail=False):
        fs.rm_file(name)
    fs.pipe_file(f"{root}/model.ckpt-0.safetensors", torn)
    assert restore_latest(TrainState(), mem_dir) is None


# -- 8. links ----------------------------------------------------------------------------------------
def test_rotation_removes_a_link_never_its_target(scene: Scene) -> None:
    (scene.run / "blobs").mkdir()
    for path in (scene.manifest(1), scene.data(1)):
        path.rename(scene.run / "blobs" / path.name)
        path.symlink_to(Path("blobs", path.name))
    saver = Saver(max_to_keep=3)
    saver.recover_last_checkpoints([str(scene.run / f"model.ckpt-{n}") for n in GOOD_STEPS])
    state = _state()
    state.global_step = 4
    saver.save(state, f"{scene.run}/model.ckpt")
    assert not scene.manifest(1).is_symlink()
    assert not scene.data(1).is_symlink()
    assert (scene.run / "blobs" / "model.ckpt-1.json").exists()
    assert (scene.run / "blobs" / "model.ckpt-1.safetensors").exists()


# -- size limits ---------------------------------------------------------------------------------------
def test_limits_are_what_the_docs_say() -> None:
    assert MAX_STATE_FILE_BYTES == 4 << 20
    assert MAX_MANIFEST_BYTES == 16 << 20


# -- property-based fuzzing -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fuzz_root(template: Scene) -> Iterator[Callable[[], Scene]]:
    made: list[str] = []

    def fresh() -> Scene:
        root = Path(tempfile.mkdtemp(dir=template.run.parent.parent))
        made.append(str(root))
        return _copy_scene(template, root)

    yield fresh
    for root in made:
        shutil.rmtree(root, ignore_errors=True)


FUZZ = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _fuzz_restore(scene: Scene, outside: dict[str, Any]) -> None:
    state = _filled()
    before = _filled()
    result = _attempt(lambda: restore_latest(state, scene.run))
    if result.error is None:
        assert result.step in GOOD_STEPS
        _assert_restored(scene, state, result.step)
    else:
        _assert_unchanged(state, before)
    assert _tree(scene.outside) == outside


state_lines = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "model_checkpoint_path",
                "all_model_checkpoint_paths",
                "all_model_checkpoint_timestamps",
            ]
        ),
        st.one_of(
            st.text(max_size=40).map(json.dumps),
            st.sampled_from(['"model.ckpt-2"', '"../outside/model.ckpt-50"', "1e999", "nan"]),
        ),
    ),
    max_size=6,
)


@FUZZ
@given(raw=st.binary(max_size=300), lines=state_lines, marked=st.booleans())
def test_fuzzed_state_files(
    fuzz_root: Callable[[], Scene], raw: bytes, lines: list[tuple[str, str]], marked: bool
) -> None:
    scene = fuzz_root()
    outside = _tree(scene.outside)
    text = "\n".join(f"{key}: {value}" for key, value in lines)
    content = (MARKER + "\n" + text).encode() if marked else raw + text.encode()
    (scene.run / "checkpoint").write_bytes(content)
    _fuzz_restore(scene, outside)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(doc, dict):
        for key, value in doc.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            found += _paths(value, (*prefix, index))
    return found


@FUZZ
@given(data=st.data(), value=json_values, reseal=st.booleans())
def test_fuzzed_manifests(
    fuzz_root: Callable[[], Scene], data: st.DataObject, value: Any, reseal: bool
) -> None:
    scene = fuzz_root()
    outside = _tree(scene.outside)
    doc = scene.doc(3)
    path = data.draw(st.sampled_from(_paths(doc)[1:]))
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    scene.put(3, doc, reseal=reseal)
    if reseal and path[0] == "rng":
        # A resealed manifest whose RNG state is still a valid state is a consistent
        # checkpoint someone crafted (found by this fuzzer: state 0): no check can tell
        # it from ours, only a published digest can (see the provenance test below).
        # Restored, it must then hold exactly the RNG state the manifest says.
        scene = dataclasses.replace(scene, rng={**scene.rng, 3: doc["rng"]})
    _fuzz_restore(scene, outside)


@FUZZ
@given(data=st.data())
def test_fuzzed_safetensors_headers(fuzz_root: Callable[[], Scene], data: st.DataObject) -> None:
    """Header edits with the manifest's size and CRC updated: only the header checks are left."""
    scene = fuzz_root()
    outside = _tree(scene.outside)
    raw = bytearray(scene.data(3).read_bytes())
    (length,) = struct.unpack("<Q", raw[:8])
    header = raw[8 : 8 + length]
    start = data.draw(st.integers(0, len(header) - 1))
    end = data.draw(st.integers(start, min(len(header), start + 16)))
    insert = data.draw(
        st.binary(max_size=16)
        | st.sampled_from([b"-1", b"99999999999", b'"F64"', b"[[[[", b'"../x"', b"1e400"])
    )
    header[start:end] = insert
    if data.draw(st.booleans()):
        header += b" " * (-len(header) % 8)
    body = bytes(raw[8 + length :])
    new = struct.pack("<Q", len(header)) + bytes(header) + body
    scene.data(3).write_bytes(new)
    doc = scene.doc(3)
    doc["files"]["model.ckpt-3.safetensors"] = {
        "size": len(new),
        "crc32": f"{zlib.crc32(new):08x}",
    }
    scene.put(3, doc)
    _fuzz_restore(scene, outside)


# -- provenance: a consistent checkpoint someone else crafted ------------------------------------------
def test_a_published_digest_tells_the_checkpoint_meant_from_a_consistent_impostor(
    scene: Scene,
) -> None:
    published = checkpoint_digest(scene.run / "model.ckpt-3")
    assert len(published) == 64
    state = TrainState()
    restore(state, scene.run / "model.ckpt-3", sha256=published)
    _assert_restored(scene, state, 3)
    # Someone replaces step 3 by another, fully consistent checkpoint of ours:
    # every check passes, only the digest its author published tells.
    impostor = _state(5)
    impostor.global_step = 3
    (scene.run / "model.ckpt-3.json").unlink()
    Saver().save(impostor, f"{scene.run}/model.ckpt")
    restore(TrainState(), scene.run / "model.ckpt-3")
    victim, before = _filled(), _filled()
    with pytest.raises(CheckpointDigestError, match=r"model\.ckpt-3 has the SHA-256 digest"):
        restore(victim, scene.run / "model.ckpt-3", sha256=published)
    _assert_unchanged(victim, before)


def test_a_file_changed_between_verifying_and_reading_says_the_state_is_unusable(
    scene: Scene, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Arrays the state has are filled in place after a verifying pass; a file
    # that changes in between (simulated: the verifying pass sees the good one)
    # can only fail with an error that says what became of the state.
    data = bytearray(scene.data(3).read_bytes())
    data[-1] ^= 0xFF
    scene.data(3).write_bytes(bytes(data))
    monkeypatch.setattr(saver_module, "verify_arrays", lambda *args, **kwargs: None)
    with pytest.raises(CorruptCheckpointError, match="partly overwritten: the state is no longer"):
        restore(_filled(), scene.run / "model.ckpt-3")
