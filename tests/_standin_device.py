"""A NumPy-backed stand-in for CuPy, so the CPU suite runs the library's CuPy code paths.

CI has no GPU, and the real CuPy tests (``pytest -m gpu``) run only where one is
lent. This module gives every other run a ``cupy`` (and ``cupyx``) whose arrays
hold their data in NumPy but behave like CuPy's where CuPy differs from NumPy in
ways the library relies on, and which **records every conversion to host
memory**, so a test can assert how many device-to-host transfers (each one a
host synchronization on a real GPU) a session, a hook or a metric makes.

Use it through the ``standin_cupy`` fixture (re-exported by ``tests/conftest.py``;
plugin tests import it with ``from _standin_device import standin_cupy``)::

    def test_no_transfer(standin_cupy: StandinCupy) -> None:
        cupy = standin_cupy.module          # what ``import cupy`` now gives
        x = cupy.arange(3.0)
        standin_cupy.transfers.reset()
        float(x.sum())
        assert standin_cupy.transfers.to_host == 1

``transfers.to_host`` counts every device-to-host copy, a non-blocking one (a
``lag=1`` fetch) included; ``transfers.syncs`` counts the times the host waited.

What follows CuPy (each behaviour quoted, in the comment where it is implemented,
from CuPy's source of v13/v14, the file named there):

- the array type's module is ``cupy``, which is how
  :func:`monitored.is_device_array` recognises a device array;
- reductions and integer indexing give 0-d arrays, never NumPy scalars;
- ``numpy.asarray(device_array)`` raises ``TypeError`` (no implicit conversion);
  device functions given a NumPy array raise ``TypeError`` too;
- ``float``, ``int``, ``complex``, ``bool``, ``item``, ``tolist``, ``tobytes``,
  ``repr``, ``str`` and ``format`` all go through ``get()``: one transfer each;
- ``get(out=...)`` checks the type, the dtype and the **shape** of ``out``;
  ``set(...)`` checks type, dtype and shape, and refuses a non-contiguous target;
- ``ascontiguousarray`` of a 0-d array gives shape ``(1,)``;
- storing a device value into a target of another shape (a (1,) into a 0-d) fails;
- ``cupyx.allow_synchronize(False)`` makes any transfer raise
  ``cupyx.DeviceSynchronized``;
- functions that read a value on the host inside CuPy count as transfers:
  ``bincount`` (two), ``unique`` and boolean-mask indexing (one each);
  ``cupy.add.at`` wraps indices out of range instead of raising, and
  ``cupyx.scatter_add`` warns that it is deprecated;
- streams and events: work issued on a stream other than the null stream (a copy
  with ``blocking=False``, a ``set`` on a side stream) does **not** happen when it
  is issued, only when the host waits for it (``stream.synchronize()``,
  ``event.synchronize()``) or another stream is made to wait for it
  (``wait_event``); ``event.done`` says whether it has happened. A buffer such a
  pending copy reads or writes that the program releases first is recorded in
  :attr:`StandinCupy.errors` (on a GPU, the memory pool would hand it to the next
  allocation while the copy still runs) and fails the test at teardown.

Everything else (``cupy.zeros``, ``cupy.concatenate``, ufuncs, ...) is NumPy's
function applied to the arrays' data, its results wrapped back into device arrays.

Not modelled: compiled kernels (``ElementwiseKernel``, ``RawKernel``: the
optimizers' fused updates run only on a GPU), more than one device, the memory
pool itself, and the difference between pinned and pageable host memory. Work on
the null stream happens at once, so the stand-in cannot show how far the host runs
ahead of the device; it shows where the host waits.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import sys
import types
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

__all__ = ["StandinCupy", "Transfers", "standin_cupy"]


class Transfers:
    """What crossed between host and device, and when the host waited.

    ``to_host`` counts device-to-host copies (every ``get()``, whatever called it);
    ``kinds`` counts them by what asked (``"get"``, ``"float"``, ``"item"``, ...);
    ``syncs`` counts host waits (a blocking copy, ``synchronize()`` of a stream, an
    event or a device); ``to_device`` counts host-to-device copies.
    """

    def __init__(self) -> None:
        self.to_host = 0
        self.to_device = 0
        self.syncs = 0
        self.kinds: collections.Counter[str] = collections.Counter()

    def reset(self) -> None:
        """Start counting afresh."""
        self.to_host = self.to_device = self.syncs = 0
        self.kinds.clear()

    def __repr__(self) -> str:
        return (
            f"Transfers(to_host={self.to_host}, to_device={self.to_device}, "
            f"syncs={self.syncs}, kinds={dict(self.kinds)})"
        )


#: The stand-in now installed (one at a time: the fixture installs and removes it).
_active: StandinCupy | None = None


def _state() -> StandinCupy:
    if _active is None:  # pragma: no cover - a stand-in array outlived its fixture
        raise RuntimeError("the stand-in CuPy is not installed (use the standin_cupy fixture)")
    return _active


# --------------------------------------------------------------------------- memory


def _root(array: np.ndarray) -> np.ndarray:
    """The array owning ``array``'s memory (its base chain's end)."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


