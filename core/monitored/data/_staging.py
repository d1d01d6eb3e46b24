"""GPU staging: the next batch goes to the device while the current step runs.

Host batches are copied into page-locked (pinned) host buffers and from there to
the device on a CUDA stream of their own, so the copy of batch *k + 1* overlaps
step *k*. A ring of pinned buffer sets is used in turn; a set is reused only once
the copy that read it has finished, which is the one place the host waits for the
device. Each copy is ordered after the work queued on the step's stream when it
is issued (its device buffers come from that stream's pool), so the copy that last
read a set ends only after the steps queued before it: with ``slots`` sets the host
runs up to about ``slots`` steps ahead of the GPU before it waits. The step's
stream waits on the copy's event (a device-side wait, no host sync).

Leaves CuPy cannot hold (strings, Python objects, bfloat16 and other dtypes CuPy
has no kernels for) stay on the host, as they are. CuPy is imported only when a
pipeline is made with ``device=True``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._structure import flatten, map_leaves

__all__ = ["DeviceStager"]

#: The dtypes CuPy holds (``numpy.dtype.char``): bool, the signed and unsigned
#: integers, float16/32/64 and complex64/128. Anything else stays on the host.
_DEVICE_DTYPES = frozenset("?bBhHiIlLqQefdFD")


class DeviceStager:
    """Copies batches to the current CUDA device ahead of use, through ``slots`` pinned sets."""

    __slots__ = ("_cupy", "_cupyx", "_events", "_pending", "_pinned", "_slot", "_stream")

    def __init__(self, slots: int = 4) -> None:
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 2:
            raise ValueError(f"DeviceStager needs slots >= 2 (an int), got {slots!r}")
        try:
            import cupy
            import cupyx
        except ImportError as exc:
            raise ImportError(
                "prefetch(..., device=True) copies batches to the GPU and needs CuPy: "
                "pip install 'monitored[gpu]'"
            ) from exc
        self._cupy: Any = cupy
        self._cupyx: Any = cupyx
        self._stream: Any = None
        #: Pinned buffers per slot, by field path.
        self._pinned: list[dict[str, Any]] = [{} for _ in range(slots)]
        #: The copy event that last read each slot's buffers.
        self._events: list[Any] = [None] * slots
        self._slot = 0
        #: Batches whose copy has started: index -> (device batch, event).
        self._pending: dict[int, tuple[Any, Any]] = {}

    def clear(self) -> None:
        """Forget batches staged ahead (the pipeline was reset or ranges skipped).

        Their copies are waited for first: a staged device buffer released while
        the side stream still writes it could be handed by the pool to new kernels.
        A host wait, on a path taken only on a rollback or a restart.
        """
        pending, self._pending = self._pending, {}
        for _staged, event in pending.values():
            event.synchronize()

    def start(self, index: int, batch: Any) -> None:
        """Begin copying ``batch`` (host arrays) to the device, without waiting."""
        if index in self._pending:
            return
        cupy = self._cupy
        if self._stream is None:
            self._stream = cupy.cuda.Stream(non_blocking=True)
        # The device buffers come from the memory pool of the current stream: the
        # copy must not overwrite a block that work queued there before still
        # reads. Waiting for what is queued now (the previous step, not the one
        # about to run) keeps the copy beside the coming step.
        self._stream.wait_event(cupy.cuda.get_current_stream().record())
        slot = self._slot
        self._slot = (slot + 1) % len(self._pinned)
        previous = self._events[slot]
        if previous is not None:
            previous.synchronize()  # that copy still reads these pinned buffers
        buffers = self._pinned[slot]
        paths = iter([path for path, _ in flatten(batch)])

        def copy(leaf: Any) -> Any:
            path = next(paths)
            if not isinstance(leaf, np.ndarray) or leaf.dtype.char not in _DEVICE_DTYPES:
                return leaf  # already on the device, or not for it
            # CuPy arrays are in native byte order: a big-endian leaf is swapped here.
            dtype = leaf.dtype if leaf.dtype.isnative else leaf.dtype.newbyteorder("=")
            pinned = buffers.get(path)
            if pinned is None or pinned.shape != leaf.shape or pinned.dtype != dtype:
                pinned = buffers[path] = self._cupyx.empty_pinned(leaf.shape, dtype)
            pinned[...] = leaf
            device = cupy.empty(leaf.shape, dtype)
            device.set(pinned, stream=self._stream)
            return device

        staged = map_leaves(copy, batch)
        event = self._stream.record()
        self._events[slot] = event
        self._pending[index] = (staged, event)

    def take(self, index: int, batch: Any) -> Any:
        """The device copy of batch ``index``, ordered before the current stream's work."""
        if index not in self._pending:
            self.start(index, batch)
        staged, event = self._pending.pop(index)
        self._cupy.cuda.get_current_stream().wait_event(event)
        return staged
