"""The checkpoint format: a safetensors file of arrays and a JSON manifest.

A checkpoint ``model.ckpt-100`` in a directory is two files:

``model.ckpt-100.safetensors``
    Every state array, in the standard safetensors layout (an 8-byte little-endian
    header length, a JSON header naming each array's dtype, shape and byte range,
    then the raw little-endian bytes), so ``safetensors`` alone reads it. Its
    ``__metadata__`` says which format and step wrote it.
``model.ckpt-100.json``
    The manifest: format and version, global step, RNG state, each plugin's state,
    each array's dtype, shape and array module, the size and CRC-32 of every data
    file, and the versions of the libraries that wrote it. It is written last and
    is the commit marker: a checkpoint exists when its manifest does.

The file is written here rather than by ``safetensors.numpy.save_file`` so that it
streams from the snapshot buffers without a copy, to any fsspec file, with the
checksum computed alongside (see ``docs/checkpoint.md``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import json
import math
import platform
import queue
import re
import struct
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any, BinaryIO, Final, Protocol, TypeGuard, cast, final

import numpy as np

from monitored import decode_rng_state, encode_rng_state, is_device_array

from ._errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointVersionError,
    CorruptCheckpointError,
    UnsupportedArrayError,
)
from ._store import Store, check_name, write_all

if TYPE_CHECKING:
    from monitored import TrainState

try:  # ISA-L computes the same CRC-32 as zlib, about three times as fast.
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - isal is a dependency where it has wheels
    from zlib import crc32

__all__ = [
    "DATA_SUFFIX",
    "DIGEST_FIELD",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MANIFEST_SUFFIX",
    "MAX_JSON_DEPTH",
    "MAX_MANIFEST_BYTES",
    "ArrayInfo",
    "FileInfo",
    "Manifest",
    "Snapshot",
    "SnapshotBuffers",
    "check_session_plugin_states",
    "check_step_name",
    "dtype_name",
    "load_json",
    "looks_like_our_data_file",
    "manifest_digest",
    "read_arrays",
    "read_manifest",
    "read_manifest_bytes",
    "step_of",
    "take_snapshot",
    "verify_arrays",
    "write_checkpoint",
    "write_checkpoint_files",
]

#: The value of ``"format"`` in every manifest and safetensors ``__metadata__``.
FORMAT_NAME: Final = "monitored-checkpoint"
#: The format version this package writes; it reads every version up to it. Version 2
#: added the manifest's own checksum (:data:`DIGEST_FIELD`); version 1 manifests have none.
FORMAT_VERSION: Final = 2
DATA_SUFFIX: Final = ".safetensors"
MANIFEST_SUFFIX: Final = ".json"
#: The manifest field holding its own checksum (see :func:`manifest_digest`).
DIGEST_FIELD: Final = "manifest_sha256"
#: The largest manifest read, in bytes (real ones are kilobytes; 16 MiB parses in well
#: under a second and a few hundred MB of memory at worst).
MAX_MANIFEST_BYTES: Final = 16 << 20
#: The deepest nesting of JSON objects and arrays read from a manifest or header.
MAX_JSON_DEPTH: Final = 64

#: Bytes per read or write call: large enough for full disk speed, small enough
#: for the checksum thread to follow the reader closely.
_CHUNK: Final = 64 << 20
#: safetensors' own limit on the header size.
_MAX_HEADER: Final = 100_000_000

#: NumPy dtype name -> safetensors dtype tag.
_TAGS: Final = {
    "bool": "BOOL",
    "uint8": "U8",
    "int8": "I8",
    "int16": "I16",
    "uint16": "U16",
    "float16": "F16",
    "bfloat16": "BF16",
    "int32": "I32",
    "uint32": "U32",
    "float32": "F32",
    "float64": "F64",
    "int64": "I64",
    "uint64": "U64",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "complex64": "C64",
}
#: dtypes that NumPy lacks and ``ml_dtypes`` provides.
_ML_DTYPES: Final = frozenset({"bfloat16", "float8_e4m3fn", "float8_e5m2"})
#: The dtypes of :data:`_TAGS` that NumPy has, by name (a name is parsed once).
_NUMPY_DTYPES: Final = {name: np.dtype(name) for name in _TAGS if name not in _ML_DTYPES}
#: Bytes per item of each dtype of :data:`_TAGS`, known without importing ``ml_dtypes``.
_ITEMSIZE: Final = {
    name: 1 if name.startswith("float8") else 2 if name == "bfloat16" else np.dtype(name).itemsize
    for name in _TAGS
}
#: NumPy's bit generators: the only RNG states a checkpoint may hold.
_BIT_GENERATORS: Final = frozenset({"PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64"})
_MAX_STEP: Final = (1 << 63) - 1
#: Larger than any file or dimension can be (2**62 bytes), small enough for int64.
_MAX_FILE: Final = 1 << 62
#: NumPy's own limit on dimensions.
_MAX_NDIM: Final = 64
_CRC: Final = re.compile(r"[0-9a-f]{8}")
_STEP_NAME: Final = re.compile(r"^(?P<base>.+)-(?P<step>[0-9]+)$", re.ASCII)
#: How every data file of ours begins, after the 8-byte header length.
_OUR_HEADER_START: Final = b'{"__metadata__":{"format":"' + FORMAT_NAME.encode() + b'"'


# -- dtypes ---------------------------------------------------------------------------------
#: ``dtype.name`` by dtype: NumPy builds the name in Python at each read.
_NAMES: Final[dict[np.dtype[Any], str]] = {}


def dtype_name(dtype: np.dtype[Any]) -> str:
    """``dtype.name``, remembered (the writer asks twice per array and save)."""
    name = _NAMES.get(dtype)
    if name is None:
        name = _NAMES[dtype] = dtype.name
    return name


def dtype_tag(dtype: np.dtype[Any], name: str) -> str:
    """The safetensors tag for ``dtype``; ``name`` is the state entry, for the error."""
    tag = _TAGS.get(dtype_name(dtype))
    if tag is None:
        raise UnsupportedArrayError(
            f"state entry {name!r} has dtype {dtype}, which safetensors cannot store; "
            f"supported: {', '.join(_TAGS)}"
        )
    return tag


def dtype_from_name(dtype_name: str, where: str) -> np.dtype[Any]:
    """The NumPy dtype called ``dtype_name`` (``bfloat16`` etc. through ``ml_dtypes``)."""
    if dtype_name not in _TAGS:
        raise CorruptCheckpointError(f"{where}: unknown dtype {dtype_name!r}")
    if dtype_name in _ML_DTYPES:
        try:
            ml_dtypes = importlib.import_module("ml_dtypes")
        except ImportError:
            raise CheckpointError(
                f"{where} holds {dtype_name} arrays, which NumPy needs the ml_dtypes package "
                "for: pip install ml-dtypes"
            ) from None
        extension: np.dtype[Any] = np.dtype(getattr(ml_dtypes, dtype_name))
        return extension
    return _NUMPY_DTYPES[dtype_name]


# -- snapshots ----------------------------------------------------------------------------------
#: Files smaller than this are checksummed on the reading or writing thread.
_INLINE_CRC_BYTES: Final = 4 << 20
#: The dtypes seen to be storable: a set lookup per array and snapshot, where
#: ``dtype_tag`` builds the dtype's name.
_STORABLE: Final[set[np.dtype[Any]]] = set()


#: Snapshot buffers smaller than this are prepared on the caller's thread.
_PREPARE_INLINE_BYTES: Final = 2 << 20


@final
class SnapshotBuffers:
    """Host buffers reused from one snapshot to the next.

    Copying into memory that was touched before is about twice as fast as into
    fresh pages, and for CuPy arrays the buffers are pinned, which makes the
    device-to-host copy faster still. One set is enough: a snapshot is taken
    only once the previous one has been written.
    """

    __slots__ = ("_buffers", "_preparing")

    def __init__(self) -> None:
        self._buffers: dict[str, np.ndarray[Any, Any]] = {}
        self._preparing: threading.Thread | None = None

    def prepare(self, state: TrainState) -> None:
        """Allocate and touch, in a thread, the buffers a snapshot of ``state`` needs.

        So that the first snapshot of a session that did not save at its start
        (it resumed from a checkpoint of its step) copies into touched memory,
        as every later one does. NumPy entries only (CuPy's are pinned, so
        resident once allocated); buffers already there are left alone (a write
        in flight may be reading them). :meth:`get` waits for the thread.
        """
        self._join()
        wanted: dict[str, tuple[tuple[int, ...], np.dtype[Any]]] = {}
        for name, array in state.items():
            if is_device_array(array):
                continue
            dtype = np.dtype(array.dtype)
            little = dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype
            shape = tuple(int(n) for n in array.shape)
            have = self._buffers.get(name)
            if have is None or have.shape != shape or have.dtype != little:
                wanted[name] = (shape, little)
        if not wanted:
            return

        def touch() -> None:
            for name, (shape, dtype) in wanted.items():
                buffer = np.empty(shape, dtype)
                buffer.fill(0)  # NumPy releases the GIL: the loop goes on meanwhile
                self._buffers[name] = buffer

        total = sum(math.prod(shape) * dtype.itemsize for shape, dtype in wanted.values())
        if total < _PREPARE_INLINE_BYTES:
            # Cheaper than a thread's start, and the buffers are then in this
            # thread's cache rather than another core's.
            touch()
            return
        self._preparing = threading.Thread(target=touch, name="checkpoint-buffers", daemon=True)
        self._preparing.start()

    def _join(self) -> None:
        if self._preparing is not None:
            self._preparing.join()
            self._preparing = None

    def get(
        self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any], pinned: bool
    ) -> np.ndarray[Any, Any]:
        """A C-contiguous host array of ``shape`` and ``dtype`` for entry ``name``."""
        if self._preparing is not None:
            self._join()
        buffer = self._buffers.get(name)
        if buffer is None or buffer.shape != shape or buffer.dtype != dtype:
            buffer = _empty_pinned(shape, dtype) if pinned else np.empty(shape, dtype)
            self._buffers[name] = buffer
        return buffer

    def clear(self) -> None:
        """Free every buffer."""
        self._join()
        self._buffers.clear()

    @property
    def nbytes(self) -> int:
        """Host memory held."""
        return sum(b.nbytes for b in self._buffers.values())


def _empty_pinned(shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    import cupyx

    array: np.ndarray[Any, Any] = cupyx.empty_pinned(shape, dtype)
    return array


@final
class Snapshot:
    """Everything one checkpoint holds, in host memory, taken at one step boundary.

    The arrays are C-contiguous little-endian NumPy arrays that nobody else
    writes to while the snapshot is being saved. The RNG and plugin states are
    captured on the loop in the cheapest form that nothing can change later, and
    made the manifest's JSON values on first use of :attr:`rng` and
    :attr:`plugins`, by the writer's thread (issue 33: the step loop only copies):

    * the RNG state as ``TrainState.rng_state`` gives it: NumPy builds new
      objects (ints, a new array) at each read of ``bit_generator.state``, so
      nothing the loop does later reaches them; :func:`encode_rng_state` makes
      them JSON;
    * the plugin states as JSON text (``json.dumps`` on the loop: a deep copy,
      and a state that is not JSON-serializable raises there, naming its plugin),
      parsed back by the writer.
    """

    __slots__ = (
        "_plugins",
        "_plugins_text",
        "_rng",
        "_rng_raw",
        "arrays",
        "created",
        "modules",
        "step",
    )

    def __init__(
        self,
        step: int,
        arrays: dict[str, np.ndarray[Any, Any]],
        modules: dict[str, str],
        rng: Any,
        plugins: dict[str, Any] | str,
    ) -> None:
        self.step = step
        self.arrays = arrays
        self.modules = modules
        self._rng_raw = rng
        self._rng: dict[str, Any] | None = None
        self._plugins_text = plugins if isinstance(plugins, str) else None
        self._plugins: dict[str, Any] | None = None if isinstance(plugins, str) else plugins
        self.created = time.time()

    @property
    def rng(self) -> dict[str, Any]:
        """The RNG state as the manifest holds it (JSON values)."""
        if self._rng is None:
            self._rng = _json_copy(encode_rng_state(self._rng_raw), "the RNG state")
        return self._rng

    @property
    def plugins(self) -> dict[str, Any]:
        """Each plugin's saved state as the manifest holds it (JSON values)."""
        if self._plugins is None:
            assert self._plugins_text is not None
            self._plugins = json.loads(self._plugins_text)
        return self._plugins

    @property
    def nbytes(self) -> int:
        """Bytes of array data."""
        return sum(a.nbytes for a in self.arrays.values())