class _Buffer:
    """A pending operation's weak hold on an array: the memory, and where the view lies.

    The operation must not keep the memory alive (on a GPU nothing does: CUDA holds
    a raw pointer), so it holds the owner weakly and rebuilds the view when it runs.
    """

    def __init__(self, view: np.ndarray) -> None:
        root = _root(view)
        if not (root.flags.c_contiguous or root.flags.f_contiguous):
            raise AssertionError("a stand-in copy's buffer must own contiguous memory")
        self.root = weakref.ref(root)
        self.offset = view.__array_interface__["data"][0] - root.__array_interface__["data"][0]
        self.shape, self.strides, self.dtype = view.shape, view.strides, view.dtype

    def view(self) -> np.ndarray | None:
        root = self.root()
        if root is None:
            return None
        flat = (root if root.flags.c_contiguous else root.T).reshape(-1).view(np.uint8)
        return np.ndarray(
            self.shape, self.dtype, buffer=flat, offset=self.offset, strides=self.strides
        )


class _Pending:
    """A copy issued on a side stream, not yet carried out."""

    def __init__(self, what: str, source: np.ndarray, target: np.ndarray) -> None:
        self.what = what
        self.source = _Buffer(source)
        self.target = _Buffer(target)
        self.done = False
        for buffer, role in ((self.source, "source"), (self.target, "target")):
            root = buffer.root()
            assert root is not None
            weakref.finalize(root, self._released, role)

    def _released(self, role: str) -> None:
        if not self.done and _active is not None:
            _active.errors.append(
                f"{self.what}: its {role} buffer was released while the copy was still "
                "pending on its stream (on a GPU the pool can hand that memory to new work)"
            )

    def run(self) -> None:
        if self.done:
            return
        self.done = True
        source, target = self.source.view(), self.target.view()
        if source is None or target is None:
            return  # already recorded by _released
        target[...] = source


# --------------------------------------------------------------------------- streams


class Stream:
    """``cupy.cuda.Stream``: a queue of pending copies (the null stream runs at once)."""

    null: Stream

    def __init__(self, null: bool = False, non_blocking: bool = False, ptds: bool = False) -> None:
        self.is_null = null
        self.non_blocking = non_blocking
        self._queue: list[_Pending | tuple[Event, Stream]] = []

    # CuPy (stream.pyx): ``def record(self, event=None)``: "Records an event on the
    # stream", creating ``Event()`` when none is given, and returns it.
    def record(self, event: Event | None = None) -> Event:
        if event is None:
            event = Event()
        event.record(self)
        return event

    # CuPy: ``wait_event(self, event)``: "Makes the stream wait for an event. The
    # future work on this stream will be done after the event." Work on the null
    # stream is carried out when issued, so the event must have happened now.
    def wait_event(self, event: Event) -> None:
        if self.is_null or self is get_current_stream():
            event._complete()
        else:
            self._queue.append((event, self))

    def synchronize(self) -> None:
        _state().transfers.syncs += 1
        self._drain(len(self._queue))

    @property
    def done(self) -> bool:
        return all(isinstance(op, tuple) or op.done for op in self._queue)

    def _enqueue(self, what: str, source: np.ndarray, target: np.ndarray) -> None:
        """Copy ``source`` into ``target`` in stream order (at once on the null stream)."""
        if self.is_null:
            target[...] = source
        else:
            self._queue.append(_Pending(what, source, target))

    def _drain(self, upto: int) -> None:
        """Carry out the first ``upto`` operations issued on this stream."""
        for op in self._queue[:upto]:
            if isinstance(op, tuple):
                op[0]._complete()
            else:
                op.run()
        del self._queue[:upto]

    def __enter__(self) -> Stream:
        _state().current.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _state().current.pop()

    def use(self) -> Stream:
        _state().current[0] = self
        return self


Stream.null = Stream(null=True)


