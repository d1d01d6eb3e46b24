"""Which step outputs are scalars: the one rule every summary sink follows.

A step's outputs reach TensorBoard (``monitored-summaries``), MLflow
(``monitored-mlflow``) and any other sink by the same rule, so a run shows
the same curves in every tool: an output is a scalar when it is a number (an
``int`` or a ``float``, not a ``bool``: a flag is no metric), a NumPy number,
or an array of exactly one element with a numeric dtype (NumPy, CuPy or any
array with ``dtype`` and ``size``). Everything else (arrays of several
elements, strings, nested structures) is left out; a sink may still write
such values when asked by name (``SummarySaverHook(histograms=[...])``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

__all__ = ["scalar_outputs"]

#: Signed and unsigned integers and floats (not booleans): what a curve can plot.
_NUMERIC_KINDS: Final = frozenset("iuf")


def scalar_outputs(outputs: object) -> dict[str, Any]:
    """The entries of ``outputs`` (a step's output mapping) that are scalars.

    The values are returned as they are (a device array stays on its device,
    for the sink to move all of them to the host in one transfer); ``outputs``
    that is not a mapping (a step returning ``None`` or a loss alone) has none.
    """
    if not isinstance(outputs, Mapping):
        return {}
    out: dict[str, Any] = {}
    for key, value in outputs.items():
        if not isinstance(key, str):
            continue
        kind = type(value)
        if kind is float or kind is int:
            out[key] = value
            continue
        dtype = getattr(value, "dtype", None)
        kind_code = getattr(dtype, "kind", None)
        if kind_code in _NUMERIC_KINDS and getattr(value, "size", None) == 1:
            out[key] = value
    return out