def take_snapshot(
    state: TrainState,
    plugin_states: Mapping[str, Any] | None = None,
    *,
    buffers: SnapshotBuffers | None = None,
    copy: bool = True,
) -> Snapshot:
    """Copy ``state`` (arrays, global step, RNG) and ``plugin_states`` to host memory.

    With ``copy=False`` NumPy arrays that are already C-contiguous and
    little-endian are used as they are: only for a save that finishes before the
    state changes again. CuPy arrays always go through host memory.

    What the step loop waits for at each save: the copies, then as little as
    can be (see :class:`Snapshot` for what is left to the writer).
    """
    arrays: dict[str, np.ndarray[Any, Any]] = {}
    modules: dict[str, str] = {}
    storable = _STORABLE
    for name, array in state.items():
        dtype = array.dtype
        if dtype not in storable:
            dtype = np.dtype(dtype)
            dtype_tag(dtype, name)  # raises for a dtype safetensors cannot store
            storable.add(dtype)
        if isinstance(array, np.ndarray):  # the common case, first
            little = dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype
            if not copy and little == dtype and array.flags.c_contiguous:
                host = array
            else:
                # A NumPy array's shape is a tuple of ints already.
                host = (
                    buffers.get(name, array.shape, little, pinned=False)
                    if buffers is not None
                    else np.empty(array.shape, little)
                )
                np.copyto(host, array, casting="equiv")
            modules[name] = "numpy"
        else:  # CuPy (a TrainState holds NumPy or CuPy arrays only)
            import cupy

            shape = tuple(int(n) for n in array.shape)
            # CuPy arrays are always in native (little-endian) byte order.
            host = (
                buffers.get(name, shape, dtype, pinned=True)
                if buffers is not None
                else np.empty(shape, dtype)
            )
            # Straight into ``host``: ``get(out=)`` makes its own contiguous copy of
            # a strided array, and ``ascontiguousarray`` here would turn a 0-d entry
            # into shape (1,), which ``get`` refuses for a 0-d ``host``.
            cupy.asnumpy(array, out=host)
            modules[name] = "cupy"
        arrays[name] = host
    return Snapshot(
        state.global_step,
        arrays,
        modules,
        state.rng_state,
        _plugins_text(plugin_states) if plugin_states else {},
    )


