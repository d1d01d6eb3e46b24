"""Stop decisions, separate from where the values come from.

:class:`KerasRule` decides exactly as Keras's ``EarlyStopping`` callback does for
the same sequence of values (one value per "epoch": here, per check);
:class:`NoImprovementRule` as TF1 Estimator's ``stop_if_no_decrease_hook`` /
``stop_if_no_increase_hook``, counting global steps. Both keep their state in a
JSON-serializable dict so that a resumed run decides as an uninterrupted one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol, final

from monitored import printable

from ._errors import EarlyStoppingConfigError, EarlyStoppingStateError

__all__ = ["Decision", "KerasRule", "NoImprovementRule", "Rule", "infer_mode", "saved_field"]

Mode = Literal["auto", "min", "max"]

#: Name fragments that mean "higher is better" for ``mode="auto"``.
_HIGHER: Final = ("acc", "auc", "precision", "recall", "f1", "fmeasure", "iou", "score", "map")
#: Name fragments that mean "lower is better".
_LOWER: Final = ("loss", "error", "err", "mse", "mae", "perplexity", "ppl", "nll", "crossentropy")


def infer_mode(monitor: str, mode: str, where: str) -> Literal["min", "max"]:
    """``"min"`` or ``"max"`` for ``monitor``; ``mode="auto"`` reads the name.

    A ``val_``/``eval_`` prefix is ignored; a name ending in a loss or error means
    ``min``, one naming accuracy, AUC, precision, recall, F1 or a score means
    ``max``. A name that says neither is an error (as in Keras 3) rather than a
    guess.
    """
    if mode == "min":
        return "min"
    if mode == "max":
        return "max"
    if mode != "auto":
        raise EarlyStoppingConfigError(
            f"{where}: mode must be 'auto', 'min' or 'max', got {mode!r}"
        )
    name = monitor.lower().rsplit("/", 1)[-1]
    for prefix in ("val_", "eval_", "validation_", "test_"):
        name = name.removeprefix(prefix)
    if any(name.endswith(part) or name == part for part in _LOWER):
        return "min"
    if any(part in name for part in _HIGHER):
        return "max"
    if any(part in name for part in _LOWER):
        return "min"
    raise EarlyStoppingConfigError(
        f"{where}: cannot tell from the name {monitor!r} whether it should go down or up; "
        "pass mode='min' or mode='max'"
    )


@final
@dataclass(frozen=True, slots=True)
class Decision:
    """What one observation means: a new best (``improved``), a stop, or neither.

    ``snapshot`` says that the state of this check is, from now on, the one to
    restore (a new best, or the first value observed: Keras keeps those weights).
    """

    improved: bool = False
    stop: bool = False
    snapshot: bool = False


_NOTHING: Final = Decision()
#: Every decision a rule returns, made once (a frozen dataclass costs a microsecond
#: to create, and a rule decides at every check), by ``(improved, stop, snapshot)``.
_DECISIONS: Final = {
    (improved, stop, snapshot): Decision(improved, stop, snapshot)
    for improved in (False, True)
    for stop in (False, True)
    for snapshot in (False, True)
}


class Rule(Protocol):
    """A stop decision over a sequence of ``(step, value)`` observations."""

    best: float | None
    best_step: int | None

    def observe(self, step: int, value: float) -> Decision: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


@final
class KerasRule:
    """Keras's ``EarlyStopping`` decision: ``wait``, ``min_delta``, ``baseline``, warm-up.

    Each observation is one Keras "epoch" (its index counts observations from 0,
    across resumes). Observations before ``start_from`` are ignored; every other
    one adds 1 to ``wait``; one that beats the best by more than ``min_delta``
    becomes the best and resets ``wait`` to 0 only when it also beats
    ``baseline``; otherwise training stops once ``wait >= patience`` (never on
    the very first observation).
    """

    __slots__ = (
        "baseline",
        "best",
        "best_index",
        "best_step",
        "index",
        "min_delta",
        "mode",
        "patience",
        "start_from",
        "stopped_step",
        "wait",
    )

    def __init__(
        self,
        mode: Literal["min", "max"],
        min_delta: float = 0.0,
        patience: int = 0,
        baseline: float | None = None,
        start_from: int = 0,
    ) -> None:
        self.mode = mode
        self.min_delta = abs(min_delta)
        self.patience = patience
        self.baseline = baseline
        self.start_from = start_from
        self.best: float | None = None
        self.best_step: int | None = None
        self.best_index: int | None = None
        self.index = 0
        self.wait = 0
        self.stopped_step: int | None = None

    def _beats(self, value: float, reference: float | None) -> bool:
        if reference is None:
            reference = math.inf if self.mode == "min" else -math.inf
        if self.mode == "min":
            return value + self.min_delta < reference
        return value - self.min_delta > reference

    def observe(self, step: int, value: float) -> Decision:
        epoch = self.index
        self.index += 1
        if epoch < self.start_from:
            return _NOTHING
        first = self.best_step is None
        if first:  # Keras: the first observed weights are the best until beaten
            self.best_step, self.best_index = step, epoch
        self.wait += 1
        if self._beats(value, self.best):
            self.best, self.best_step, self.best_index = value, step, epoch
            if self.baseline is None or self._beats(value, self.baseline):
                self.wait = 0
            return _DECISIONS[True, False, True]
        if self.wait >= self.patience and epoch > 0:
            self.stopped_step = step
            return _DECISIONS[False, True, first]
        return _DECISIONS[False, False, first]

    def state_dict(self) -> dict[str, Any]:
        return {
            "best": self.best,
            "best_step": self.best_step,
            "best_index": self.best_index,
            "index": self.index,
            "wait": self.wait,
            "stopped_step": self.stopped_step,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        where = "rule"  # every field checked before any is stored
        checked = (
            saved_field(state, "best", "number", where),
            saved_field(state, "best_step", "step", where),
            saved_field(state, "best_index", "step", where),
            saved_field(state, "index", "count", where),
            saved_field(state, "wait", "count", where),
            saved_field(state, "stopped_step", "step", where),
        )
        (
            self.best,
            self.best_step,
            self.best_index,
            self.index,
            self.wait,
            self.stopped_step,
        ) = checked


@final
class NoImprovementRule:
    """TF1 Estimator's rule: stop when the best value is ``max_steps`` steps old.

    Values at steps below ``min_steps`` are ignored. A value strictly better than
    the best so far (lower for ``"min"``, higher for ``"max"``) becomes the best;
    training stops once ``step - best_step >= max_steps_without_improvement``.
    """

    __slots__ = ("best", "best_step", "max_steps", "min_steps", "mode", "stopped_step")

    def __init__(
        self, mode: Literal["min", "max"], max_steps_without_improvement: int, min_steps: int = 0
    ) -> None:
        self.mode = mode
        self.max_steps = max_steps_without_improvement
        self.min_steps = min_steps
        self.best: float | None = None
        self.best_step: int | None = None
        self.stopped_step: int | None = None

    def observe(self, step: int, value: float) -> Decision:
        if step < self.min_steps:
            return _NOTHING
        improved = self.best is None or (
            value < self.best if self.mode == "min" else value > self.best
        )
        if improved:
            self.best, self.best_step = value, step
        assert self.best_step is not None
        if step - self.best_step >= self.max_steps:
            self.stopped_step = step
            return _DECISIONS[improved, True, improved]
        return _DECISIONS[improved, False, improved]

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_step": self.best_step, "stopped_step": self.stopped_step}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        where = "rule"  # every field checked before any is stored
        self.best, self.best_step, self.stopped_step = (
            saved_field(state, "best", "number", where),
            saved_field(state, "best_step", "step", where),
            saved_field(state, "stopped_step", "step", where),
        )


#: What each kind of saved field may hold, said in the error when it holds something else.
_KINDS: Final = {
    "number": "a number or null",
    "step": "an integer >= 0 or null",
    "count": "an integer >= 0",
    "text": "a string or null",
}


def saved_field(
    state: Mapping[str, Any], key: str, kind: str, where: str, *, optional: bool = False
) -> Any:
    """``state[key]``, checked to be of ``kind`` (a key of ``_KINDS``).

    A checkpoint may come from elsewhere: a field missing (unless ``optional``: then
    ``None``, for fields older versions did not save) or of the wrong type is an
    :class:`EarlyStoppingStateError` naming it, when the state is restored.
    """
    if optional and key not in state:
        return None
    if key not in state:
        raise EarlyStoppingStateError(
            f"early stopping: the restored state has no {where}.{key} ({_KINDS[kind]})"
        )
    value = state[key]
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if value is None:
        ok = kind != "count"
    elif kind == "number":
        ok = is_int or isinstance(value, float)
    elif kind == "text":
        ok = isinstance(value, str)
    else:
        ok = is_int and value >= 0
    if not ok:
        shown = printable(repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "...")
        raise EarlyStoppingStateError(
            f"early stopping: the restored {where}.{key} is {shown} "
            f"({type(value).__name__}); expected {_KINDS[kind]}"
        )
    return value
