"""``scalar``, ``histogram``, ``image``, ``audio``, ``text``: summaries from inside a step.

TF1's ``tf.summary.*`` set. A :class:`~monitored_summaries.SummarySaverHook`
arms a recorder for the steps that are due; on every other step each of these
functions reads one module global and returns (``tf.summary.record_if``): no
array is touched, no coroutine made. On a due step the values are kept as they
are (NumPy or CuPy) and moved to host together, in one batched transfer, after
the step.

The armed recorder lives in a context variable, so two sessions running in two
tasks (or threads) never see each other's recorder; the module global only
counts armed recorders, to keep the unarmed path to one lookup.
"""

from __future__ import annotations

import contextvars
from collections.abc import Mapping, Sequence
from typing import Any, Final, final

import numpy as np

from monitored import is_device_array

from ._errors import SummaryNameError, SummaryValueError
from ._tags import clean_tag

__all__ = ["audio", "histogram", "hparams", "image", "scalar", "text"]

#: How many recorders are armed, in any context. Zero: every call returns at once.
_armed: int = 0
_recorder: Final[contextvars.ContextVar[Recorder | None]] = contextvars.ContextVar(
    "monitored_summaries_recorder", default=None
)
#: Hyperparameters given to :func:`hparams` in this context, waiting for a hook to write
#: them. Per context, not per process: sessions running at once in one event loop (one
#: task each, as ``monitored_optuna.optimize`` runs trials) each write their own.
_pending_hparams: Final[
    contextvars.ContextVar[tuple[tuple[dict[str, Any], dict[str, float | None]], ...]]
] = contextvars.ContextVar("monitored_summaries_pending_hparams", default=())


@final
class Recorder:
    """What one due step records: ``(kind, name, value, extra)`` in call order."""

    __slots__ = ("records", "step", "token")

    def __init__(self, step: int) -> None:
        #: The global step the records are for (the step that is running).
        self.step = step
        self.records: list[tuple[str, str, Any, dict[str, Any]]] = []
        self.token: contextvars.Token[Recorder | None] | None = None


def arm(step: int) -> Recorder:
    """Start recording in the current context, for ``step``."""
    global _armed
    recorder = Recorder(step)
    recorder.token = _recorder.set(recorder)
    _armed += 1
    return recorder


def disarm(recorder: Recorder) -> None:
    """Stop recording (what was recorded stays in ``recorder.records``)."""
    global _armed
    if recorder.token is None:
        return
    try:
        _recorder.reset(recorder.token)
    except ValueError:  # armed in another context (a re-created session): just clear it
        if _recorder.get() is recorder:
            _recorder.set(None)
    recorder.token = None
    _armed -= 1


def current() -> Recorder | None:
    """The recorder armed in this context, if any."""
    return _recorder.get() if _armed else None


def _check_name(kind: str, name: object, step: int) -> str:
    """``name``, checked: a string that TF1's rules leave non-empty (it is written cleaned)."""
    if not isinstance(name, str) or not clean_tag(name):
        raise SummaryNameError(
            f"summaries.{kind} at step {step}: the summary name must be a non-empty string "
            "with a letter, digit, '_', '-' or '.' (TF1 writes other characters as '_' and "
            f"drops leading '/'), got {name!r}"
        )
    return name


def _as_array(kind: str, name: str, value: object, step: int) -> Any:
    """``value`` as an array (NumPy or CuPy, not copied) without reading its data."""
    if isinstance(value, np.ndarray) or is_device_array(value):
        return value
    if isinstance(value, int | float | np.generic) and not isinstance(value, str):
        return np.asarray(value)
    if isinstance(value, list | tuple):
        try:
            array = np.asarray(value)
        except ValueError as exc:
            raise SummaryValueError(
                f"{kind} {name!r} at step {step}: cannot make an array of {value!r}: {exc}"
            ) from exc
        if array.dtype.kind in "biuf":
            return array
    raise SummaryValueError(
        f"{kind} {name!r} at step {step}: expected a NumPy or CuPy array (or numbers), "
        f"got {type(value).__name__}"
    )


def scalar(name: str, value: Any) -> None:
    """Record a scalar (``tf.summary.scalar``); NaN and infinities are written as they are."""
    if not _armed:
        return
    recorder = _recorder.get()
    if recorder is None:
        return
    step = recorder.step
    name = _check_name("scalar", name, step)
    array = _as_array("scalar", name, value, step)
    if array.size != 1 or array.dtype.kind not in "biuf":
        raise SummaryValueError(
            f"scalar {name!r} at step {step}: expected one real number, got an array of "
            f"shape {tuple(array.shape)} and dtype {array.dtype}"
        )
    recorder.records.append(("scalar", name, array, {}))


def histogram(name: str, values: Any) -> None:
    """Record a histogram of ``values`` in TF's buckets (``tf.summary.histogram``)."""
    if not _armed:
        return
    recorder = _recorder.get()
    if recorder is None:
        return
    step = recorder.step
    name = _check_name("histogram", name, step)
    array = _as_array("histogram", name, values, step)
    if array.dtype.kind not in "biuf":
        raise SummaryValueError(
            f"histogram {name!r} at step {step}: expected real numbers, got dtype {array.dtype}"
        )
    recorder.records.append(("histogram", name, array, {}))


