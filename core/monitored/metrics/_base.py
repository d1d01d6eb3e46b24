"""The :class:`Metric` base class and the input checks every metric shares.

A metric keeps its running sums in a few float64 arrays of the inputs' array
module (NumPy, or CuPy when it is given CuPy arrays: nothing leaves the device
until :meth:`Metric.result`, :meth:`Metric.state` or :meth:`Metric.merge`, so an
update never waits for the device). Input ranges (AUC's predictions in [0, 1],
class ids) are checked at once on NumPy; on CuPy their bounds are kept on the
device and judged when the sums are next read. Sums add up, so metrics updated
on several workers combine exactly with :meth:`Metric.merge`, and
:meth:`Metric.state` / :meth:`Metric.from_state` turn a metric into plain arrays
and back (to checkpoint it, or to reduce it across processes).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any, ClassVar, Final, Self

import numpy as np

from .._core._backend import array_module, is_device_array, to_host
from ._errors import (
    MetricMergeError,
    MetricShapeError,
    MetricStateError,
    MetricValueError,
    MetricWeightsError,
)

__all__ = ["Metric"]

#: The version of the layout :meth:`Metric.state` returns.
STATE_VERSION: Final = 1

_F64: Final = np.float64
_REGISTRY: dict[str, type[Metric]] = {}


class Metric:
    """A streaming metric: ``update`` with batches, ``result`` at any time, ``reset``.

    TF1's ``tf.metrics.*`` pairs of ``(value, update_op)`` become one object:
    ``update(...)`` is the update op, ``result()`` the value. ``result()`` of a
    metric that was never updated is ``0.0``, as TF's ``div_no_nan`` gives; check
    :attr:`empty` to tell "no data" from a real zero.

    Subclasses name their accumulators and shapes in :meth:`_layout` and their
    constructor arguments in :meth:`config`.
    """

    __slots__ = ("_arrays", "_deferred", "_updates", "_xp", "name")

    #: The name this kind of metric is saved under in :meth:`state`.
    kind: ClassVar[str] = "metric"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _REGISTRY[cls.kind] = cls

    def __init__(self, name: str | None = None) -> None:
        self.name = name if name is not None else self.kind
        self._xp: ModuleType = np
        self._arrays: dict[str, Any] = self._zeros(np)
        self._updates = 0
        #: Range checks still to judge (CuPy only): what -> ([min, max] on the
        #: device, lowest allowed, highest allowed).
        self._deferred: dict[str, tuple[Any, float, float]] = {}

    # -- what subclasses define ------------------------------------------------------------
    def _layout(self) -> dict[str, tuple[int, ...]]:
        """The accumulators: name -> shape (all float64)."""
        raise NotImplementedError

    def config(self) -> dict[str, Any]:
        """The constructor arguments (besides ``name``) that shape this metric."""
        return {}

    def result(self) -> float:
        """The metric's current value, as TF1's value tensor computes it."""
        raise NotImplementedError

    # -- state -----------------------------------------------------------------------------
    @property
    def updates(self) -> int:
        """How many times :meth:`update` was called since the last reset (merges add up)."""
        return self._updates

    @property
    def empty(self) -> bool:
        """Whether the metric has seen no update (its ``result()`` is then ``0.0``)."""
        return self._updates == 0

    @property
    def arrays(self) -> Mapping[str, Any]:
        """The accumulators, read-only by convention (NumPy or CuPy float64 arrays)."""
        return self._arrays

    def reset(self) -> None:
        """Forget every update: TF1's ``local_variables_initializer`` for this metric."""
        self._xp = np
        self._arrays = self._zeros(np)
        self._updates = 0
        self._deferred = {}

    def updated(self, *args: Any, **kwargs: Any) -> Self:
        """``update(*args, **kwargs)``, then the metric itself.

        A metric of one batch in one expression, as a ``model_fn``'s
        ``eval_metric_ops`` wants it: ``metrics.Accuracy().updated(labels, predicted)``
        reads as TF's ``tf.metrics.accuracy(labels, predicted)``.
        """
        update: Any = getattr(self, "update")  # noqa: B009 - each kind defines its own
        update(*args, **kwargs)
        return self

    def merge(self, other: Metric) -> Self:
        """Add ``other``'s sums to this metric's (another worker's share); returns ``self``.

        Both must be the same kind with the same configuration. The result equals
        the metric updated with both workers' batches.
        """
        if type(other) is not type(self) or other.config() != self.config():
            raise MetricMergeError(
                f"cannot merge metric {other.name!r} ({other.kind} {other.config()}) into "
                f"{self.name!r} ({self.kind} {self.config()}): both must be the same kind "
                "with the same configuration"
            )
        if other._updates == 0:
            return self
        if self._updates == 0 and other._xp is not self._xp:
            self._adopt(other._xp)
        if self._xp is np:
            other._verify()  # its device-side range checks, before its sums count
        for key, value in other._arrays.items():
            self._arrays[key] += _to_module(value, self._xp)
        for what, (bounds, low, high) in other._deferred.items():
            self._note_bounds(what, _to_module(bounds, self._xp), low, high)
        self._updates += other._updates
        return self

    def state(self) -> dict[str, Any]:
        """The metric as plain data: kind, name, configuration, update count and arrays.

        The arrays are the accumulators themselves (copies), in their own module;
        sum them element-wise to reduce metrics across processes. Range checks
        still pending on a device are judged first (one transfer).
        """
        self._verify()
        return {
            "kind": self.kind,
            "version": STATE_VERSION,
            "name": self.name,
            "config": self.config(),
            "updates": self._updates,
            "arrays": {key: value.copy() for key, value in self._arrays.items()},
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> Metric:
        """Rebuild a metric from :meth:`state` (of any kind when called on ``Metric``)."""
        kind = state.get("kind")
        target = _REGISTRY.get(kind) if isinstance(kind, str) else None
        if target is None or not issubclass(target, cls):
            raise MetricStateError(
                f"saved metric state {state.get('name')!r} is of kind {kind!r}, which "
                f"{cls.__name__}.from_state cannot rebuild (known kinds: {sorted(_REGISTRY)})"
            )
        version = state.get("version", STATE_VERSION)
        if not isinstance(version, int) or version > STATE_VERSION:
            raise MetricStateError(
                f"saved metric state {state.get('name')!r} has version {version!r}; this "
                f"version of monitored reads versions up to {STATE_VERSION}"
            )
        try:
            metric = target(name=state.get("name"), **dict(state.get("config", {})))
        except TypeError as exc:
            raise MetricStateError(
                f"saved metric state {state.get('name')!r} of kind {kind!r} has a "
                f"configuration this version cannot use: {exc}"
            ) from None
        arrays = dict(state.get("arrays", {}))
        layout = metric._layout()
        if set(arrays) != set(layout):
            raise MetricStateError(
                f"saved metric state {metric.name!r} ({kind}) holds arrays {sorted(arrays)}; "
                f"expected {sorted(layout)}"
            )
        xp = array_module(next(iter(arrays.values()))) if arrays else np
        restored: dict[str, Any] = {}
        for key, shape in layout.items():
            value = xp.asarray(_to_module(arrays[key], xp), dtype=xp.float64)
            if tuple(value.shape) != shape:
                raise MetricStateError(
                    f"saved metric state {metric.name!r} ({kind}): array {key!r} has shape "
                    f"{tuple(value.shape)}, expected {shape}"
                )
            restored[key] = value.copy()
        metric._xp = xp
        metric._arrays = restored
        metric._updates = int(state.get("updates", 0))
        return metric

    # -- helpers for subclasses --------------------------------------------------------------
    def _zeros(self, xp: ModuleType) -> dict[str, Any]:
        return {key: xp.zeros(shape, dtype=_F64) for key, shape in self._layout().items()}

    def _adopt(self, xp: ModuleType) -> None:
        """Move the (empty) accumulators to the module ``xp``, or refuse a mix."""
        if self._updates:
            where = "CuPy" if xp is not np else "NumPy"
            held = "CuPy" if self._xp is not np else "NumPy"
            raise MetricShapeError(
                f"metric {self.name!r} holds {held} sums and was given {where} arrays; "
                "keep one array module per metric (or reset it first)"
            )
        self._xp = xp
        self._arrays = self._zeros(xp)
        self._deferred = {}

    def _module(self, array: Any) -> ModuleType:
        """The module of ``array``; switches the accumulators to it if still empty."""
        xp = np if type(array) is np.ndarray else array_module(array)
        if xp is not self._xp:
            self._adopt(xp)
        return xp

    def _host(self) -> dict[str, np.ndarray[Any, Any]]:
        """The accumulators as NumPy arrays, range checks judged (one transfer on a device)."""
        if self._xp is np:
            return self._arrays
        keys = list(self._arrays)
        checks = list(self._deferred.items())
        host = to_host([self._arrays[key] for key in keys] + [c[1][0] for c in checks])
        self._judge(checks, host[len(keys) :])
        return dict(zip(keys, host[: len(keys)], strict=True))

    def _check_range(self, values: Any, low: float, high: float, what: str) -> None:
        """Refuse ``values`` outside ``[low, high]`` (``what`` says what they must be).

        On NumPy the check is made now (the metrics inline it on their NumPy path,
        this is the same check). On CuPy reading the bounds would make every update
        wait for the device, so the batch's minimum and maximum are folded into
        bounds kept on the device, judged when the sums are next read
        (:meth:`result`, :meth:`state`, :meth:`merge`). NaN fails either way.
        """
        xp = self._xp
        if xp is np:
            if values.size:
                lo, hi = float(values.min()), float(values.max())
                if not (lo >= low and hi <= high):
                    raise self._out_of_range(what, lo, hi, deferred=False)
            return
        if values.size:
            bounds = xp.stack([values.min(), values.max()]).astype(_F64)
            self._note_bounds(what, bounds, low, high)

    def _note_bounds(self, what: str, bounds: Any, low: float, high: float) -> None:
        held = self._deferred.get(what)
        if held is not None:
            xp = self._xp
            bounds = xp.stack(
                [xp.minimum(held[0][0], bounds[0]), xp.maximum(held[0][1], bounds[1])]
            )
        self._deferred[what] = (bounds, low, high)

    def _verify(self) -> None:
        """Judge the range checks still pending on the device (one transfer for all)."""
        if self._deferred:
            checks = list(self._deferred.items())
            self._judge(checks, to_host([c[1][0] for c in checks]))

    def _judge(self, checks: list[tuple[str, tuple[Any, float, float]]], bounds: list[Any]) -> None:
        for (what, (_, low, high)), (lo, hi) in zip(checks, bounds, strict=True):
            if not (lo >= low and hi <= high):
                # Kept: every later read fails too, until reset() drops the bad sums.
                raise self._out_of_range(what, float(lo), float(hi), deferred=True)
        for what, _ in checks:
            del self._deferred[what]

    def _out_of_range(self, what: str, lo: float, hi: float, deferred: bool) -> MetricValueError:
        when = (
            " in the updates since the last check (on CuPy the range is checked on the "
            "device and reported when the sums are read: result(), state() or merge())"
            if deferred
            else ""
        )
        return MetricValueError(
            f"metric {self.name!r} ({self.kind}): {what}, got values from {lo:g} to {hi:g}{when}"
        )

    def __repr__(self) -> str:
        config = "".join(f", {key}={value!r}" for key, value in self.config().items())
        return f"{type(self).__name__}(name={self.name!r}{config}, updates={self._updates})"


# -- input handling ---------------------------------------------------------------------------
def as_array(value: Any) -> Any:
    """``value`` itself when it is a NumPy or CuPy array, else ``numpy.asarray(value)``."""
    if type(value) is np.ndarray or is_device_array(value):
        return value
    return np.asarray(value)


def _to_module(array: Any, xp: ModuleType) -> Any:
    if xp is np:
        if is_device_array(array):
            return array.get()
        return np.asarray(array)
    return xp.asarray(array)


def match_shapes(metric: Metric, labels: Any, predictions: Any) -> tuple[Any, Any]:
    """Labels and predictions of one shape, as TF1 accepts them.

    Equal shapes pass; when the ranks differ by one and the longer shape ends in
    a dimension of 1, that dimension is squeezed (TF's
    ``remove_squeezable_dimensions``); anything else is a :class:`MetricShapeError`.
    """
    xp = array_module(predictions)
    labels = _to_module(as_array(labels), xp)
    if labels.shape == predictions.shape:
        return labels, predictions
    if labels.ndim == predictions.ndim + 1 and labels.shape[-1] == 1:
        squeezed = labels.reshape(labels.shape[:-1])
        if squeezed.shape == predictions.shape:
            return squeezed, predictions
    if predictions.ndim == labels.ndim + 1 and predictions.shape[-1] == 1:
        squeezed = predictions.reshape(predictions.shape[:-1])
        if squeezed.shape == labels.shape:
            return labels, squeezed
    raise MetricShapeError(
        f"metric {metric.name!r} ({metric.kind}): labels of shape {tuple(labels.shape)} and "
        f"predictions of shape {tuple(predictions.shape)} do not match; they must have the "
        "same shape (a trailing dimension of 1 on one of them is squeezed)"
    )


def broadcast_weights(metric: Metric, weights: Any, shape: tuple[int, ...], xp: ModuleType) -> Any:
    """``weights`` as float64 broadcast to ``shape``, by TF1's rules.

    A scalar weighs everything; otherwise the weights' rank must equal the
    values' (after squeezing or adding a trailing dimension of 1, as TF does) and
    each dimension must be 1 or the values' size.
    """
    w = xp.asarray(_to_module(as_array(weights), xp), dtype=_F64)
    if w.ndim == 0:
        return xp.broadcast_to(w, shape)
    given = tuple(w.shape)
    if w.ndim == len(shape) + 1 and w.shape[-1] == 1:
        w = w.reshape(w.shape[:-1])
    elif w.ndim == len(shape) - 1:
        w = w.reshape((*w.shape, 1))
    if w.ndim != len(shape) or any(d not in (1, s) for d, s in zip(w.shape, shape, strict=True)):
        raise MetricWeightsError(
            f"metric {metric.name!r} ({metric.kind}): weights of shape {given} do not "
            f"broadcast to the values' shape {shape}; give a scalar, or an array of the "
            "values' rank whose dimensions are 1 or the values' size"
        )
    return xp.broadcast_to(w, shape)