def _plugins_text(plugin_states: Mapping[str, Any]) -> str:
    """``plugin_states`` as JSON text: a copy that nothing changes later.

    One ``json.dumps`` for all; if it fails, each plugin's state is tried on
    its own, so the error names the plugin whose state cannot be saved.
    """
    states = {plugin: dict(entry) for plugin, entry in plugin_states.items()}
    try:
        return json.dumps(states)
    except (TypeError, ValueError):
        for plugin, entry in states.items():
            _json_copy(entry, f"the state of plugin {plugin!r}")
        raise  # pragma: no cover - one of them failed on its own


def _json_copy(value: Any, what: str) -> Any:
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as exc:
        raise CheckpointError(
            f"{what} cannot be saved in a checkpoint manifest: it must be JSON-serializable ({exc})"
        ) from exc


# -- the manifest ---------------------------------------------------------------------------------
@final
@dataclass(frozen=True, slots=True)
class ArrayInfo:
    """One array of a checkpoint, as its manifest records it."""

    dtype: str
    shape: tuple[int, ...]
    module: str
    file: str


@final
@dataclass(frozen=True, slots=True)
class FileInfo:
    """One data file of a checkpoint: its size and CRC-32 (of the whole file)."""

    size: int
    crc32: int


@final
@dataclass(frozen=True, slots=True)
class Manifest:
    """A checkpoint's manifest: everything but the array bytes."""

    #: The checkpoint's name in its directory (``model.ckpt-100``).
    name: str
    #: The full path or URL of the checkpoint (``/runs/a/model.ckpt-100``).
    path: str
    step: int
    created: float
    format_version: int
    rng: dict[str, Any]
    plugins: dict[str, Any]
    arrays: dict[str, ArrayInfo]
    files: dict[str, FileInfo]
    versions: dict[str, str]

    @property
    def rng_state(self) -> dict[str, Any]:
        """The RNG state, ready for ``TrainState.rng_state``."""
        decoded: dict[str, Any] = decode_rng_state(self.rng)
        return decoded


@functools.cache
def _versions() -> dict[str, str]:
    found = {"python": platform.python_version(), "numpy": np.__version__}
    for dist in ("monitored", "monitored-checkpoint"):
        with contextlib.suppress(PackageNotFoundError):
            found[dist] = version(dist)
    return found