class Event:
    """``cupy.cuda.Event``: marks a point in a stream's queue."""

    def __init__(
        self, block: bool = False, disable_timing: bool = False, interprocess: bool = False
    ) -> None:
        self._stream: Stream | None = None
        #: The operations queued on the stream when the event was recorded.
        self._issued: list[_Pending | tuple[Event, Stream]] = []

    # CuPy (stream.pyx, v13+): ``def record(self, stream=None)``: "if stream is None:
    # stream = get_current_stream()".
    def record(self, stream: Stream | None = None) -> None:
        self._stream = stream if stream is not None else get_current_stream()
        self._issued = list(self._stream._queue)

    def _complete(self) -> None:
        if self._stream is not None:
            queue = self._stream._queue
            # what was queued before the record and is still queued
            count = sum(1 for op in self._issued if any(op is q for q in queue))
            self._stream._drain(count)
            self._issued = []

    def synchronize(self) -> None:
        _state().transfers.syncs += 1
        self._complete()

    # CuPy: ``done``: "True if the event is done" (cudaEventQuery == cudaSuccess).
    @property
    def done(self) -> bool:
        if self._stream is None:
            return True
        return all(isinstance(op, tuple) or op.done for op in self._issued)


def get_current_stream(device_id: int | None = None) -> Stream:
    """``cupy.cuda.get_current_stream``: the stream of the innermost ``with stream:``."""
    return _state().current[-1]


class Device:
    """``cupy.cuda.Device``: one device, id 0; usable as a context manager."""

    def __init__(self, device: int | None = None) -> None:
        self.id = 0 if device is None else int(device)
        if self.id != 0:
            raise ValueError(f"the stand-in has one device (0), asked for {self.id}")

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def synchronize(self) -> None:
        state = _state()
        state.transfers.syncs += 1
        for stream in list(state.streams):
            stream._drain(len(stream._queue))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self) -> int:
        return hash(("standin-device", self.id))


# --------------------------------------------------------------------------- arrays


def _unwrap(value: Any, allow_host: bool = False) -> Any:
    """The NumPy data of stand-in arrays in ``value`` (recursing into sequences).

    CuPy's kernels refuse NumPy arrays (``_kernel._preprocess_args``: "Unsupported
    type <class 'numpy.ndarray'>"): a host array reaching a device function is a
    TypeError, as it would be on a GPU.
    """
    if isinstance(value, ndarray):
        return value._a
    if isinstance(value, np.ndarray) and not allow_host:
        raise TypeError(f"Unsupported type {type(value)}")
    if isinstance(value, list | tuple):
        return type(value)(_unwrap(v, allow_host) for v in value)
    return value


def _wrap(value: Any) -> Any:
    """Wrap NumPy results as device arrays; NumPy scalars become 0-d arrays (CuPy's way)."""
    if isinstance(value, np.ndarray):
        return ndarray._of(value)
    if isinstance(value, np.generic):
        return ndarray._of(np.asarray(value))
    if isinstance(value, tuple):
        return tuple(_wrap(v) for v in value)
    if isinstance(value, list):
        return [_wrap(v) for v in value]
    return value


def _binary(name: str) -> Callable[..., Any]:
    def method(self: ndarray, other: Any) -> Any:
        return _wrap(getattr(self._a, name)(_unwrap(other)))

    method.__name__ = name
    return method


def _inplace(name: str) -> Callable[..., Any]:
    def method(self: ndarray, other: Any) -> ndarray:
        getattr(self._a, name)(_unwrap(other))
        return self

    method.__name__ = name
    return method


# CuPy (_core/flags.pyx): ``Flags(c_contiguous, f_contiguous, owndata)`` and nothing
# else: no ``writeable``, no ``aligned``; indexing knows only those three names.
class _Flags:
    def __init__(self, array: np.ndarray) -> None:
        self.c_contiguous = bool(array.flags.c_contiguous)
        self.f_contiguous = bool(array.flags.f_contiguous)
        self.owndata = array.base is None

    def __getitem__(self, name: str) -> bool:
        known = {
            "C_CONTIGUOUS": self.c_contiguous,
            "F_CONTIGUOUS": self.f_contiguous,
            "OWNDATA": self.owndata,
        }
        if name not in known:
            raise KeyError(f"{name} is not defined for cupy.ndarray.flags")
        return known[name]


