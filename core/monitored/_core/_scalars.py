"""Which step outputs are scalars: the one rule every summary sink follows.

A step's outputs reach TensorBoard (``monitored-summaries``), MLflow
(``monitored-mlflow``) and any other sink by the same rule, so a run shows
the same curves in every tool: an output is a scalar when it is a number (an
``int`` or a ``float``, not a ``bool``: a flag is no metric), a NumPy number,
or an array of exactly one element with a numeric dtype (NumPy, CuPy or any
array with ``dtype`` and ``size``). Everything else (arrays of several
elements, strings, nested structures) is left out; a sink may still write
such values when asked by name (``SummarySaverHook(histograms=[...])``).

A hook asks for those outputs with the fetch :data:`SCALAR_OUTPUTS`
(``SessionRunArgs(monitored.SCALAR_OUTPUTS, lag=1)``): the session picks them
after the step by this rule and, with ``lag=1``, starts their copy off a device
without waiting, so a sink writing a step's outputs never makes it wait.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, final

__all__ = ["SCALAR_OUTPUTS", "ScalarOutputs", "scalar_output_fetches", "scalar_outputs"]

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


@final
class ScalarOutputs:
    """The type of :data:`SCALAR_OUTPUTS` (one instance; compare with ``is``)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "monitored.SCALAR_OUTPUTS"

    def __reduce__(self) -> str:
        return "SCALAR_OUTPUTS"


#: A fetch (``SessionRunArgs(SCALAR_OUTPUTS, lag=1)``) for every scalar output of the
#: step, by :func:`scalar_outputs`'s rule: the hook receives a dict of their host
#: values by name (empty when the step has none). The names are picked once the step
#: has returned, so a hook need not know them in ``before_run``.
SCALAR_OUTPUTS: Final = ScalarOutputs()


def scalar_output_fetches(outputs: object) -> dict[str, str]:
    """What :data:`SCALAR_OUTPUTS` stands for after a step with ``outputs``: a fetch
    structure naming each scalar output (``{name: name}``)."""
    return {name: name for name in scalar_outputs(outputs)}
