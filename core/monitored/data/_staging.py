"""GPU staging: the next batch goes to the device while the current step runs.

Host batches are copied into page-locked (pinned) host buffers and from there to
the device on a CUDA stream of their own, so the copy of batch *k + 1* overlaps
step *k*. Two sets of pinned buffers are used in turn (double buffering); a set
is reused only once the copy that read it has finished. The step's stream waits
on the copy's event (a device-side wait, no host sync). CuPy is imported only
when a pipeline is made with ``device=True``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._structure import flatten, map_leaves

__all__ = ["DeviceStager"]


class DeviceStager:
    """Copies batches to the current CUDA device ahead of use."""

    __slots__ = ("_cupy", "_cupyx", "_events", "_pending", "_pinned", "_slot", "_stream")

    def __init__(self) -> None:
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
        #: Pinned buffers per slot (0 or 1), by field path.
        self._pinned: list[dict[str, Any]] = [{}, {}]
        #: The copy event that last read each slot's buffers.
        self._events: list[Any] = [None, None]
        self._slot = 0
        #: Batches whose copy has started: index -> (device batch, event).
        self._pending: dict[int, tuple[Any, Any]] = {}

    def clear(self) -> None:
        """Forget batches staged ahead (the pipeline was reset or ranges skipped)."""
        self._pending.clear()

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
        self._slot = 1 - slot
        previous = self._events[slot]
        if previous is not None:
            previous.synchronize()  # that copy still reads these pinned buffers
        buffers = self._pinned[slot]
        paths = iter([path for path, _ in flatten(batch)])

        def copy(leaf: Any) -> Any:
            path = next(paths)
            if not isinstance(leaf, np.ndarray):  # already on the device
                return leaf
            pinned = buffers.get(path)
            if pinned is None or pinned.shape != leaf.shape or pinned.dtype != leaf.dtype:
                pinned = buffers[path] = self._cupyx.empty_pinned(leaf.shape, leaf.dtype)
            pinned[...] = leaf
            device = cupy.empty(leaf.shape, leaf.dtype)
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
