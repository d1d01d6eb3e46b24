"""Elementwise in-place update rules, run on NumPy in cache-sized chunks or on CuPy fused.

Every optimizer update (and the moving-average update) is elementwise: each
element of the variable and of its slots changes from the same elements of the
gradient and a few scalars. An :class:`UpdateRule` states one such update twice:

* ``func(xp, inputs, outputs, temps, scalars)`` with ufuncs and ``out=``
  arguments, writing ``outputs`` in place and using ``temps`` as scratch space;
* ``cuda``, the same update as C++ statements on one element (``T`` is the
  element type), compiled by CuPy into one fused kernel.

On NumPy :func:`run_dense` walks C-contiguous arrays in chunks of
:data:`CHUNK_BYTES` per array with chunk-sized scratch buffers: the few passes of
an update then stay in the CPU cache instead of streaming every array from memory
once per operation, which makes the update several times faster than the same
expression written inline (see ``docs/performance.md``), and allocates nothing of
the variable's size. On CuPy (``float32``/``float64``) the rule is one
``cupy.ElementwiseKernel`` launch; other dtypes fall back to the ufunc form.

:func:`run_rows` applies a rule to some rows only (row-sparse gradients): a fused
kernel that indexes the rows directly on CuPy, a gather/update/scatter on NumPy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, Final, final

import numpy as np

from ..._core._backend import array_module, is_device_array
from ._types import Array

__all__ = ["CHUNK_BYTES", "UpdateRule", "cuda_rows_body", "run_dense", "run_rows"]

#: Bytes of each array processed per chunk on NumPy (fits a core's L2 cache with
#: the handful of arrays an update touches).
CHUNK_BYTES: Final = 1 << 17

#: ``func(xp, inputs, outputs, temps, scalars)``.
RuleFunc = Callable[
    [ModuleType, Sequence[Array], Sequence[Array], Sequence[Array], Sequence[float]], None
]

_FUSED_DTYPES: Final = (np.dtype(np.float32), np.dtype(np.float64))


@final
class UpdateRule:
    """One elementwise in-place update, as ufuncs and as a CUDA statement list.

    ``inputs`` are read-only arrays (the gradient), ``outputs`` the arrays updated
    in place (the variable first, then its slots), ``scalars`` the per-step
    constants, all named as the CUDA body uses them. Every array of one call has
    the variable's shape and dtype.
    """

    __slots__ = ("cuda", "func", "inputs", "n_temps", "name", "outputs", "scalars")

    def __init__(
        self,
        name: str,
        *,
        inputs: tuple[str, ...],
        outputs: tuple[str, ...],
        scalars: tuple[str, ...],
        n_temps: int,
        func: RuleFunc,
        cuda: str,
    ) -> None:
        self.name = name
        self.inputs = inputs
        self.outputs = outputs
        self.scalars = scalars
        self.n_temps = n_temps
        self.func = func
        self.cuda = cuda

    def __repr__(self) -> str:
        return f"UpdateRule({self.name!r})"


def run_dense(
    rule: UpdateRule,
    inputs: Sequence[Array],
    outputs: Sequence[Array],
    scalars: Sequence[float],
) -> None:
    """Apply ``rule`` to every element of ``outputs`` (all of one shape and dtype)."""
    first = outputs[0]
    if first.size == 0:
        return
    if is_device_array(first):
        _run_cupy_dense(rule, inputs, outputs, scalars)
        return
    dtype = first.dtype
    chunk = max(1, CHUNK_BYTES // dtype.itemsize)
    if first.size <= chunk or not all(out.flags.c_contiguous for out in outputs):
        temps = [np.empty(first.shape, dtype) for _ in range(rule.n_temps)]
        rule.func(np, inputs, outputs, temps, scalars)
        return
    flat_in = [a.reshape(-1) for a in inputs]  # a copy only for a non-contiguous input
    flat_out = [a.reshape(-1) for a in outputs]  # views: checked contiguous above
    temps = [np.empty(chunk, dtype) for _ in range(rule.n_temps)]
    size = first.size
    for start in range(0, size, chunk):
        stop = min(start + chunk, size)
        part = temps if stop - start == chunk else [t[: stop - start] for t in temps]
        rule.func(
            np,
            [a[start:stop] for a in flat_in],
            [a[start:stop] for a in flat_out],
            part,
            scalars,
        )


def run_rows(
    rule: UpdateRule,
    rows: Array,
    inputs: Sequence[Array],
    outputs: Sequence[Array],
    scalars: Sequence[float],
) -> None:
    """Apply ``rule`` to rows ``rows`` (unique ``int64``) of ``outputs`` only.

    ``inputs`` hold one row per entry of ``rows``; other rows stay untouched.
    """
    if rows.shape[0] == 0:
        return
    first = outputs[0]
    if (
        is_device_array(first)
        and first.dtype in _FUSED_DTYPES
        and all(out.flags.c_contiguous for out in outputs)
    ):
        _run_cupy_rows(rule, rows, inputs, outputs, scalars)
        return
    xp = array_module(first)
    gathered = [xp.take(out, rows, axis=0) for out in outputs]
    run_dense(rule, inputs, gathered, scalars)
    for out, part in zip(outputs, gathered, strict=True):
        out[rows] = part


# -- CuPy ---------------------------------------------------------------------------

_KERNELS: dict[tuple[str, str], Any] = {}


def cuda_rows_body(rule: UpdateRule) -> str:
    """The CUDA body of ``rule``'s row kernel: bind each output to its row element.

    The loop runs over the elements of the row values; element ``i`` belongs to
    row ``rows_[i / row_size_]`` of every output (raw arrays named ``<out>_arr``).
    """
    lines = ["const ptrdiff_t j_ = (ptrdiff_t)rows_[i / row_size_] * row_size_ + i % row_size_;"]
    lines += [f"T &{name} = {name}_arr[j_];" for name in rule.outputs]
    return "\n".join([*lines, rule.cuda])


def _dense_kernel(rule: UpdateRule) -> Any:  # pragma: no cover - CuPy only
    kernel = _KERNELS.get((rule.name, "dense"))
    if kernel is None:
        import cupy

        in_params = ", ".join([f"T {n}" for n in rule.inputs] + [f"T {n}" for n in rule.scalars])
        out_params = ", ".join(f"T {n}" for n in rule.outputs)
        kernel = cupy.ElementwiseKernel(in_params, out_params, rule.cuda, f"monitored_{rule.name}")
        _KERNELS[rule.name, "dense"] = kernel
    return kernel


def _rows_kernel(rule: UpdateRule) -> Any:  # pragma: no cover - CuPy only
    kernel = _KERNELS.get((rule.name, "rows"))
    if kernel is None:
        import cupy

        in_params = ", ".join(
            [f"T {n}" for n in rule.inputs]
            + ["raw int64 rows_", "int64 row_size_"]
            + [f"T {n}" for n in rule.scalars]
        )
        out_params = ", ".join(f"raw T {n}_arr" for n in rule.outputs)
        kernel = cupy.ElementwiseKernel(
            in_params, out_params, cuda_rows_body(rule), f"monitored_{rule.name}_rows"
        )
        _KERNELS[rule.name, "rows"] = kernel
    return kernel


def _run_cupy_dense(
    rule: UpdateRule,
    inputs: Sequence[Array],
    outputs: Sequence[Array],
    scalars: Sequence[float],
) -> None:  # pragma: no cover - CuPy only
    first = outputs[0]
    dtype = first.dtype
    if dtype in _FUSED_DTYPES:
        typed = [dtype.type(s) for s in scalars]
        _dense_kernel(rule)(*inputs, *typed, *outputs)
        return
    xp = array_module(first)
    temps = [xp.empty(first.shape, dtype) for _ in range(rule.n_temps)]
    rule.func(xp, inputs, outputs, temps, scalars)


def _run_cupy_rows(
    rule: UpdateRule,
    rows: Array,
    inputs: Sequence[Array],
    outputs: Sequence[Array],
    scalars: Sequence[float],
) -> None:  # pragma: no cover - CuPy only
    first = outputs[0]
    dtype = first.dtype
    row_size = math.prod(first.shape[1:])
    typed = [dtype.type(s) for s in scalars]
    flat = [out.reshape(-1) for out in outputs]
    kernel = _rows_kernel(rule)
    if inputs:
        kernel(*inputs, rows, np.int64(row_size), *typed, *flat)
    else:
        kernel(rows, np.int64(row_size), *typed, *flat, size=rows.shape[0] * row_size)