def _library_versions(snapshot: Snapshot) -> dict[str, str]:
    found = dict(_versions())
    if "cupy" in snapshot.modules.values():
        with contextlib.suppress(PackageNotFoundError):
            found["cupy"] = version("cupy-cuda12x")
    return found


# -- writing --------------------------------------------------------------------------------------
def _header(snapshot: Snapshot) -> tuple[bytes, list[str]]:
    """The safetensors prefix (length + JSON header) and the arrays' order in the file."""
    # Largest items first, as safetensors itself orders them: every array then
    # starts at a multiple of its item size, so zero-copy readers can map it.
    order = sorted(snapshot.arrays, key=lambda n: (-snapshot.arrays[n].dtype.itemsize, n))
    header: dict[str, Any] = {
        "__metadata__": {
            "format": FORMAT_NAME,
            "format_version": str(FORMAT_VERSION),
            "step": str(snapshot.step),
        }
    }
    offset = 0
    for name in order:
        array = snapshot.arrays[name]
        header[name] = {
            "dtype": dtype_tag(array.dtype, name),
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        offset += array.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text, order


def _chunks(views: Iterable[memoryview]) -> Iterable[memoryview]:
    for view in views:
        for start in range(0, view.nbytes, _CHUNK):
            yield view[start : start + _CHUNK]


@final
class _Crc32Thread:
    """Computes the CRC-32 of some buffers in a thread (the GIL is released meanwhile).

    Below :data:`_INLINE_CRC_BYTES` on the caller's thread: starting a thread
    costs more than checksumming a small file.
    """

    __slots__ = ("_error", "_thread", "_value")

    def __init__(self, views: list[memoryview]) -> None:
        self._value = 0
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        if sum(v.nbytes for v in views) < _INLINE_CRC_BYTES:
            self._run(views)
            return
        self._thread = threading.Thread(target=self._run, args=(views,), daemon=True)
        self._thread.start()

    def _run(self, views: list[memoryview]) -> None:
        try:
            value = 0
            for chunk in _chunks(views):
                value = crc32(chunk, value)
            self._value = value
        except BaseException as exc:  # pragma: no cover - crc32 does not fail on buffers
            self._error = exc

    def result(self) -> int:
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:  # pragma: no cover
            raise self._error
        return self._value


def _byte_view(array: np.ndarray[Any, Any]) -> memoryview:
    return array.reshape(-1).view(np.uint8).data


def write_checkpoint(store: Store, name: str, snapshot: Snapshot) -> Manifest:
    """Write ``snapshot`` as checkpoint ``name`` in ``store``: data file, then manifest.

    Blocking; runs in the background writer's thread. The manifest goes last, so
    a checkpoint whose write was interrupted has no manifest and does not exist.
    On a local filesystem the manifest's rename is durable once the directory is
    next synced (:meth:`Saver.write` does it with the state file; here, at once).
    """
    manifest = write_checkpoint_files(store, name, snapshot)
    store.sync_directory()
    return parse_manifest(manifest, store, name)


def write_checkpoint_files(store: Store, name: str, snapshot: Snapshot) -> dict[str, Any]:
    """:func:`write_checkpoint` without reading back the manifest, whose rename is
    made durable by the caller's next durable write to ``store`` (the state file)."""
    data_name = name + DATA_SUFFIX
    prefix, order = _header(snapshot)
    views = [memoryview(prefix), *(_byte_view(snapshot.arrays[n]) for n in order)]

    def write_data(file: BinaryIO) -> None:
        write_views = getattr(file, "write_views", None)
        if write_views is not None and total <= _CHUNK:
            write_views(views)  # a local file: one ``writev`` for the header and every array
            return
        for chunk in _chunks(views):
            write_all(file, chunk)

    total = sum(v.nbytes for v in views)
    crc = _Crc32Thread(views)
    try:
        # Its rename is made durable with the manifest's directory sync, before
        # the manifest's own rename: a manifest never survives without its data.
        store.write(data_name, write_data, durable="later")
    finally:
        checksum = crc.result()
    size = total
    manifest = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "step": snapshot.step,
        "created": snapshot.created,
        "rng": snapshot.rng,
        "plugins": snapshot.plugins,
        "arrays": {
            n: {
                "dtype": dtype_name(a.dtype),
                "shape": list(a.shape),
                "module": snapshot.modules[n],
                "file": data_name,
            }
            for n, a in sorted(snapshot.arrays.items())
        },
        "files": {data_name: {"size": size, "crc32": f"{checksum:08x}"}},
        "versions": _library_versions(snapshot),
    }
    manifest[DIGEST_FIELD] = manifest_digest(manifest)
    # One line: the C encoder (an ``indent`` takes json's pure-Python one, a
    # third of a small checkpoint's write). ``monitored checkpoint show`` prints it.
    text = json.dumps(manifest).encode() + b"\n"
    if len(text) > MAX_MANIFEST_BYTES:
        raise CheckpointError(
            f"the manifest of {store.path(name)} would have {len(text)} bytes, more than the "
            f"{MAX_MANIFEST_BYTES} a reader accepts: the RNG or plugin states are too large"
        )
    store.write(name + MANIFEST_SUFFIX, lambda f: write_all(f, text), durable="before")
    return manifest


# -- reading --------------------------------------------------------------------------------------
class _Invalid(ValueError):
    """What is wrong with a manifest field; turned into a :class:`CorruptCheckpointError`."""