class ndarray:
    """``cupy.ndarray``: data in a NumPy array, host conversions counted."""

    __slots__ = ("__weakref__", "_a")
    __array_priority__ = 100
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, shape: Any, dtype: Any = float, memptr: Any = None) -> None:
        if memptr is not None:
            raise NotImplementedError("the stand-in does not take memptr")
        self._a = np.empty(shape, dtype)

    @classmethod
    def _of(cls, data: np.ndarray) -> ndarray:
        array = cls.__new__(cls)
        array._a = data
        return array

    # ---- attributes

    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: _Flags(self._a))
    T = property(lambda self: ndarray._of(self._a.T))
    device = property(lambda self: Device(0))

    @property
    def base(self) -> ndarray | None:
        return None if self._a.base is None else ndarray._of(_root(self._a))

    # ---- conversion to the host: every one is a get()

    # CuPy (core.pyx): ``cpdef get(self, stream=None, order='C', out=None,
    # blocking=True)``: "if self.dtype != out.dtype: raise TypeError(...)",
    # "if self.shape != out.shape: raise ValueError('Shape mismatch. Expected
    # shape: {}, actual shape: {}'...)"; with ``blocking`` the copy is followed by
    # ``stream.synchronize()``, otherwise "the copy runs asynchronously on the given
    # (if given) or current stream".
    def get(
        self, stream: Stream | None = None, order: str = "C", out: Any = None, blocking: bool = True
    ) -> np.ndarray:
        return self._get("get", stream, order, out, blocking)

    def _get(
        self, kind: str, stream: Stream | None, order: str, out: Any, blocking: bool
    ) -> np.ndarray:
        state = _state()
        state.declare_synchronize()
        state.transfers.to_host += 1
        state.transfers.kinds[kind] += 1
        if out is not None:
            if not isinstance(out, np.ndarray):
                raise TypeError("Only numpy.ndarray can be obtained fromcupy.ndarray")
            if self.dtype != out.dtype:
                raise TypeError(f"{out.dtype} array cannot be obtained from {self.dtype} array")
            if self.shape != out.shape:
                raise ValueError(
                    f"Shape mismatch. Expected shape: {self.shape}, actual shape: {out.shape}"
                )
            target = out
        else:
            target = np.empty(self.shape, self.dtype, order="F" if order == "F" else "C")
        stream = stream if stream is not None else get_current_stream()
        if blocking:
            state.transfers.syncs += 1
            stream._drain(len(stream._queue))
            target[...] = self._a
        else:
            stream._enqueue("a device-to-host copy", self._a, target)
        return target

    # CuPy: ``cpdef set(self, arr, stream=None)``: "if not isinstance(arr,
    # numpy.ndarray): raise TypeError('Only numpy.ndarray can be set to
    # cupy.ndarray')", dtype -> TypeError, "Shape mismatch. Old shape: {}, new
    # shape: {}" -> ValueError, and "raise RuntimeError('Cannot set to
    # non-contiguous array')" unless the target is C- or F-contiguous. The copy is
    # asynchronous on ``stream`` (``copy_from_host_async``).
    def set(self, arr: Any, stream: Stream | None = None) -> None:
        if not isinstance(arr, np.ndarray):
            raise TypeError("Only numpy.ndarray can be set to cupy.ndarray")
        if self.dtype != arr.dtype:
            raise TypeError(f"{arr.dtype} array cannot be set to {self.dtype} array")
        if self.shape != arr.shape:
            raise ValueError(f"Shape mismatch. Old shape: {self.shape}, new shape: {arr.shape}")
        if not (self._a.flags.c_contiguous or self._a.flags.f_contiguous):
            raise RuntimeError("Cannot set to non-contiguous array")
        _state().transfers.to_device += 1
        stream = stream if stream is not None else get_current_stream()
        stream._enqueue("a host-to-device copy", arr, self._a)

    # CuPy: ``__array__`` "raise TypeError('Implicit conversion to a NumPy array is
    # not allowed. Please use `.get()` to construct a NumPy array explicitly.')".
    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        _state().transfers.kinds["__array__ (refused)"] += 1
        raise TypeError(
            "Implicit conversion to a NumPy array is not allowed. "
            "Please use `.get()` to construct a NumPy array explicitly."
        )

    # CuPy: ``def __float__(self): return float(self.get())``, and the same for
    # ``__int__``, ``__complex__``, ``__repr__``, ``__str__``, ``__format__``;
    # ``item()`` is ``self.get().item()``, ``tolist()`` ``self.get().tolist()``;
    # ``__nonzero__`` (bool) is ``bool(self.get())`` for one element.
    def __float__(self) -> float:
        return float(self._get("float", None, "C", None, True))

    def __int__(self) -> int:
        return int(self._get("int", None, "C", None, True))

    def __complex__(self) -> complex:
        return complex(self._get("complex", None, "C", None, True))

    def __bool__(self) -> bool:
        if self.size != 1:
            if self.size == 0:
                return False
            raise ValueError(
                "The truth value of an array with more than one element is ambiguous. "
                "Use a.any() or a.all()"
            )
        return bool(self._get("bool", None, "C", None, True))

    def item(self) -> Any:
        if self.size != 1:
            raise ValueError("can only convert an array of size 1 to a Python scalar")
        return self._get("item", None, "C", None, True).item()

    def tolist(self) -> Any:
        return self._get("tolist", None, "C", None, True).tolist()

    def tobytes(self, order: str = "C") -> bytes:
        return self._get("tobytes", None, "C", None, True).tobytes(order)

    def __repr__(self) -> str:
        return repr(self._get("repr", None, "C", None, True))

    def __str__(self) -> str:
        return str(self._get("str", None, "C", None, True))

    def __format__(self, spec: str) -> str:
        return format(self._get("format", None, "C", None, True), spec)

    def __reduce__(self) -> Any:
        raise TypeError("the stand-in device array cannot be pickled")

    # ---- container protocol: elements stay on the device

    # CuPy: ``__iter__``: "if self._shape.size() == 0: raise TypeError('iteration
    # over a 0-d array')"; ``return (self[i] for i in range(self._shape[0]))``.
    def __iter__(self) -> Iterator[ndarray]:
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(self.shape[0]))

    def __len__(self) -> int:
        if self.ndim == 0:
            raise TypeError("len() of unsized object")
        return int(self.shape[0])

    # CuPy (_routines_indexing.pyx, ``_prepare_mask_indexing_single``): a boolean
    # mask's result size is read on the host, "n_true = int(mask_scanned[-1])": one
    # transfer (a synchronization) per masked read.
    def __getitem__(self, key: Any) -> Any:
        keys = key if isinstance(key, tuple) else (key,)
        if any(isinstance(k, ndarray) and k.dtype == np.bool_ for k in keys):
            _note_transfer("boolean mask")
        return _wrap(self._a[_unwrap(key)])

    # CuPy (_routines_indexing.pyx, ``_scatter_op``, op 'update'): a device value is
    # written with ``elementwise_copy(x, y)``, a ufunc that broadcasts its inputs and
    # its output together and refuses an output of another shape ("raise
    # ValueError('Out shape is mismatched')"): NumPy stores a (1,) value into a 0-d
    # target, CuPy does not.
    def __setitem__(self, key: Any, value: Any) -> None:
        key = _unwrap(key)
        if isinstance(value, ndarray):
            target_shape = np.shape(self._a[key])
            if np.broadcast_shapes(value.shape, target_shape) != target_shape:
                raise ValueError("Out shape is mismatched")
        self._a[key] = _unwrap(value)

    # ---- arithmetic: NumPy's, results wrapped

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        if "out" in kwargs:
            kwargs["out"] = tuple(_unwrap(o) for o in kwargs["out"])
        result = getattr(ufunc, method)(*_unwrap(inputs), **kwargs)
        return _wrap(result)

    __add__, __radd__ = _binary("__add__"), _binary("__radd__")
    __sub__, __rsub__ = _binary("__sub__"), _binary("__rsub__")
    __mul__, __rmul__ = _binary("__mul__"), _binary("__rmul__")
    __truediv__, __rtruediv__ = _binary("__truediv__"), _binary("__rtruediv__")
    __floordiv__, __rfloordiv__ = _binary("__floordiv__"), _binary("__rfloordiv__")
    __mod__, __rmod__ = _binary("__mod__"), _binary("__rmod__")
    __pow__, __rpow__ = _binary("__pow__"), _binary("__rpow__")
    __matmul__, __rmatmul__ = _binary("__matmul__"), _binary("__rmatmul__")
    __and__, __rand__ = _binary("__and__"), _binary("__rand__")
    __or__, __ror__ = _binary("__or__"), _binary("__ror__")
    __xor__, __rxor__ = _binary("__xor__"), _binary("__rxor__")
    __lt__, __le__ = _binary("__lt__"), _binary("__le__")
    __gt__, __ge__ = _binary("__gt__"), _binary("__ge__")
    __eq__, __ne__ = _binary("__eq__"), _binary("__ne__")  # type: ignore[assignment]
    __iadd__, __isub__ = _inplace("__iadd__"), _inplace("__isub__")
    __imul__, __itruediv__ = _inplace("__imul__"), _inplace("__itruediv__")
    __ipow__, __ifloordiv__ = _inplace("__ipow__"), _inplace("__ifloordiv__")
    __iand__, __ior__ = _inplace("__iand__"), _inplace("__ior__")

    def __neg__(self) -> ndarray:
        return ndarray._of(-self._a)

    def __pos__(self) -> ndarray:
        return ndarray._of(+self._a)

    def __abs__(self) -> ndarray:
        return ndarray._of(abs(self._a))

    def __invert__(self) -> ndarray:
        return ndarray._of(~self._a)

    def __copy__(self) -> ndarray:
        return self.copy()

    def __deepcopy__(self, memo: Any) -> ndarray:
        return self.copy()

    def copy(self, order: str = "C") -> ndarray:
        return ndarray._of(self._a.copy(order=order))

    def view(self, dtype: Any = None) -> ndarray:
        return ndarray._of(self._a.view() if dtype is None else self._a.view(dtype))

    def astype(self, dtype: Any, order: str = "K", copy: bool = True, **_: Any) -> ndarray:
        result = self._a.astype(dtype, order=order, copy=copy)
        return self if result is self._a else ndarray._of(result)

    def __getattr__(self, name: str) -> Any:
        # Everything else (reshape, sum, min, ravel, ...) is NumPy's method on the
        # data, its result wrapped: reductions give 0-d device arrays, as in CuPy.
        # Special names are not forwarded: NumPy would find ``__array_interface__``
        # and convert the array without a word, which CuPy never allows.
        if name == "_a" or name.startswith("__"):
            raise AttributeError(name)
        attribute = getattr(self._a, name)
        if not callable(attribute):
            return _wrap(attribute)

        def method(*args: Any, **kwargs: Any) -> Any:
            if "out" in kwargs:
                kwargs["out"] = _unwrap(kwargs["out"])
            return _wrap(attribute(*_unwrap(args), **_unwrap_kwargs(kwargs)))

        return method


