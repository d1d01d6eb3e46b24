"""The file format: safetensors arrays, the JSON manifest, checksums, versions."""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file

from monitored import TrainState
from monitored_checkpoint import (
    FORMAT_VERSION,
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointVersionError,
    CorruptCheckpointError,
    UnsupportedArrayError,
    read_manifest,
)
from monitored_checkpoint._format import (
    SnapshotBuffers,
    read_arrays,
    take_snapshot,
    write_checkpoint,
)
from monitored_checkpoint._store import open_store


def _write(directory: str, state: TrainState, name: str = "model.ckpt-3", **kw: Any) -> Any:
    store = open_store(directory)
    store.ensure_directory()
    return store, write_checkpoint(store, name, take_snapshot(state, **kw))


ALL_DTYPES = [
    np.bool_,
    np.uint8,
    np.int8,
    np.int16,
    np.uint16,
    np.float16,
    np.int32,
    np.uint32,
    np.float32,
    np.float64,
    np.int64,
    np.uint64,
    np.complex64,
    ml_dtypes.bfloat16,
    ml_dtypes.float8_e4m3fn,
    ml_dtypes.float8_e5m2,
]


def _values(dtype: Any, shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
    raw = np.asarray(np.random.default_rng(1).standard_normal(shape) * 100)
    if np.dtype(dtype) == np.bool_:
        return np.asarray(raw > 0)
    if np.dtype(dtype).kind == "c":
        return np.asarray(raw + 1j * raw.T.T).astype(dtype)
    return raw.astype(dtype)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_dtype_round_trips_bit_for_bit(ckpt_dir: str, dtype: Any) -> None:
    state = TrainState({"x": _values(dtype, (5, 7)), "scalar": _values(dtype, ())})
    store, manifest = _write(ckpt_dir, state)
    restored = read_arrays(store, read_manifest(store, manifest.name))
    for name in state:
        assert restored[name].dtype == state[name].dtype
        assert restored[name].shape == state[name].shape
        assert restored[name].tobytes() == state[name].tobytes()


def test_the_data_file_is_plain_safetensors(ckpt_dir: str, state: TrainState) -> None:
    state["h"] = np.arange(6, dtype=np.float16).reshape(2, 3)
    state.global_step = 3
    _write(ckpt_dir, state)
    path = os.path.join(ckpt_dir, "model.ckpt-3.safetensors")
    loaded = load_file(path)
    assert sorted(loaded) == sorted(state)
    for name, array in state.items():
        np.testing.assert_array_equal(loaded[name], array)
        assert loaded[name].dtype == array.dtype
    with safe_open(path, framework="np") as f:
        assert f.metadata() == {
            "format": "monitored-checkpoint",
            "format_version": str(FORMAT_VERSION),
            "step": "3",
        }


def test_bfloat16_is_stored_under_safetensors_own_tag(ckpt_dir: str) -> None:
    state = TrainState({"x": np.arange(4, dtype=ml_dtypes.bfloat16)})
    _write(ckpt_dir, state)
    with open(os.path.join(ckpt_dir, "model.ckpt-3.safetensors"), "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    assert header["x"]["dtype"] == "BF16"
    assert length % 8 == 0, "header padded so the data is aligned"


def test_arrays_are_ordered_for_alignment(ckpt_dir: str) -> None:
    state = TrainState({"a": np.ones(3, np.bool_), "b": np.ones(3, np.float64)})
    _write(ckpt_dir, state)
    with open(os.path.join(ckpt_dir, "model.ckpt-3.safetensors"), "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    assert header["b"]["data_offsets"] == [0, 24]
    assert header["a"]["data_offsets"] == [24, 27]


def test_manifest_holds_step_rng_plugins_checksums_versions(ckpt_dir: str) -> None:
    state = TrainState({"w": np.arange(3.0)}, global_step=12, seed=5)
    _write(ckpt_dir, state, "model.ckpt-12", plugin_states={"early": {"best": 0.5}})
    with open(os.path.join(ckpt_dir, "model.ckpt-12.json")) as f:
        doc = json.load(f)
    assert doc["format"] == "monitored-checkpoint"
    assert doc["format_version"] == FORMAT_VERSION
    assert doc["step"] == 12
    assert doc["plugins"] == {"early": {"best": 0.5}}
    assert doc["rng"]["bit_generator"] == "PCG64"
    assert doc["arrays"]["w"] == {
        "dtype": "float64",
        "shape": [3],
        "module": "numpy",
        "file": "model.ckpt-12.safetensors",
    }
    data = Path(ckpt_dir, "model.ckpt-12.safetensors").read_bytes()
    assert doc["files"]["model.ckpt-12.safetensors"] == {
        "size": len(data),
        "crc32": f"{zlib.crc32(data):08x}",
    }
    assert {"python", "numpy", "monitored", "monitored-checkpoint"} <= set(doc["versions"])


def test_non_contiguous_and_big_endian_arrays_are_saved_by_value(ckpt_dir: str) -> None:
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    state = TrainState({"t": base.T, "be": np.arange(5, dtype=">i4")})
    store, manifest = _write(ckpt_dir, state)
    restored = read_arrays(store, manifest)
    np.testing.assert_array_equal(restored["t"], base.T)
    np.testing.assert_array_equal(restored["be"], np.arange(5))
    assert restored["be"].dtype == np.dtype("<i4")


@pytest.mark.parametrize(
    ("value", "dtype"),
    [(np.array([object()], dtype=object), "object"), (np.zeros(2, np.complex128), "complex128")],
)
def test_unsupported_dtype_names_the_entry(ckpt_dir: str, value: Any, dtype: str) -> None:
    state = TrainState({"fine": np.zeros(2), "bad": value})
    with pytest.raises(UnsupportedArrayError, match=f"'bad' has dtype {dtype}"):
        take_snapshot(state)


def test_plugin_state_that_is_not_json_names_the_plugin() -> None:
    state = TrainState({"w": np.zeros(2)})
    with pytest.raises(CheckpointError, match="plugin 'early'.*JSON"):
        take_snapshot(state, {"early": {"when": object()}})


def test_a_snapshot_holds_the_rng_and_plugin_states_of_its_step(ckpt_dir: str) -> None:
    """The writer makes the RNG and plugin states JSON (issue 33), from what the
    snapshot captured: a generator drawn from and a plugin state changed after
    the snapshot do not reach the checkpoint."""
    state = TrainState({"w": np.zeros(2)}, global_step=3)
    rng_then = state.rng_state
    plugin = {"version": 1, "state": {"best": 1.5, "history": [1, 2]}}
    snapshot = take_snapshot(state, {"early": plugin})
    state.rng.random(10)  # the loop goes on before the writer runs
    plugin["state"]["best"] = 0.5
    plugin["state"]["history"].append(3)
    store = open_store(ckpt_dir)
    store.ensure_directory()
    manifest = write_checkpoint(store, "model.ckpt-3", snapshot)
    assert manifest.rng_state == rng_then
    assert manifest.plugins == {"early": {"version": 1, "state": {"best": 1.5, "history": [1, 2]}}}
    restored = TrainState({"w": np.zeros(2)})
    restored.rng_state = manifest.rng_state
    again = TrainState({"w": np.zeros(2)})
    again.rng_state = rng_then
    assert restored.rng.random(4).tolist() == again.rng.random(4).tolist()


def test_plugin_states_that_are_not_json_name_the_first_bad_plugin() -> None:
    state = TrainState({"w": np.zeros(2)})
    good = {"version": 1, "state": {"n": 1}}
    bad = {"version": 1, "state": {"f": float}}
    with pytest.raises(CheckpointError, match="plugin 'second'.*JSON"):
        take_snapshot(state, {"first": good, "second": bad, "third": good})


def test_snapshot_buffers_are_reused_and_isolated() -> None:
    state = TrainState({"w": np.arange(4.0)})
    buffers = SnapshotBuffers()
    first = take_snapshot(state, buffers=buffers)
    state["w"] += 1
    assert first.arrays["w"].tolist() == [0, 1, 2, 3], "a snapshot is a copy"
    second = take_snapshot(state, buffers=buffers)
    assert second.arrays["w"] is first.arrays["w"], "the buffer is reused"
    assert buffers.nbytes == 32
    buffers.clear()
    assert buffers.nbytes == 0


def test_small_snapshot_buffers_are_prepared_at_once_large_ones_by_a_thread() -> None:
    small = TrainState({"w": np.ones(1000, np.float32)})
    buffers = SnapshotBuffers()
    buffers.prepare(small)
    assert buffers._preparing is None, "a few kilobytes: no thread"
    assert buffers.nbytes == 4000
    large = TrainState({"a": np.ones(1 << 20, np.float32), "b": np.ones(3, np.float64)})
    buffers = SnapshotBuffers()
    buffers.prepare(large)
    assert buffers._preparing is not None, "4 MB: touched by a thread while training starts"
    snapshot = take_snapshot(large, buffers=buffers)  # waits for that thread
    assert buffers._preparing is None
    assert buffers.nbytes == (4 << 20) + 24
    assert snapshot.arrays["a"].tolist()[:3] == [1.0, 1.0, 1.0]


def test_uncopied_snapshot_shares_contiguous_arrays() -> None:
    state = TrainState({"w": np.arange(4.0), "t": np.ones((2, 3)).T})
    snap = take_snapshot(state, copy=False)
    assert snap.arrays["w"] is state["w"]
    assert snap.arrays["t"] is not state["t"], "non-contiguous arrays are copied"


def test_restore_reads_in_place_into_matching_arrays(ckpt_dir: str, state: TrainState) -> None:
    store, manifest = _write(ckpt_dir, state)
    target = {"w": np.zeros_like(state["w"]), "b": np.zeros(4)}
    restored = read_arrays(store, manifest, into=target)
    assert restored["w"] is target["w"]
    np.testing.assert_array_equal(target["w"], state["w"])
    assert restored["b"] is not target["b"], "a wrong shape gets a new array"


# -- damage is detected -----------------------------------------------------------------------
def _data(ckpt_dir: str) -> str:
    return os.path.join(ckpt_dir, "model.ckpt-3.safetensors")


def test_flipped_byte_is_a_checksum_mismatch(ckpt_dir: str, state: TrainState) -> None:
    store, manifest = _write(ckpt_dir, state)
    with open(_data(ckpt_dir), "r+b") as f:
        f.seek(-3, os.SEEK_END)
        byte = f.read(1)
        f.seek(-3, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0x01]))
    with pytest.raises(CorruptCheckpointError, match=r"model\.ckpt-3\.safetensors: checksum"):
        read_arrays(store, manifest)


def test_truncated_data_file_is_detected(ckpt_dir: str, state: TrainState) -> None:
    store, manifest = _write(ckpt_dir, state)
    size = os.path.getsize(_data(ckpt_dir))
    os.truncate(_data(ckpt_dir), size - 10)
    with pytest.raises(CorruptCheckpointError, match=f"has {size - 10} bytes.*says {size}"):
        read_arrays(store, manifest)


def test_missing_data_file_is_detected(ckpt_dir: str, state: TrainState) -> None:
    store, manifest = _write(ckpt_dir, state)
    os.remove(_data(ckpt_dir))
    with pytest.raises(CorruptCheckpointError, match="data file is missing"):
        read_arrays(store, manifest)


def test_a_checkpoint_deleted_while_it_is_read_is_not_found(
    ckpt_dir: str, state: TrainState
) -> None:
    # Rotation deletes the manifest, then the data file, after a reader read the manifest.
    store, manifest = _write(ckpt_dir, state)
    os.remove(os.path.join(ckpt_dir, "model.ckpt-3.json"))
    os.remove(_data(ckpt_dir))
    with pytest.raises(CheckpointNotFoundError, match="model.ckpt-3 was deleted while"):
        read_arrays(store, manifest)


def test_damaged_header_is_detected(ckpt_dir: str, state: TrainState) -> None:
    store, manifest = _write(ckpt_dir, state)
    with open(_data(ckpt_dir), "r+b") as f:
        f.seek(8)
        f.write(b"[")
    with pytest.raises(CorruptCheckpointError, match="header is not valid JSON"):
        read_arrays(store, manifest)


def test_header_that_disagrees_with_manifest_is_detected(ckpt_dir: str, state: TrainState) -> None:
    store, manifest = _write(ckpt_dir, state)
    with open(_data(ckpt_dir), "r+b") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = f.read(length)
        f.seek(8)
        f.write(header.replace(b'"F32"', b'"I32"'))
    with pytest.raises(CorruptCheckpointError, match="header entry of 'w'"):
        read_arrays(store, manifest)


def test_header_without_offsets_is_detected(ckpt_dir: str, state: TrainState) -> None:
    store, manifest = _write(ckpt_dir, state)
    with open(_data(ckpt_dir), "r+b") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = f.read(length)
        f.seek(8)
        f.write(header.replace(b'"data_offsets"', b'"data_offsetz"', 1))
    with pytest.raises(CorruptCheckpointError, match="safetensors header is damaged"):
        read_arrays(store, manifest)


def test_header_length_beyond_the_file_is_detected(ckpt_dir: str, state: TrainState) -> None:
    store, manifest = _write(ckpt_dir, state)
    with open(_data(ckpt_dir), "r+b") as f:
        f.write(struct.pack("<Q", 1 << 40))
    with pytest.raises(CorruptCheckpointError, match="header length is damaged"):
        read_arrays(store, manifest)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b'{"format": "monitored-checkpoint", "format_ver', "not valid JSON"),
        (b"", "not valid JSON"),
        (b'{"format": "other"}', "is not a monitored-checkpoint manifest"),
        (b'{"format": "monitored-checkpoint", "format_version": "1"}', "not an integer"),
        (b'{"format": "monitored-checkpoint", "format_version": 1}', "incomplete or damaged"),
    ],
)
def test_bad_manifest_names_the_file_and_reason(
    ckpt_dir: str, state: TrainState, content: bytes, reason: str
) -> None:
    store, _ = _write(ckpt_dir, state)
    with open(os.path.join(ckpt_dir, "model.ckpt-3.json"), "wb") as f:
        f.write(content)
    with pytest.raises(CorruptCheckpointError, match=rf"model\.ckpt-3\.json.*{reason}"):
        read_manifest(store, "model.ckpt-3")


