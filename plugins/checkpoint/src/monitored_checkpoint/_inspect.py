"""Looking inside checkpoints: listing a directory, array statistics, comparing, verifying.

What ``monitored checkpoint ls/show/diff/verify`` do, as functions. Everything
is read through the plugin's own reader, exactly as a restore reads it (plain
names inside the directory, regular files only, manifests bounded in size,
every size and checksum checked before memory is allocated), so a directory
from someone else can at worst be refused with a :class:`CheckpointError`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Final, final

import numpy as np

from ._errors import CheckpointError, CheckpointNotFoundError, CorruptCheckpointError
from ._format import (
    DATA_SUFFIX,
    MANIFEST_SUFFIX,
    Manifest,
    check_step_name,
    read_manifest,
    step_of,
    verify_arrays,
)
from ._reader import read_checkpoint
from ._saver import (
    _manifest_names,
    checkpoint_state,
    latest_checkpoint,
    split_save_path,
)
from ._store import Store, open_store

__all__ = [
    "ArrayStats",
    "CheckpointDiff",
    "CheckpointRow",
    "array_stats",
    "diff_checkpoints",
    "list_checkpoints",
    "verify",
]

#: Elements compared per chunk, so a diff of large arrays needs little extra memory.
_CHUNK: Final = 1 << 20


# -- ls -------------------------------------------------------------------------------------------
@final
@dataclass(frozen=True, slots=True)
class CheckpointRow:
    """One checkpoint of a directory, as ``monitored checkpoint ls`` lists it."""

    name: str
    path: str
    step: int
    #: When it was written (seconds since the epoch), ``None`` when it is damaged.
    created: float | None
    #: Bytes on disk (data file and manifest), ``None`` when they cannot be read.
    size: int | None
    arrays: int | None
    #: Whether it is the newest: the state file's latest, else the highest step.
    newest: bool
    #: Whether it is on disk but no longer in the state file's kept list, so no
    #: rotation deletes it (``keep_checkpoint_every_n_hours``, or ``max_to_keep=None``);
    #: ``None`` when there is no state file of ours to tell.
    kept_forever: bool | None
    #: What is wrong with it, ``None`` when its manifest reads well and its data
    #: files have the sizes it records.
    problem: str | None = None
    #: Whether a restore would use it: the first in a restore's order (the state
    #: file's checkpoints newest first, then the others by step) with no ``problem``.
    #: Usually the newest; another when the newest is damaged, the restore then
    #: skipping it. Only the manifest and the files' sizes are read, not the bytes:
    #: ``verify`` checks their CRC-32 too.
    restored: bool = False


def list_checkpoints(directory: str | os.PathLike[str]) -> list[CheckpointRow]:
    """Every checkpoint of ``directory`` (those with a manifest), oldest step first.

    Reads the manifests only (their data files are sized, not read). A damaged
    checkpoint is listed with its ``problem``, and the one a restore would use
    is marked ``restored``; a directory that does not exist or is not one is a
    :class:`CheckpointNotFoundError`.
    """
    store = open_store(directory)
    if not store.is_directory():
        raise CheckpointNotFoundError(f"{store.url} is not a directory of checkpoints")
    names = store.list()
    try:
        state = checkpoint_state(store.url)
    except CorruptCheckpointError:
        state = None
    kept = set(state.names) if state is not None and state.ours else None
    newest = latest_checkpoint(store.url)
    listed = _manifest_names(store, names)
    # restore_latest's order: the state file's checkpoints (when ours) newest first, then
    # every other by step, highest first.
    ours = state.names if state is not None and state.ours else ()
    order = [n for n in reversed(ours) if n in listed]
    order += [n for n in listed if n not in order]
    rows: dict[str, CheckpointRow] = {}
    for name in listed:
        path = store.path(name)
        forever = None if kept is None else name not in kept
        step = step_of(name) or 0  # listed names all end with their step
        try:
            manifest = read_manifest(store, name)
            check_step_name(manifest)
        except CheckpointError as exc:
            rows[name] = CheckpointRow(
                name, path, step, None, None, None, path == newest, forever, str(exc)
            )
            continue
        rows[name] = CheckpointRow(
            name,
            path,
            manifest.step,
            manifest.created,
            _size_on_disk(store, name),
            len(manifest.arrays),
            path == newest,
            forever,
            _data_problem(store, manifest),
        )
    restored = next((n for n in order if rows[n].problem is None), None)
    if restored is not None:
        rows[restored] = replace(rows[restored], restored=True)
    return [rows[name] for name in reversed(listed)]


def _data_problem(store: Store, manifest: Manifest) -> str | None:
    """Why a restore would refuse ``manifest``'s data files by their size alone, if it would."""
    for file, info in sorted(manifest.files.items()):
        try:
            size = store.size(file)
        except FileNotFoundError:
            return f"the data file {file} is missing"
        except (OSError, CheckpointError) as exc:
            return f"the data file {file} cannot be read: {exc}"
        if size != info.size:
            return (
                f"the data file {file} has {size} bytes, the manifest says {info.size}; "
                "it is truncated or was replaced"
            )
    return None