ndarray.__module__ = "cupy"


def _unwrap_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {key: _unwrap(value) for key, value in kwargs.items()}


# --------------------------------------------------------------------------- module


class _Ufunc:
    """A NumPy ufunc acting on device arrays (``__call__``, ``at``, ``reduce``, ...)."""

    def __init__(self, ufunc: np.ufunc) -> None:
        self._ufunc = ufunc
        self.__name__ = ufunc.__name__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _call(self._ufunc, args, kwargs)

    # CuPy (_kernel.pyx, ``ufunc.at``): "a._scatter_op(indices, b, self._scatter_op)",
    # the scatter of ``a[indices] = ...``, which wraps integer indices out of range.
    def at(self, a: ndarray, indices: Any, b: Any = None) -> None:
        self._ufunc.at(a._a, _wrapped_index(indices, a.shape[0] if a.ndim else 0), _unwrap(b))

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._ufunc, name)
        if not callable(method):
            return method
        return lambda *args, **kwargs: _call(method, args, kwargs)


def _call(function: Callable[..., Any], args: Any, kwargs: dict[str, Any]) -> Any:
    outs: dict[int, Any] = {}
    if "out" in kwargs and isinstance(kwargs["out"], ndarray):
        outs[id(kwargs["out"]._a)] = kwargs["out"]
    result = function(*_unwrap(args), **_unwrap_kwargs(kwargs))
    if isinstance(result, np.ndarray) and id(result) in outs:
        return outs[id(result)]  # ``out=`` gives back the same array, as in CuPy
    return _wrap(result)