def test_manifest_with_negative_step_is_damaged(ckpt_dir: str, state: TrainState) -> None:
    store, _ = _write(ckpt_dir, state)
    path = Path(ckpt_dir, "model.ckpt-3.json")
    doc = json.loads(path.read_text())
    doc["step"] = -1
    path.write_text(json.dumps(doc))
    with pytest.raises(CorruptCheckpointError, match="step is -1"):
        read_manifest(store, "model.ckpt-3")


def test_newer_format_version_is_refused(ckpt_dir: str, state: TrainState) -> None:
    store, _ = _write(ckpt_dir, state)
    path = Path(ckpt_dir, "model.ckpt-3.json")
    doc = json.loads(path.read_text())
    doc["format_version"] = FORMAT_VERSION + 1
    doc["versions"]["monitored-checkpoint"] = "9.0"
    path.write_text(json.dumps(doc))
    with pytest.raises(
        CheckpointVersionError,
        match=rf"format version {FORMAT_VERSION + 1} \(by monitored-checkpoint 9\.0\).*up to "
        rf"{FORMAT_VERSION}: upgrade",
    ):
        read_manifest(store, "model.ckpt-3")


def test_missing_manifest_is_not_found(ckpt_dir: str) -> None:
    store = open_store(ckpt_dir)
    with pytest.raises(CheckpointNotFoundError, match=r"model\.ckpt-9 does not exist"):
        read_manifest(store, "model.ckpt-9")


def test_memory_filesystem_round_trip(mem_dir: str, state: TrainState) -> None:
    store, manifest = _write(mem_dir, state)
    assert manifest.path == f"{mem_dir}/model.ckpt-3"
    assert store.list() == ["model.ckpt-3.json", "model.ckpt-3.safetensors"]
    restored = read_arrays(store, read_manifest(store, "model.ckpt-3"))
    for name in state:
        np.testing.assert_array_equal(restored[name], state[name])