def _check_max_outputs(kind: str, name: str, max_outputs: object, step: int) -> int:
    if not isinstance(max_outputs, int) or isinstance(max_outputs, bool) or max_outputs < 1:
        raise SummaryValueError(
            f"{kind} {name!r} at step {step}: max_outputs must be a positive int, "
            f"got {max_outputs!r}"
        )
    return max_outputs


def image(name: str, images: Any, max_outputs: int = 3) -> None:
    """Record up to ``max_outputs`` images of an NHWC batch (``tf.summary.image``).

    ``uint8`` values are used as they are; floating values are taken to be in
    [0, 1] (clipped). ``C`` is 1 (grey), 3 (RGB) or 4 (RGBA).
    """
    if not _armed:
        return
    recorder = _recorder.get()
    if recorder is None:
        return
    step = recorder.step
    name = _check_name("image", name, step)
    array = _as_array("image", name, images, step)
    if array.ndim != 4 or array.shape[-1] not in (1, 3, 4):
        raise SummaryValueError(
            f"image {name!r} at step {step}: expected a 4-D [batch, height, width, channels] "
            f"array with 1, 3 or 4 channels, got shape {tuple(array.shape)}"
        )
    if array.dtype != np.uint8 and array.dtype.kind != "f":
        raise SummaryValueError(
            f"image {name!r} at step {step}: expected uint8, or floats in [0, 1], "
            f"got dtype {array.dtype}"
        )
    max_outputs = _check_max_outputs("image", name, max_outputs, step)
    recorder.records.append(("image", name, array[:max_outputs], {"max_outputs": max_outputs}))


def audio(name: str, audio: Any, sample_rate: int, max_outputs: int = 3) -> None:
    """Record up to ``max_outputs`` clips, ``[batch, frames(, channels)]`` floats in [-1, 1]."""
    if not _armed:
        return
    recorder = _recorder.get()
    if recorder is None:
        return
    step = recorder.step
    name = _check_name("audio", name, step)
    array = _as_array("audio", name, audio, step)
    if array.ndim not in (2, 3) or array.dtype.kind != "f":
        raise SummaryValueError(
            f"audio {name!r} at step {step}: expected floats of shape [batch, frames] or "
            f"[batch, frames, channels], got shape {tuple(array.shape)} dtype {array.dtype}"
        )
    if not isinstance(sample_rate, int | float) or sample_rate <= 0:
        raise SummaryValueError(
            f"audio {name!r} at step {step}: sample_rate must be a positive number, "
            f"got {sample_rate!r}"
        )
    max_outputs = _check_max_outputs("audio", name, max_outputs, step)
    recorder.records.append(
        (
            "audio",
            name,
            array[:max_outputs],
            {"sample_rate": int(sample_rate), "max_outputs": max_outputs},
        )
    )


def text(name: str, string: Any) -> None:
    """Record a string, or an array of strings, as Markdown (``tf.summary.text``)."""
    if not _armed:
        return
    recorder = _recorder.get()
    if recorder is None:
        return
    step = recorder.step
    name = _check_name("text", name, step)
    if isinstance(string, str | bytes):
        array = np.asarray(string)
    elif isinstance(string, np.ndarray) and string.dtype.kind in "SUO":
        array = string
    else:
        raise SummaryValueError(
            f"text {name!r} at step {step}: expected a str, bytes or an array of strings, "
            f"got {type(string).__name__}"
        )
    recorder.records.append(("text", name, array, {}))


def hparams(hparams: Mapping[str, Any], metrics: Mapping[str, float] | Sequence[str] = ()) -> None:
    """Record the run's hyperparameters, and its metrics, for TensorBoard's HParams dashboard.

    Unlike the other functions this records whether or not the step is due: the
    next summary write (or the session's end) writes it. ``metrics`` names
    scalar tags to compare runs by (their last values), or maps tags to final
    values, written as scalars at the end.
    """
    checked = check_hparams(hparams, "summaries.hparams")
    final: dict[str, float | None] = (
        {str(k): float(v) for k, v in metrics.items()}
        if isinstance(metrics, Mapping)
        else dict.fromkeys(map(str, metrics))
    )
    _pending_hparams.set((*_pending_hparams.get(), (checked, final)))


def check_hparams(hparams: object, where: str) -> dict[str, Any]:
    """``hparams`` as a dict of names to str/bool/number/None, or an error naming ``where``."""
    if not isinstance(hparams, Mapping):
        raise SummaryValueError(
            f"{where}: expected a mapping of names to values, got {type(hparams).__name__}"
        )
    checked: dict[str, Any] = {}
    for key, value in hparams.items():
        if not isinstance(key, str) or not key:
            raise SummaryNameError(f"{where}: names must be non-empty strings, got {key!r}")
        if value is not None and not isinstance(value, str | bool | int | float | np.generic):
            raise SummaryValueError(
                f"{where}: {key!r} must be a str, bool or number, got {type(value).__name__}"
            )
        checked[key] = value.item() if isinstance(value, np.generic) else value
    return checked


def take_hparams() -> list[tuple[dict[str, Any], dict[str, float | None]]]:
    """The hyperparameters recorded in this context since the last call."""
    taken = _pending_hparams.get()
    if not taken:
        return []
    _pending_hparams.set(())
    return list(taken)
