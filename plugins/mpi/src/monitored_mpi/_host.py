"""Host (NumPy) views of NumPy or CuPy arrays, for the wire."""

from __future__ import annotations

from typing import Any

import numpy as np

from monitored import is_device_array

__all__ = ["host", "like"]


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