def _show(value: Any) -> str:
    """``repr(value)``, shortened: values from a hostile file can be huge."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _too_deep(value: Any, limit: int) -> bool:
    """Whether JSON ``value`` nests objects and arrays more than ``limit`` deep (no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Iterable[Any] = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def load_json(raw: bytes, where: str, what: str) -> Any:
    """Decode JSON read from a checkpoint directory, or :class:`CorruptCheckpointError`.

    Every way a hostile document can fail (bad UTF-8 or syntax, nesting deeper
    than the interpreter's recursion limit or :data:`MAX_JSON_DEPTH`, an integer
    of thousands of digits) becomes the plugin's error, naming ``where``.
    """
    try:
        document = json.loads(raw)
    except RecursionError:
        document = _TOO_DEEP
    except (UnicodeDecodeError, ValueError) as exc:
        raise CorruptCheckpointError(
            f"{where}: {what} is not valid JSON ({_show(str(exc))}); the file is truncated or "
            "damaged"
        ) from None
    # A document cannot nest deeper than it has brackets: most never need the walk
    # (an RNG state's long lists made it a quarter of a small restore).
    if document is _TOO_DEEP or (
        raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and _too_deep(document, MAX_JSON_DEPTH)
    ):
        raise CorruptCheckpointError(
            f"{where}: {what} nests deeper than {MAX_JSON_DEPTH} levels; refused"
        )
    return document


_TOO_DEEP: Final = object()


def manifest_digest(body: Mapping[str, Any]) -> str:
    """The manifest's own checksum: SHA-256 of its fields (all but the checksum) as
    canonical JSON (sorted keys, no spaces). It detects any edit or damage to a
    manifest; it proves nothing about who wrote it (anyone can recompute it)."""
    text = json.dumps(
        {k: v for k, v in body.items() if k != DIGEST_FIELD},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(text.encode()).hexdigest()


def read_manifest(store: Store, name: str) -> Manifest:
    """Read and check the manifest of checkpoint ``name``.

    Raises :class:`CheckpointNotFoundError` when it does not exist,
    :class:`CorruptCheckpointError` when it is not a readable manifest (over
    :data:`MAX_MANIFEST_BYTES`, not JSON, a field missing, of the wrong type or
    out of range, its checksum or its step wrong) and
    :class:`CheckpointVersionError` when a newer format wrote it.
    """
    check_name(name, store.url)
    manifest_name = name + MANIFEST_SUFFIX
    where = store.path(manifest_name)
    try:
        raw = store.read_bytes(manifest_name, MAX_MANIFEST_BYTES)
    except FileNotFoundError:
        raise CheckpointNotFoundError(
            f"checkpoint {store.path(name)} does not exist: no manifest {manifest_name} "
            f"in {store.url}"
        ) from None
    return parse_manifest(load_json(raw, where, "the manifest"), store, name)


def read_manifest_bytes(store: Store, name: str) -> bytes:
    """The manifest file of checkpoint ``name`` as bytes (bounded, regular file only)."""
    check_name(name, store.url)
    try:
        return store.read_bytes(name + MANIFEST_SUFFIX, MAX_MANIFEST_BYTES)
    except FileNotFoundError:
        raise CheckpointNotFoundError(
            f"checkpoint {store.path(name)} does not exist: no manifest {name}{MANIFEST_SUFFIX} "
            f"in {store.url}"
        ) from None


def parse_manifest(document: Any, store: Store, name: str) -> Manifest:
    """Check a decoded manifest and turn it into a :class:`Manifest`.

    Every field is checked for type and range before anything uses it, the step
    against the checkpoint's name and the sizes of the arrays against the data
    file's recorded size, and (from format version 2) the manifest's checksum
    against its content, so nothing a manifest says is trusted unchecked.
    """
    where = store.path(name + MANIFEST_SUFFIX)
    if not isinstance(document, dict) or document.get("format") != FORMAT_NAME:
        raise CorruptCheckpointError(f"{where} is not a {FORMAT_NAME} manifest")
    found = document.get("format_version")
    if not _is_int(found):
        raise CorruptCheckpointError(f"{where}: format_version is {_show(found)}, not an integer")
    if found > FORMAT_VERSION:
        raise CheckpointVersionError(
            f"{where} was written in checkpoint format version {found} (by "
            f"{_writer_of(document)}); this monitored-checkpoint reads versions up to "
            f"{FORMAT_VERSION}: upgrade monitored-checkpoint"
        )
    try:
        if found < 1:
            raise _Invalid(f"format_version is {found}")
        step = _parse_step(document.get("step"), name)
        files = _parse_files(document.get("files"), name)
        arrays = _parse_arrays(document.get("arrays"), name, files)
        rng = _parse_rng(document.get("rng"))
        plugins = document.get("plugins")
        if not isinstance(plugins, dict) or not all(isinstance(v, dict) for v in plugins.values()):
            raise _Invalid("plugins must be an object of objects")
        created = document.get("created", 0.0)
        if not isinstance(created, int | float) or isinstance(created, bool):
            raise _Invalid(f"created is {_show(created)}")
        created = float(created)
        versions = document.get("versions", {})
        if not isinstance(versions, dict):
            raise _Invalid("versions must be an object")
    except (_Invalid, KeyError, TypeError, AttributeError, IndexError, OverflowError) as exc:
        raise CorruptCheckpointError(
            f"{where}: the manifest is incomplete or damaged ({_show(str(exc))[1:-1]})"
        ) from None
    if found >= 2 and document.get(DIGEST_FIELD) != manifest_digest(document):
        raise CorruptCheckpointError(
            f"{where}: the manifest's checksum ({DIGEST_FIELD}) does not match its content; "
            "it was edited or damaged"
        )
    return Manifest(
        name=name,
        path=store.path(name),
        step=step,
        created=created,
        format_version=found,
        rng=rng,
        plugins=plugins,
        arrays=arrays,
        files=files,
        versions={str(k): str(v) for k, v in versions.items()},
    )


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def step_of(name: str) -> int | None:
    """The global step in a checkpoint name (``model.ckpt-5`` -> 5)."""
    match = _STEP_NAME.match(name)
    return int(match["step"]) if match and len(match["step"]) <= 20 else None


def _parse_step(step: Any, name: str) -> int:
    if not _is_int(step) or not 0 <= step <= _MAX_STEP:
        raise _Invalid(f"step is {_show(step)}")
    return int(step)


def check_step_name(manifest: Manifest) -> None:
    """Refuse a manifest whose step is not the one its name ends with (``model.ckpt-5``).

    Checkpoints found in a directory are named ``<basename>-<step>``; one whose
    manifest says another step was edited or copied under another name.
    (:func:`read_manifest` itself accepts any name, for checkpoints written
    under names of the caller's choosing.)
    """
    named = step_of(manifest.name)
    if named is not None and named != manifest.step:
        raise CorruptCheckpointError(
            f"{manifest.path}{MANIFEST_SUFFIX}: the manifest says step {manifest.step}, but the "
            f"checkpoint is named for step {named}; it was edited or renamed"
        )


def _parse_files(files: Any, name: str) -> dict[str, FileInfo]:
    """The one data file, ``<name>.safetensors``: a manifest can name no other file."""
    data_name = name + DATA_SUFFIX
    if not isinstance(files, dict) or list(files) != [data_name]:
        shown = _show(sorted(files)[:3]) if isinstance(files, dict) else _show(files)
        raise _Invalid(f"files must name exactly {data_name!r}, not {shown}")
    info = files[data_name]
    size, crc = info["size"], info["crc32"]
    if not _is_int(size) or not 8 <= size <= _MAX_FILE:
        raise _Invalid(f"the size of {data_name} is {_show(size)}")
    if not isinstance(crc, str) or not _CRC.fullmatch(crc):
        raise _Invalid(f"the crc32 of {data_name} is {_show(crc)}")
    return {data_name: FileInfo(size, int(crc, 16))}


def _parse_arrays(arrays: Any, name: str, files: dict[str, FileInfo]) -> dict[str, ArrayInfo]:
    """Each array's dtype (allow-listed), shape and module, and their total against the file."""
    if not isinstance(arrays, dict):
        raise _Invalid("arrays must be an object")
    [(data_name, info)] = files.items()
    parsed: dict[str, ArrayInfo] = {}
    total = 0
    for entry, a in arrays.items():
        if not entry or entry == "__metadata__" or not isinstance(a, dict):
            raise _Invalid(f"array entry {_show(entry)} is damaged")
        dtype, shape, module, file = a["dtype"], a["shape"], a["module"], a["file"]
        if dtype not in _ITEMSIZE:
            raise _Invalid(f"array {_show(entry)} has the unknown dtype {_show(dtype)}")
        if (
            not isinstance(shape, list)
            or len(shape) > _MAX_NDIM
            or not all(_is_int(d) and 0 <= d <= _MAX_FILE for d in shape)
        ):
            raise _Invalid(f"array {_show(entry)} has the shape {_show(shape)}")
        if module not in ("numpy", "cupy"):
            raise _Invalid(f"array {_show(entry)} has the array module {_show(module)}")
        if file != data_name:
            raise _Invalid(f"array {_show(entry)} is in {_show(file)}, not in {data_name!r}")
        total += math.prod(shape) * _ITEMSIZE[dtype]
        if total > info.size - 8:
            raise _Invalid(
                f"the arrays need more than the {info.size} bytes of {data_name} "
                f"(from {_show(entry)} on)"
            )
        parsed[entry] = ArrayInfo(dtype, tuple(shape), module, file)
    return parsed


#: One bit generator of each kind per thread, to check RNG states on: a new one
#: seeds itself from the OS (a fifth of a small restore's time).
_TRIALS = threading.local()


def _trial_generator(kind: str) -> Any:
    trials: dict[str, Any] | None = getattr(_TRIALS, "generators", None)
    if trials is None:
        trials = _TRIALS.generators = {}
    trial = trials.get(kind)
    if trial is None:
        trial = trials[kind] = getattr(np.random, kind)(0)
    return trial


def _parse_rng(rng: Any) -> dict[str, Any]:
    """The RNG state, checked by loading it into a fresh bit generator of its kind."""
    if not isinstance(rng, dict):
        raise _Invalid("rng must be an object")
    kind = rng.get("bit_generator")
    if kind not in _BIT_GENERATORS:
        raise _Invalid(f"the RNG's bit generator {_show(kind)} is not one of NumPy's")
    try:
        _trial_generator(kind).state = decode_rng_state(rng)
    except (TypeError, ValueError, KeyError, OverflowError, AttributeError, IndexError) as exc:
        raise _Invalid(f"the RNG state is not a valid {kind} state ({_show(str(exc))})") from None
    return rng


def check_session_plugin_states(manifest: Manifest) -> None:
    """Check that every plugin entry has the session's layout: ``{"version": n, "state": {}}``.

    What :meth:`monitored.MonitoredSession.load_plugin_states` expects; checked
    here so that a damaged entry is this checkpoint's damage (an older checkpoint
    is restored instead), named with its plugin, not an error from the core.
    """
    for plugin, entry in manifest.plugins.items():
        version, state = entry.get("version"), entry.get("state")
        if not _is_int(version) or version < 1 or not isinstance(state, dict):
            raise CorruptCheckpointError(
                f"{manifest.path}{MANIFEST_SUFFIX}: the state saved for plugin {_show(plugin)} "
                f"is damaged (want {{'version': int >= 1, 'state': {{...}}}}, got "
                f"version {_show(version)} and a state of type {type(state).__name__})"
            )


def _writer_of(document: dict[str, Any]) -> str:
    versions = document.get("versions")
    if isinstance(versions, dict) and isinstance(versions.get("monitored-checkpoint"), str):
        return f"monitored-checkpoint {_show(versions['monitored-checkpoint'])[1:-1]}"
    return "a newer monitored-checkpoint"


def looks_like_our_data_file(store: Store, name: str, *, strict: bool = False) -> bool:
    """Whether the file ``name`` starts as every data file of ours does, or is torn before.

    Decided from its first bytes (our header starts with our ``__metadata__``),
    so a header of any size is recognized. Unless ``strict`` (before deleting
    it), a file too short to tell (a write torn on a store without rename)
    counts as ours when it is named as ours are.
    """
    try:
        with store.open_file(name) as (file, _):
            head = file.read(8 + len(_OUR_HEADER_START))
    except (OSError, CheckpointError):
        return False
    body = head[8:]
    if len(body) == len(_OUR_HEADER_START) or strict:
        return body == _OUR_HEADER_START
    named_as_ours = name.endswith(DATA_SUFFIX) and step_of(name[: -len(DATA_SUFFIX)]) is not None
    return named_as_ours and _OUR_HEADER_START.startswith(body)


def read_arrays(
    store: Store,
    manifest: Manifest,
    into: Mapping[str, np.ndarray[Any, Any]] | None = None,
    *,
    digest: Any = None,
) -> dict[str, np.ndarray[Any, Any]]:
    """Read every array of ``manifest``, checking sizes, header and CRC-32.

    ``digest``, a ``hashlib`` object, is fed every byte of the data file as it
    is read (for :func:`~monitored_checkpoint.checkpoint_digest` checks).

    Nothing is allocated before the data file's size and header agree with the
    manifest, so a manifest cannot make the reader allocate more than the file
    holds. An array of ``into`` with the same shape and dtype that is
    C-contiguous and writable is read into in place (no extra copy, references
    to it stay valid); other arrays are newly allocated. Raises
    :class:`CorruptCheckpointError` naming the file and what is wrong; arrays
    read into in place then hold garbage (:func:`~monitored_checkpoint.restore`
    therefore reads into new arrays and copies only once all is verified).
    """
    into = into or {}
    specs = {
        n: (dtype_from_name(a.dtype, manifest.path), a.shape) for n, a in manifest.arrays.items()
    }
    [(file_name, info)] = manifest.files.items()
    return _read_file(store, manifest, file_name, info, specs, into, digest, keep=True)


def verify_arrays(store: Store, manifest: Manifest, *, digest: Any = None) -> None:
    """Check the data file of ``manifest`` as :func:`read_arrays` does, keeping nothing.

    Sizes, header and CRC-32, read through two reused buffers of at most 16 MiB:
    what lets a restore into arrays a state already has check everything before
    it overwrites a single byte of them, without a second copy of the state.
    """
    specs = {
        n: (dtype_from_name(a.dtype, manifest.path), a.shape) for n, a in manifest.arrays.items()
    }
    [(file_name, info)] = manifest.files.items()
    _read_file(store, manifest, file_name, info, specs, {}, digest, keep=False)


_Spec = tuple[np.dtype[Any], tuple[int, ...]]


def _target(spec: _Spec, existing: np.ndarray[Any, Any] | None) -> np.ndarray[Any, Any]:
    dtype, shape = spec
    if (
        isinstance(existing, np.ndarray)
        and existing.shape == shape
        and existing.dtype == dtype
        and existing.flags.c_contiguous
        and existing.flags.writeable
    ):
        return existing
    return np.empty(shape, dtype)


def _read_file(
    store: Store,
    manifest: Manifest,
    file_name: str,
    info: FileInfo,
    specs: dict[str, _Spec],
    into: Mapping[str, np.ndarray[Any, Any]],
    digest: Any,
    *,
    keep: bool,
) -> dict[str, np.ndarray[Any, Any]]:
    where = store.path(file_name)
    with contextlib.ExitStack() as stack:
        try:
            file, size = stack.enter_context(store.open_file(file_name))
        except FileNotFoundError:
            if store.stamp(manifest.name + MANIFEST_SUFFIX) is None:
                # Rotation deleted the checkpoint (manifest first) after its manifest was read.
                raise CheckpointNotFoundError(
                    f"checkpoint {manifest.path} was deleted while it was being read (its "
                    "manifest and data file are gone): the writer keeps only its newest few"
                ) from None
            raise CorruptCheckpointError(f"{where}: the data file is missing") from None
        if size != info.size:
            raise CorruptCheckpointError(
                f"{where}: the data file has {size} bytes, the manifest says {info.size}; it is "
                "truncated or was replaced"
            )
        prefix = _read_exactly(file, 8, where)
        (length,) = struct.unpack("<Q", prefix)
        if length > min(_MAX_HEADER, size - 8):
            raise CorruptCheckpointError(f"{where}: the safetensors header length is damaged")
        header_bytes = _read_exactly(file, length, where)
        order = _check_header(header_bytes, specs, manifest, where, size - 8 - length)
        # Only now, with every size checked against the file, is memory allocated.
        targets = {n: _target(specs[n], into.get(n)) for n in order} if keep else {}
        inline = size < _INLINE_CRC_BYTES
        if keep:
            hasher = _Crc32Follower(prefix + header_bytes, digest, inline=inline)
        else:
            scratch = _Scratch(size - 8 - length)
            hasher = _Crc32Follower(prefix + header_bytes, digest, scratch.gate, inline=inline)
        try:
            if keep:
                for name in order:
                    view = _byte_view(targets[name])
                    for start in range(0, view.nbytes, _CHUNK):
                        chunk = view[start : start + _CHUNK]
                        _readinto_exactly(file, chunk, where)
                        hasher.add(chunk)
            else:
                for chunk in scratch.chunks():
                    _readinto_exactly(file, chunk, where)
                    hasher.add(chunk)
            trailing = file.read(1)
        finally:
            checksum = hasher.result()
    if trailing:
        raise CorruptCheckpointError(f"{where}: unexpected bytes after the last array")
    if checksum != info.crc32:
        raise CorruptCheckpointError(
            f"{where}: checksum mismatch (CRC-32 {checksum:08x}, the manifest says "
            f"{info.crc32:08x}); the file is damaged"
        )
    return targets


def _check_header(
    header_bytes: bytes, specs: dict[str, _Spec], manifest: Manifest, where: str, data_size: int
) -> list[str]:
    """The arrays' names in file order, after checking the header against the manifest.

    The header's ``__metadata__`` must be ours with the manifest's step and format
    version (a manifest cannot be pointed at another checkpoint's data file), and
    its entries must lie end to end and fill the file exactly.
    """
    header = load_json(header_bytes, where, "the safetensors header")
    if not isinstance(header, dict):
        raise CorruptCheckpointError(f"{where}: the safetensors header is not valid JSON")
    metadata = header.pop("__metadata__", None)
    expected = {
        "format": FORMAT_NAME,
        "format_version": str(manifest.format_version),
        "step": str(manifest.step),
    }
    if not isinstance(metadata, dict) or any(metadata.get(k) != v for k, v in expected.items()):
        raise CorruptCheckpointError(
            f"{where}: the data file's metadata {_show(metadata)} does not match the manifest "
            f"(step {manifest.step}, format version {manifest.format_version}); the manifest "
            "does not belong to this data file"
        )
    if set(header) != set(specs):
        raise CorruptCheckpointError(
            f"{where}: the file holds arrays {_show(sorted(header))}, the manifest lists "
            f"{_show(sorted(specs))}"
        )
    for entry in header.values():
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_is_int, offsets)):
            raise CorruptCheckpointError(
                f"{where}: the safetensors header is damaged (an entry without valid "
                f"data_offsets: {_show(entry)})"
            )
    entries = sorted(header.items(), key=lambda item: int(item[1]["data_offsets"][0]))
    offset = 0
    for name, entry in entries:
        dtype, shape = specs[name]
        nbytes = math.prod(shape) * dtype.itemsize
        start, end = entry["data_offsets"]
        if not (
            entry.get("dtype") == _TAGS.get(dtype_name(dtype))
            and entry.get("shape") == list(shape)
            and start == offset
            and end - start == nbytes
        ):
            raise CorruptCheckpointError(
                f"{where}: the safetensors header entry of {_show(name)} ({_show(entry)}) does "
                f"not match the manifest ({dtype} {shape})"
            )
        offset += nbytes
    if offset != data_size:
        raise CorruptCheckpointError(
            f"{where}: the arrays take {offset} bytes, the file holds {data_size} after its header"
        )
    return [name for name, _ in entries]


