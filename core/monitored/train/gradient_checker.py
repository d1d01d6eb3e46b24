"""Gradient checking: hand-written gradients against central differences.

TF1's ``tf.test.compute_gradient`` / ``compute_gradient_error``, for code that
computes its own gradients. You give the function ``f``, the point ``x`` and your
backward pass ``grad_fn``, which maps an upstream gradient ``dy`` (shaped like
``f``'s output) to the gradient with respect to each input, a vector-Jacobian
product. Both Jacobians are built and compared:

* theoretical: ``grad_fn`` applied to each unit ``dy`` (one call per output element);
* numerical: ``(f(x + delta) - f(x - delta)) / (x+ - x-)`` per input element,
  dividing by the step actually taken after rounding to ``x``'s dtype.

``x`` may be one array (``f(x)``, ``grad_fn(x, dy) -> dx``), a list or tuple of
arrays (``f(*xs)``, ``grad_fn(*xs, dy) -> sequence``) or a mapping name -> array,
like a model's parameters (``f(params)``, ``grad_fn(params, dy) -> mapping``).
Jacobians are NumPy float64 arrays of shape ``(x.size, y.size)``:
``jacobian[i, j] = d y_j / d x_i`` (TF1's layout). Check in float64: float32
central differences are only good to about ``1e-2``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias, overload

import numpy as np

from .._core._backend import array_module, is_array, to_host
from .optimizers._indexed_slices import IndexedSlices
from .optimizers._types import Array

__all__ = ["compute_gradient", "compute_gradient_error"]

#: ``(theoretical, numerical)`` Jacobians of one input.
Jacobians: TypeAlias = tuple[np.ndarray, np.ndarray]


@overload
def compute_gradient(
    f: Callable[..., Any],
    x: Mapping[str, Array],
    grad_fn: Callable[..., Any],
    *,
    delta: float = 1e-3,
) -> dict[str, Jacobians]: ...
@overload
def compute_gradient(
    f: Callable[..., Any],
    x: list[Array] | tuple[Array, ...],
    grad_fn: Callable[..., Any],
    *,
    delta: float = 1e-3,
) -> list[Jacobians]: ...
@overload
def compute_gradient(
    f: Callable[..., Any],
    x: Array,
    grad_fn: Callable[..., Any],
    *,
    delta: float = 1e-3,
) -> Jacobians: ...
def compute_gradient(
    f: Callable[..., Any],
    x: Any,
    grad_fn: Callable[..., Any],
    *,
    delta: float = 1e-3,
) -> Any:
    """The theoretical and numerical Jacobians of ``f`` at ``x``, per input.

    Returns ``(theoretical, numerical)`` for a single array, a list of them for
    a list or tuple, a dict for a mapping. ``f`` must not modify its inputs.
    """
    delta = _check_delta(delta)
    if isinstance(x, Mapping):
        names = list(x)

        def call_map(arrays: Sequence[Array]) -> Any:
            return f(dict(zip(names, arrays, strict=True)))

        def grads_map(arrays: Sequence[Array], dy: Array) -> list[Any]:
            result = grad_fn(dict(zip(names, arrays, strict=True)), dy)
            if not isinstance(result, Mapping):
                raise TypeError(
                    f"compute_gradient: grad_fn must return a mapping name -> gradient for a "
                    f"mapping x, got {type(result).__name__}"
                )
            return [result.get(name) for name in names]

        found = _jacobians(call_map, grads_map, [x[n] for n in names], names, delta)
        return dict(zip(names, found, strict=True))
    if isinstance(x, list | tuple):
        labels = [f"x[{i}]" for i in range(len(x))]

        def call_seq(arrays: Sequence[Array]) -> Any:
            return f(*arrays)

        def grads_seq(arrays: Sequence[Array], dy: Array) -> list[Any]:
            result = grad_fn(*arrays, dy)
            if not isinstance(result, list | tuple):
                raise TypeError(
                    "compute_gradient: grad_fn must return a list or tuple of gradients for a "
                    f"list or tuple x, got {type(result).__name__}"
                )
            return list(result)

        return _jacobians(call_seq, grads_seq, list(x), labels, delta)

    def call_one(arrays: Sequence[Array]) -> Any:
        return f(arrays[0])

    def grads_one(arrays: Sequence[Array], dy: Array) -> list[Any]:
        return [grad_fn(arrays[0], dy)]

    return _jacobians(call_one, grads_one, [x], ["x"], delta)[0]


def compute_gradient_error(
    f: Callable[..., Any],
    x: Any,
    grad_fn: Callable[..., Any],
    *,
    delta: float = 1e-3,
) -> float:
    """The largest ``|theoretical - numerical|`` over every input's Jacobians.

    Compare it with a tolerance: about ``1e-6`` for smooth float64 functions
    (``delta=1e-5`` tightens it further), ``1e-2`` in float32.
    """
    found = compute_gradient(f, x, grad_fn, delta=delta)
    if isinstance(found, dict):
        pairs = list(found.values())
    elif isinstance(found, list):
        pairs = found
    else:
        pairs = [found]
    error = 0.0
    for theoretical, numerical in pairs:
        if theoretical.size:
            difference = float(np.max(np.abs(theoretical - numerical)))
            if math.isnan(difference):
                return math.nan  # a NaN in either Jacobian must never pass a tolerance
            error = max(error, difference)
    return error


def _check_delta(delta: object) -> float:
    if isinstance(delta, bool) or not isinstance(delta, int | float):
        raise TypeError(f"compute_gradient: delta must be a number, got {delta!r}")
    value = float(delta)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"compute_gradient: delta must be positive and finite, got {value}")
    return value


def _output(call: Callable[[Sequence[Array]], Any], arrays: Sequence[Array]) -> np.ndarray:
    y = call(arrays)
    if is_array(y):
        return to_host([y])[0]
    if isinstance(y, int | float | np.generic):
        return np.asarray(y)
    raise TypeError(f"compute_gradient: f must return an array or a number, got {type(y).__name__}")


def _jacobians(
    call: Callable[[Sequence[Array]], Any],
    grads: Callable[[Sequence[Array], Array], list[Any]],
    arrays: list[Array],
    labels: list[str],
    delta: float,
) -> list[Jacobians]:
    for label, array in zip(labels, arrays, strict=True):
        if not is_array(array) or not np.issubdtype(array.dtype, np.floating):
            raise TypeError(
                f"compute_gradient: input {label} must be a floating-point NumPy or CuPy array"
            )
    y0 = _output(call, arrays)
    return [
        (theoretical, _numerical(call, arrays, i, y0.size, delta))
        for i, theoretical in enumerate(_theoretical(call, grads, arrays, labels, y0))
    ]


def _theoretical(
    call: Callable[[Sequence[Array]], Any],
    grads: Callable[[Sequence[Array], Array], list[Any]],
    arrays: list[Array],
    labels: list[str],
    y0: np.ndarray,
) -> list[np.ndarray]:
    jacobians = [np.zeros((a.size, y0.size)) for a in arrays]
    xp = array_module(arrays[0])
    y_dtype = y0.dtype if np.issubdtype(y0.dtype, np.floating) else arrays[0].dtype
    for j in range(y0.size):
        dy_host = np.zeros(y0.shape, dtype=y_dtype)
        dy_host.reshape(-1)[j] = 1
        dy = dy_host if xp is np else xp.asarray(dy_host)
        dxs = grads(arrays, dy)
        if len(dxs) != len(arrays):
            raise ValueError(
                f"compute_gradient: grad_fn returned {len(dxs)} gradients for {len(arrays)} inputs"
            )
        for label, array, dx, jacobian in zip(labels, arrays, dxs, jacobians, strict=True):
            jacobian[:, j] = _dense_gradient(label, array, dx)
    return jacobians


def _dense_gradient(label: str, array: Array, dx: Any) -> np.ndarray:
    if dx is None:
        return np.zeros(array.size)
    if isinstance(dx, IndexedSlices):
        dx = dx.to_dense(array.shape)
    if not is_array(dx) and not isinstance(dx, int | float | np.generic):
        raise TypeError(
            f"compute_gradient: the gradient of {label} must be an array, an IndexedSlices or "
            f"None, got {type(dx).__name__}"
        )
    host = to_host([dx])[0] if is_array(dx) else np.asarray(dx)
    if host.shape != tuple(array.shape):
        raise ValueError(
            f"compute_gradient: the gradient of {label} has shape {host.shape}, but {label} has "
            f"shape {tuple(array.shape)}"
        )
    return host.reshape(-1).astype(np.float64)


def _numerical(
    call: Callable[[Sequence[Array]], Any],
    arrays: list[Array],
    index: int,
    y_size: int,
    delta: float,
) -> np.ndarray:
    base = arrays[index]
    jacobian = np.zeros((base.size, y_size))
    probe = base.copy(order="C")
    flat = probe.reshape(-1)
    inputs = list(arrays)
    inputs[index] = probe
    for k in range(base.size):
        original = flat[k].copy()
        flat[k] = original + delta
        above = float(flat[k])
        y_above = _output(call, inputs).astype(np.float64)
        flat[k] = original - delta
        below = float(flat[k])
        y_below = _output(call, inputs).astype(np.float64)
        flat[k] = original
        if above == below:
            raise ValueError(
                f"compute_gradient: a step of delta={delta} around element {k} of input "
                f"{index} (value {float(original)!r}, dtype {base.dtype}) rounds away in "
                "that dtype; pass a larger delta or a float64 input"
            )
        jacobian[k] = ((y_above - y_below) / (above - below)).reshape(-1)
    return jacobian
