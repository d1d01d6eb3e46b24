"""Host (NumPy) views of NumPy or CuPy arrays, for the wire."""

from __future__ import annotations

from typing import Any

import numpy as np

from monitored import is_device_array

__all__ = ["host", "like", "store"]


def host(value: Any) -> np.ndarray[Any, Any]:
    """``value`` as a NumPy array: itself when it is one, a device-to-host copy for CuPy."""
    if is_device_array(value):
        copied: np.ndarray[Any, Any] = value.get()
        return copied
    return np.asarray(value)


def like(array: np.ndarray[Any, Any], model: Any) -> Any:
    """``array`` in ``model``'s array module (a host-to-device copy for CuPy)."""
    if not is_device_array(model):
        return array
    import cupy

    return cupy.asarray(array)


def store(target: Any, array: np.ndarray[Any, Any]) -> None:
    """Copy host ``array`` into the CuPy array ``target``, in place.

    CuPy's ``set`` copies straight from host memory but refuses a target that is
    neither C- nor F-contiguous ("Cannot set to non-contiguous array"); such an
    entry (a transposed view, a slice with steps) goes through a device copy.
    """
    if target.flags.c_contiguous or target.flags.f_contiguous:
        target.set(array)
    else:
        import cupy

        target[...] = cupy.asarray(array)