def _asarray(a: Any, dtype: Any = None, order: Any = None, *, blocking: bool = False) -> ndarray:
    if isinstance(a, ndarray):
        return a if dtype is None or a.dtype == np.dtype(dtype) else a.astype(dtype)
    host = np.asarray(a, dtype=dtype, order=order)
    if isinstance(a, np.ndarray):
        _state().transfers.to_device += 1
    return ndarray._of(np.array(host, copy=True))


def _array(a: Any, dtype: Any = None, copy: bool = True, order: str = "K", **_: Any) -> ndarray:
    if isinstance(a, ndarray):
        return ndarray._of(np.array(a._a, dtype=dtype, copy=copy, order=order))
    return _asarray(a, dtype)


# CuPy (_core/core.pyx): ``ascontiguousarray``: "zero_dim = a._shape.size() == 0";
# a contiguous 0-d array is returned as ``_manipulation._ndarray_ravel(a, 'C')``,
# otherwise "shape = (1,) if zero_dim else a.shape": a 0-d array comes back as (1,).
def _ascontiguousarray(a: Any, dtype: Any = None) -> ndarray:
    data = _asarray(a)._a
    if data.ndim == 0:
        data = data.reshape(1)
    return ndarray._of(np.ascontiguousarray(data, dtype=dtype))