def _read_exactly(file: BinaryIO, n: int, where: str) -> bytes:
    data = file.read(n)
    if len(data) != n:
        raise CorruptCheckpointError(f"{where}: the file ends early (truncated)")
    return data


class _ReadInto(Protocol):
    def readinto(self, buffer: memoryview, /) -> int | None: ...


def _readinto_exactly(file: BinaryIO, view: memoryview, where: str) -> None:
    reader = cast(_ReadInto, file)
    while view.nbytes:
        n = reader.readinto(view)
        if not n:
            raise CorruptCheckpointError(f"{where}: the file ends early (truncated)")
        view = view[n:]


@final
class _Scratch:
    """Two buffers that a verifying read fills in turn, for ``nbytes`` bytes in all.

    ``gate`` counts the buffers free to fill: the reader takes one before it
    fills a buffer, the checksum thread gives it back once that buffer is
    checksummed, so a buffer is never refilled while it is being read.
    """

    __slots__ = ("_buffers", "gate", "nbytes")

    _SIZE: Final = 16 << 20

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        size = min(self._SIZE, nbytes)
        self._buffers = [np.empty(size, np.uint8) for _ in range(2 if size else 0)]
        self.gate = threading.Semaphore(len(self._buffers))

    def chunks(self) -> Iterable[memoryview]:
        left, turn = self.nbytes, 0
        while left:
            n = min(left, self._SIZE)
            self.gate.acquire()
            yield self._buffers[turn % 2].data[:n]
            left -= n
            turn += 1