def _size_on_disk(store: Store, name: str) -> int | None:
    try:
        return store.size(name + DATA_SUFFIX) + store.size(name + MANIFEST_SUFFIX)
    except (OSError, CheckpointError):
        return None


# -- show --stats ---------------------------------------------------------------------------------
@final
@dataclass(frozen=True, slots=True)
class ArrayStats:
    """Minimum, maximum and mean of an array's values (NaNs left out), and its NaN count.

    ``None`` where there is no value to take them of (an empty or all-NaN array).
    Complex arrays are described by their magnitudes.
    """

    min: float | int | None
    max: float | int | None
    mean: float | None
    nan: int


def array_stats(array: np.ndarray[Any, Any]) -> ArrayStats:
    """The :class:`ArrayStats` of ``array`` (bfloat16 and float8 through float32)."""
    values = _numeric(array)
    nan = int(np.count_nonzero(np.isnan(values))) if values.dtype.kind == "f" else 0
    if values.size == nan:
        return ArrayStats(None, None, None, nan)
    with np.errstate(all="ignore"):
        if nan:
            low, high = np.nanmin(values), np.nanmax(values)
            mean = np.nanmean(values, dtype=np.float64)
        else:
            low, high = values.min(), values.max()
            mean = values.mean(dtype=np.float64)
    return ArrayStats(low.item(), high.item(), float(mean), nan)