# CuPy (_creation/from_data.py): ``asnumpy(a, stream=None, order='C', out=None, *,
# blocking=True)``: a ``cupy.ndarray`` is ``a.get(stream=stream, order=order,
# out=out, blocking=blocking)``; anything else is ``numpy.asarray(a, order=order)``
# (copied into ``out`` when given).
def _asnumpy(
    a: Any,
    stream: Stream | None = None,
    order: str = "C",
    out: Any = None,
    *,
    blocking: bool = True,
) -> np.ndarray:
    if isinstance(a, ndarray):
        return a._get("asnumpy", stream, order, out, blocking)
    host = np.asarray(a, order=order)
    if out is None:
        return host
    out[...] = host
    return out


def _note_transfer(kind: str) -> None:
    """Count a transfer CuPy makes inside a function (a size or a check read on the host)."""
    state = _state()
    state.declare_synchronize()
    transfers = state.transfers
    transfers.to_host += 1
    transfers.syncs += 1
    transfers.kinds[kind] += 1


# CuPy (_statistics/histogram.py, ``bincount``): "if (x < 0).any():  # synchronize!"
# then "size = int(cupy.max(x)) + 1": two transfers per call, whatever ``minlength``.
def _bincount(x: ndarray, weights: Any = None, minlength: int | None = None) -> ndarray:
    if x.ndim != 1:
        raise ValueError("object too deep for desired array")
    if x.dtype.kind == "f":
        raise TypeError("x must be int array")
    _note_transfer("bincount")
    if (x._a < 0).any():
        raise ValueError("The first argument of bincount must be non-negative")
    _note_transfer("bincount")
    return _wrap(np.bincount(x._a, weights=_unwrap(weights), minlength=minlength or 0))


# CuPy (_manipulation/add_remove.py, ``unique``): the distinct values are picked with
# a boolean mask (``aux[mask]``), whose size is read on the host: one transfer.
def _unique(ar: ndarray, *args: Any, **kwargs: Any) -> Any:
    _note_transfer("unique")
    return _call(np.unique, (ar, *args), kwargs)


def _get_array_module(*args: Any) -> types.ModuleType:
    return _state().module if any(isinstance(a, ndarray) for a in args) else np


class _CupyModule(types.ModuleType):
    """``cupy``: the functions defined here, and NumPy's for the rest."""

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(np, name)
        if isinstance(attribute, np.ufunc):
            return _Ufunc(attribute)
        if isinstance(attribute, type) or not callable(attribute):
            return attribute  # dtypes (cupy.float32 is numpy.float32) and constants

        def function(*args: Any, **kwargs: Any) -> Any:
            return _call(attribute, args, kwargs)

        function.__name__ = name
        return function


def _empty_pinned(shape: Any, dtype: Any = float, order: str = "C") -> np.ndarray:
    """``cupyx.empty_pinned``: a NumPy array (on a GPU, in page-locked memory)."""
    return np.empty(shape, dtype, order=order)


def _zeros_pinned(shape: Any, dtype: Any = float, order: str = "C") -> np.ndarray:
    return np.zeros(shape, dtype, order=order)


# CuPy (``ndarray.__setitem__``'s note, which the scatters share): "CuPy handles
# out-of-bounds indices differently from NumPy when using integer array indexing.
# NumPy handles them by raising an error, but CuPy wraps around them."
def _wrapped_index(indices: Any, length: int) -> Any:
    index = _unwrap(indices)
    if isinstance(index, np.ndarray) and index.dtype.kind in "iu" and length:
        return np.mod(index, length)
    return index


# CuPy (cupyx/_scatter.py): ``scatter_add`` is ``a.scatter_add(slices, value)``, and
# that method warns "`ndarray.scatter_add` is deprecated. Please use `cupy.add.at`
# instead." (DeprecationWarning), which the test suite turns into an error.
def _scatter_add(a: ndarray, slices: Any, value: Any) -> None:
    warnings.warn(
        "`ndarray.scatter_add` is deprecated. Please use `cupy.add.at` instead.",
        DeprecationWarning,
        stacklevel=2,
    )
    np.add.at(a._a, _wrapped_index(slices, a.shape[0] if a.ndim else 0), _unwrap(value))


class DeviceSynchronized(RuntimeError):
    """``cupyx.DeviceSynchronized``: a synchronization inside ``allow_synchronize(False)``."""


