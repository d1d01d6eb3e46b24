"""NumPy or CuPy, chosen per array.

CuPy is imported only when a CuPy array is actually seen, so CPU-only machines
never import it. :func:`to_host` moves a whole batch of values to host memory in
one device-to-host transfer per device, which is how every hook's fetches reach
it: one transfer per step, however many hooks asked.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from types import ModuleType
from typing import Any, final

import numpy as np

__all__ = [
    "DeviceCopy",
    "array_module",
    "copy_to_host",
    "is_array",
    "is_device_array",
    "start_device_copy",
    "to_host",
    "to_scalar",
]


def is_device_array(value: object) -> bool:
    """Whether ``value`` is a CuPy array (decided without importing CuPy)."""
    return type(value).__module__.startswith("cupy")


def is_array(value: object) -> bool:
    """Whether ``value`` is a NumPy or CuPy ``ndarray``."""
    return isinstance(value, np.ndarray) or (
        is_device_array(value) and hasattr(value, "shape") and hasattr(value, "dtype")
    )


def array_module(value: object) -> ModuleType:
    """The array module (``numpy`` or ``cupy``) that owns ``value``."""
    if is_device_array(value):
        import cupy

        module: ModuleType = cupy
        return module
    return np


def to_host(values: Sequence[Any]) -> list[np.ndarray]:
    """Copy ``values`` to host memory as NumPy arrays.

    NumPy arrays and Python scalars are copied (a hook must not see a parameter
    change under it after the step); CuPy arrays on one device are packed into a
    single device buffer and copied with one transfer, then split on the host.
    """
    out: list[Any] = [None] * len(values)
    on_device: list[int] = []
    for i, value in enumerate(values):
        if is_device_array(value):
            on_device.append(i)
        else:
            out[i] = np.array(value, copy=True)
    if on_device:
        _device_to_host(values, on_device, out)
    return out


def to_scalar(value: Any, what: str, step: int, error: type[Exception] = ValueError) -> float:
    """``value`` (a host array of one element, or a number) as a Python float.

    For hooks that judge one value a step fetched (a loss, a monitored metric):
    anything else raises ``error`` with a message naming ``what`` (e.g.
    ``"EarlyStoppingHook: monitor 'loss'"``) and the step, so each plugin reports
    it as its own error.
    """
    if getattr(value, "ndim", 0):
        if value.size != 1:
            raise error(
                f"{what} must be a scalar, but at step {step} it has shape {tuple(value.shape)}"
            )
        value = value.reshape(())
    try:
        return float(value)
    except (TypeError, ValueError):
        raise error(
            f"{what} must be a number, but at step {step} it is {type(value).__name__}"
        ) from None


def copy_to_host(values: Sequence[Any], indices: Sequence[int], out: list[Any]) -> None:
    """Copy the CuPy arrays ``values[i]`` for ``i`` in ``indices`` into ``out[i]``, now.

    One blocking transfer per device (the arrays of a device are packed first).
    """
    _device_to_host(values, list(indices), out)


def _device_to_host(values: Sequence[Any], indices: list[int], out: list[Any]) -> None:
    import cupy

    by_device: dict[int, list[int]] = {}
    for i in indices:
        by_device.setdefault(values[i].device.id, []).append(i)
    for device_id, group in by_device.items():
        with cupy.cuda.Device(device_id):
            if len(group) == 1:
                out[group[0]] = cupy.asnumpy(values[group[0]])
                continue
            packed, layouts = _pack(cupy, [values[i] for i in group])
            host = cupy.asnumpy(packed)
            for i, (offset, shape, dtype, nbytes) in zip(group, layouts, strict=True):
                out[i] = host[offset : offset + nbytes].view(dtype).reshape(shape)


#: A value's place in a packed buffer: (offset, shape, dtype, nbytes).
_Layout = tuple[int, tuple[int, ...], Any, int]


def _pack(cupy: Any, arrays: Sequence[Any]) -> tuple[Any, list[_Layout]]:
    """``arrays`` packed into one new device buffer of bytes, and where each lies in it.

    Each value starts at a multiple of its dtype's alignment (padding is added after
    an odd-sized value), so the host views unpacked from the buffer are aligned:
    misaligned views are slower in every operation. The layouts keep each array's
    **own** shape: ``cupy.ascontiguousarray`` (like NumPy's) turns a 0-d array into
    shape ``(1,)``, so shapes are never taken from the contiguous copies.
    """
    layouts: list[_Layout] = []
    pieces = []
    total = 0
    for array in arrays:
        pad = -total % array.dtype.alignment
        if pad:
            pieces.append(cupy.empty((pad,), dtype=cupy.uint8))
            total += pad
        layouts.append((total, array.shape, array.dtype, array.nbytes))
        pieces.append(cupy.ascontiguousarray(array).reshape(-1).view(cupy.uint8))
        total += array.nbytes
    # One value is copied too: the buffer is a snapshot, which later kernels (the
    # next step's in-place updates) cannot change.
    packed = cupy.concatenate(pieces) if len(pieces) > 1 else pieces[0].copy()
    return packed, layouts


#: One copy stream per device, created when a late transfer first needs it.
_copy_streams: dict[int, Any] = {}


@final
class DeviceCopy:
    """Device-to-host copies issued without waiting, collected later with :meth:`finish`.

    Per device, the arrays are packed into one device buffer **on the current
    stream** (a snapshot: kernels queued after it, such as the next step's in-place
    updates, cannot change what is copied), an event marks the end of the pack, and
    a side stream waits for that event and copies the buffer into pinned host
    memory, recording a second event. Nothing here waits for the device; only
    :meth:`finish` waits, for the copy's event, which has normally long passed by
    the next step.
    """

    __slots__ = ("_groups",)

    def __init__(self, groups: list[tuple[list[int], list[_Layout], Any, Any, Any]]) -> None:
        #: Per device: (indices, layout of each array, packed device buffer, pinned
        #: host buffer, event recorded after the copy).
        self._groups = groups

    def finish(self, out: list[Any]) -> None:
        """Wait for the copies and put each array's host value at its index in ``out``."""
        groups, self._groups = self._groups, []
        for indices, layouts, _packed, host, done in groups:
            done.synchronize()
            for i, (offset, shape, dtype, nbytes) in zip(indices, layouts, strict=True):
                # Copied out of the pinned buffer, so that hooks keeping values do not
                # hold page-locked memory, which the pool can then reuse at once.
                out[i] = host[offset : offset + nbytes].view(dtype).reshape(shape).copy()

    def discard(self) -> None:
        """Forget the copies, once they have ended; the values are not wanted.

        The buffers are released only after the copy's event: released at once, the
        pool could hand the device buffer to new kernels, and the pinned buffer to
        new host data, while the side stream still reads the one and writes the
        other. Should waiting fail (the device failed), the buffers are kept for the
        life of the process and the error is logged: this runs while a session is
        being torn down for another failure, whose clean-up must go on.
        """
        groups, self._groups = self._groups, []
        for group in groups:
            try:
                group[4].synchronize()
            except Exception:
                _abandoned.append(group)
                logging.getLogger("monitored").exception(
                    "waiting for a device-to-host copy to end failed; its buffers are kept"
                )


#: Buffers of copies that could not be waited for (see :meth:`DeviceCopy.discard`).
_abandoned: list[Any] = []


def start_device_copy(values: Sequence[Any], indices: Sequence[int]) -> DeviceCopy:
    """Start copying the CuPy arrays ``values[i]`` (``i`` in ``indices``) to the host.

    Returns at once; :meth:`DeviceCopy.finish` collects the values. See
    :class:`DeviceCopy` for how the copy stays ordered and asynchronous.
    """
    import cupy
    import cupyx

    by_device: dict[int, list[int]] = {}
    for i in indices:
        by_device.setdefault(values[i].device.id, []).append(i)
    groups = []
    for device_id, group in by_device.items():
        with cupy.cuda.Device(device_id):
            packed, layouts = _pack(cupy, [values[i] for i in group])
            packed_event = cupy.cuda.Event(block=False, disable_timing=True)
            packed_event.record()
            stream = _copy_streams.get(device_id)
            if stream is None:
                stream = _copy_streams[device_id] = cupy.cuda.Stream(non_blocking=True)
            stream.wait_event(packed_event)
            host = cupyx.empty_pinned((packed.nbytes,), dtype=np.uint8)
            cupy.asnumpy(packed, stream=stream, out=host, blocking=False)
            done = cupy.cuda.Event(block=False, disable_timing=True)
            done.record(stream)
            # ``packed`` stays referenced until finish: its memory must not be reused
            # by the pool while the side stream still reads it.
            groups.append((group, layouts, packed, host, done))
    return DeviceCopy(groups)