def _numeric(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``array`` as NumPy numbers that ``min``/``max``/``isnan`` take."""
    kind = array.dtype.kind
    if kind == "b":
        return array.astype(np.uint8)
    if kind == "c":
        magnitudes: np.ndarray[Any, Any] = np.abs(array)
        return magnitudes
    if kind in "iuf":
        return array
    return array.astype(np.float32)  # bfloat16, float8: ml_dtypes' own kinds


# -- diff -----------------------------------------------------------------------------------------
@final
@dataclass(slots=True)
class CheckpointDiff:
    """How two checkpoints differ in everything a restore puts back."""

    a: Manifest
    b: Manifest
    only_a: list[str] = field(default_factory=list)
    only_b: list[str] = field(default_factory=list)
    #: ``name -> ("float32 (8, 3)", "float64 (8, 3)")`` for arrays of another dtype or shape.
    mismatched: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: ``name -> (max |a - b|, bit-for-bit equal)`` for arrays of the same dtype and shape;
    #: a NaN on one side only counts as an infinite difference.
    compared: dict[str, tuple[float, bool]] = field(default_factory=dict)
    #: Plugins whose saved state differs (or is in one checkpoint only).
    plugins: list[str] = field(default_factory=list)

    @property
    def same_step(self) -> bool:
        """Whether both are of the same global step."""
        return self.a.step == self.b.step

    @property
    def same_rng(self) -> bool:
        """Whether both hold the same RNG state."""
        return self.a.rng == self.b.rng

    @property
    def equal(self) -> bool:
        """Whether restoring either gives the same state: arrays bit for bit, step, RNG, plugins."""
        return (
            not (self.only_a or self.only_b or self.mismatched or self.plugins)
            and all(equal for _, equal in self.compared.values())
            and self.same_step
            and self.same_rng
        )


def diff_checkpoints(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> CheckpointDiff:
    """Compare two checkpoints (or directories' newest), both read and verified whole."""
    manifest_a, arrays_a = read_checkpoint(a)
    manifest_b, arrays_b = read_checkpoint(b)
    diff = CheckpointDiff(manifest_a, manifest_b)
    diff.only_a = sorted(set(arrays_a) - set(arrays_b))
    diff.only_b = sorted(set(arrays_b) - set(arrays_a))
    for name in sorted(set(arrays_a) & set(arrays_b)):
        x, y = arrays_a[name], arrays_b[name]
        if x.dtype != y.dtype or x.shape != y.shape:
            diff.mismatched[name] = (f"{x.dtype} {x.shape}", f"{y.dtype} {y.shape}")
            continue
        diff.compared[name] = (_max_abs_difference(x, y), _same_bits(x, y))
    plugins = set(manifest_a.plugins) | set(manifest_b.plugins)
    diff.plugins = sorted(
        p for p in plugins if manifest_a.plugins.get(p) != manifest_b.plugins.get(p)
    )
    return diff


def _chunks(x: np.ndarray[Any, Any], y: np.ndarray[Any, Any]) -> Iterator[tuple[Any, Any]]:
    flat_x, flat_y = x.reshape(-1), y.reshape(-1)
    for start in range(0, flat_x.size, _CHUNK):
        yield flat_x[start : start + _CHUNK], flat_y[start : start + _CHUNK]


def _same_bits(x: np.ndarray[Any, Any], y: np.ndarray[Any, Any]) -> bool:
    return all(
        np.array_equal(cx.view(np.uint8), cy.view(np.uint8))
        for cx, cy in _chunks(np.ascontiguousarray(x), np.ascontiguousarray(y))
    )


def _max_abs_difference(x: np.ndarray[Any, Any], y: np.ndarray[Any, Any]) -> float:
    widest = np.complex128 if x.dtype.kind == "c" else np.float64
    largest = 0.0
    with np.errstate(all="ignore"):
        for cx, cy in _chunks(x, y):
            fx, fy = cx.astype(widest), cy.astype(widest)
            same = (fx == fy) | (np.isnan(fx) & np.isnan(fy))
            gap = np.where(same, 0.0, np.abs(fx - fy))
            if gap.size:
                largest = max(largest, float(np.nan_to_num(gap, nan=math.inf).max()))
    return largest


# -- verify ---------------------------------------------------------------------------------------
def verify(path: str | os.PathLike[str]) -> tuple[list[str], list[str]]:
    """Check a directory's checkpoints (or one checkpoint): ``(checked paths, problems)``.

    Every checkpoint's manifest (fields, its own checksum, its step against its
    name) and data file (size, header against the manifest, CRC-32), and the
    directory's state file (parses, written by this package, lists only
    checkpoints that exist). Each problem names the file and what is wrong.
    """
    given = os.fspath(path)
    store = open_store(given)
    problems: list[str] = []
    if store.is_directory():
        names = store.list()
        problems += _state_file_problems(store, names)
        checkpoints = list(reversed(_manifest_names(store, names)))
        if not checkpoints:
            problems.append(f"{store.url} holds no checkpoint (no manifest *{MANIFEST_SUFFIX})")
    else:
        store, name = split_save_path(given.rstrip("/"))
        if name + MANIFEST_SUFFIX not in store.list():
            raise CheckpointNotFoundError(
                f"{given} is neither a directory nor a checkpoint (no {name}{MANIFEST_SUFFIX} "
                "beside it)"
            )
        checkpoints = [name]
    for name in checkpoints:
        try:
            manifest = read_manifest(store, name)
            check_step_name(manifest)
            verify_arrays(store, manifest)
        except CheckpointError as exc:
            problems.append(str(exc))
    return [store.path(name) for name in checkpoints], problems


def _state_file_problems(store: Store, names: list[str]) -> list[str]:
    try:
        state = checkpoint_state(store.url)
    except CheckpointError as exc:
        return [str(exc)]
    if state is None:
        return []
    where = store.path("checkpoint")
    if not state.ours:
        return [f"{where} was not written by monitored-checkpoint"]
    present = set(names)
    return [
        f"{where} lists {name}, which has no manifest {name}{MANIFEST_SUFFIX}"
        for name in state.names
        if name + MANIFEST_SUFFIX not in present
    ]