@final
class _Crc32Follower:
    """Checksums chunks in a thread while the reader fills the next ones."""

    __slots__ = ("_also", "_gate", "_queue", "_thread", "_value")

    def __init__(
        self,
        first: bytes,
        also: Any = None,
        gate: threading.Semaphore | None = None,
        *,
        inline: bool = False,
    ) -> None:
        self._value = crc32(first)
        #: Released after each chunk (see :class:`_Scratch`), or None.
        self._gate = gate
        #: A hashlib object fed the same bytes (a provenance digest), or None.
        self._also = also
        if also is not None:
            also.update(first)
        self._queue: queue.SimpleQueue[memoryview | None] = queue.SimpleQueue()
        #: ``None`` when checksumming on the caller's thread (``inline``: a small
        #: file, where starting a thread and handing it each chunk costs more).
        self._thread: threading.Thread | None = None
        if not inline:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()

    def _run(self) -> None:
        value, also, gate = self._value, self._also, self._gate
        while (chunk := self._queue.get()) is not None:
            value = crc32(chunk, value)
            if also is not None:
                also.update(chunk)
            if gate is not None:
                gate.release()
        self._value = value

    def add(self, chunk: memoryview) -> None:
        if self._thread is not None:
            self._queue.put(chunk)
            return
        self._value = crc32(chunk, self._value)
        if self._also is not None:
            self._also.update(chunk)
        if self._gate is not None:
            self._gate.release()

    def result(self) -> int:
        if self._thread is None:
            return self._value
        self._queue.put(None)
        self._thread.join()
        return self._value