class StandinCupy:
    """The installed stand-in: its modules, what crossed to the host, and faults seen."""

    def __init__(self) -> None:
        self.transfers = Transfers()
        #: Faults a GPU would make silently (a buffer released under a pending copy).
        self.errors: list[str] = []
        self.current: list[Stream] = [Stream.null]
        self.streams: weakref.WeakSet[Stream] = weakref.WeakSet()
        self.module = self._build_cupy()
        self.cupyx = types.ModuleType("cupyx")
        self.cupyx.empty_pinned = _empty_pinned  # type: ignore[attr-defined]
        self.cupyx.zeros_pinned = _zeros_pinned  # type: ignore[attr-defined]
        self.cupyx.scatter_add = _scatter_add  # type: ignore[attr-defined]
        self.cupyx.allow_synchronize = self._allow_synchronize  # type: ignore[attr-defined]
        self.cupyx.DeviceSynchronized = DeviceSynchronized  # type: ignore[attr-defined]
        #: Whether synchronizing is allowed here (``cupyx.allow_synchronize``).
        self._allowed = True

    def _build_cupy(self) -> types.ModuleType:
        module = _CupyModule("cupy", "NumPy-backed stand-in for CuPy (tests only)")
        module.__version__ = "14.2.0-standin"  # type: ignore[attr-defined]
        streams = self.streams

        class _TrackedStream(Stream):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                streams.add(self)

        _TrackedStream.__name__ = "Stream"
        _TrackedStream.null = Stream.null
        cuda = types.ModuleType("cupy.cuda")
        cuda.Stream = _TrackedStream  # type: ignore[attr-defined]
        cuda.Event = Event  # type: ignore[attr-defined]
        cuda.Device = Device  # type: ignore[attr-defined]
        cuda.get_current_stream = get_current_stream  # type: ignore[attr-defined]
        runtime = types.ModuleType("cupy.cuda.runtime")
        runtime.getDeviceCount = lambda: 1  # type: ignore[attr-defined]
        cuda.runtime = runtime  # type: ignore[attr-defined]
        module.cuda = cuda  # type: ignore[attr-defined]
        module.ndarray = ndarray  # type: ignore[attr-defined]
        module.asarray = _asarray  # type: ignore[attr-defined]
        module.array = _array  # type: ignore[attr-defined]
        module.ascontiguousarray = _ascontiguousarray  # type: ignore[attr-defined]
        module.asnumpy = _asnumpy  # type: ignore[attr-defined]
        module.get_array_module = _get_array_module  # type: ignore[attr-defined]
        module.bincount = _bincount  # type: ignore[attr-defined]
        module.unique = _unique  # type: ignore[attr-defined]
        return module

    # CuPy (_core/syncdetect.py): ``allow_synchronize(allow)`` is a context manager;
    # ``_declare_synchronize()`` (called by ``get`` before every copy, blocking or
    # not) raises ``DeviceSynchronized`` inside ``allow_synchronize(False)``.
    @contextlib.contextmanager
    def _allow_synchronize(self, allow: bool) -> Iterator[None]:
        previous, self._allowed = self._allowed, bool(allow)
        try:
            yield
        finally:
            self._allowed = previous

    def declare_synchronize(self) -> None:
        """What CuPy's ``syncdetect._declare_synchronize`` does: refuse where forbidden."""
        if not self._allowed:
            raise DeviceSynchronized("Device synchronization was detected while disallowed.")

    def pending(self) -> int:
        """How many copies issued on side streams have not happened yet."""
        return sum(1 for stream in self.streams for op in stream._queue if isinstance(op, _Pending))

    def check(self) -> None:
        """Fail if a buffer was released under a pending copy (collects garbage first)."""
        gc.collect()
        if self.errors:
            errors, self.errors = self.errors, []
            pytest.fail("stand-in CuPy saw: " + "; ".join(errors))


@contextlib.contextmanager
def installed() -> Iterator[StandinCupy]:
    """Install the stand-in as ``cupy``/``cupyx`` for the duration of the block."""
    global _active
    if _active is not None:
        raise RuntimeError("the stand-in CuPy is already installed")
    saved = {name: sys.modules.get(name) for name in ("cupy", "cupy.cuda", "cupyx")}
    standin = StandinCupy()
    _active = standin
    sys.modules["cupy"] = standin.module
    sys.modules["cupy.cuda"] = standin.module.cuda  # type: ignore[attr-defined]
    sys.modules["cupyx"] = standin.cupyx
    from monitored._core import _backend

    streams, _backend._copy_streams = _backend._copy_streams, {}
    try:
        yield standin
        standin.check()
    finally:
        _backend._copy_streams = streams
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
        gc.collect()  # release the stand-in's arrays while it can still record faults
        _active = None


@pytest.fixture
def standin_cupy() -> Iterator[StandinCupy]:
    """A NumPy-backed CuPy installed as ``cupy``; see the module docstring."""
    with installed() as standin:
        yield standin
