"""``NanTensorHook``: TF1's NaN guard, with state scans, spike detection and rollback.

With ``lag=0`` (TF1's hook) each step's loss is checked in that step: one name
in the session's batched fetch, which comes back with every other hook's values
in the step's one host transfer (on a GPU, that transfer waits for the step).
With ``lag=1`` (the installed plugin) nothing waits for the device: a loss on a
device is fetched one step late (its copy overlaps the next step) and checked
then; a loss on the host is read in ``after_run`` itself, with no fetch at all.
A state scan, when due, reduces every floating array on its device to a count
of non-finite elements and moves all counts to the host in one transfer.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
import sys
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal, final

import anyio.to_thread
import numpy as np

import monitored
from monitored import (
    DamagedCheckpointError,
    FetchError,
    OptionalFetch,
    PluginError,
    Provider,
    SessionRunArgs,
    is_device_array,
    to_host,
)

from ._errors import (
    LossSpikeError,
    NanGuardConfigError,
    NanLossDuringTrainingError,
    NonFiniteLossError,
    NonFiniteStateError,
    RollbackError,
)

if TYPE_CHECKING:
    from monitored import Coordinator, MonitoredSession, SessionRunContext, SessionRunValues

__all__ = ["Failure", "NanTensorHook", "Rollback"]

log = logging.getLogger("monitored.nan_guard")

#: What to do on a failure.
OnNan = Literal["raise", "stop", "rollback"]
ON_NAN: Final = ("raise", "stop", "rollback")

#: TF1's log line and error message, word for word.
DIVERGED: Final = "Model diverged with loss = NaN."
NAN_LOSS: Final = "NaN loss during training."

#: What a rollback needs of the provider of "checkpoint" (see ``monitored.hookspecs``).
_ROLLBACK_HOOKS: Final = ("list_checkpoints", "restore_checkpoint")
_ROLLBACK_NEEDS: Final = "NanTensorHook: on_nan='rollback' restores checkpoints"

_MISSING: Final = object()

#: Whether values of a type live on a device, by type (decided once per type).
_ON_DEVICE: dict[type, bool] = {}

#: Host scalar types whose ``float()`` is the value itself: the cheapest path.
_HOST_FLOATS: Final = frozenset({float, np.float16, np.float32, np.float64})


@final
@dataclass(frozen=True, slots=True)
class Failure:
    """One detected divergence.

    ``kind`` is ``"nan"`` or ``"inf"`` (the loss), ``"spike"`` (the loss jumped),
    or ``"state"`` (a state array holds non-finite values: ``array`` names the
    first such array, ``count`` how many of its ``size`` elements are bad).
    """

    kind: Literal["nan", "inf", "spike", "state"]
    step: int
    value: float | None = None
    array: str | None = None
    count: int | None = None
    size: int | None = None
    detail: str = ""

    def describe(self) -> str:
        """A one-line account of the failure, naming the step."""
        if self.kind == "state":
            return (
                f"state array {self.array!r} has {self.count} non-finite of {self.size} "
                f"elements at step {self.step}"
            )
        if self.kind == "spike":
            return f"loss spike at step {self.step}: {self.value:g} ({self.detail})"
        return f"loss = {self.value} at step {self.step}"


@final
@dataclass(frozen=True, slots=True)
class Rollback:
    """A rollback done: training went back from ``failed_step`` to ``restored_step``.

    ``skip`` holds the global steps whose input batches the data pipeline should
    skip when it replays them (the failing window and ``skip_extra_steps`` more):
    replaying the same batches from the same state would diverge again.
    """

    number: int
    failure: Failure
    restored_step: int
    path: str
    skip: range

    @property
    def failed_step(self) -> int:
        """The global step whose result diverged."""
        return self.failure.step


@final
class NanTensorHook:
    """Checks a loss every step; raises, stops or rolls back when it diverges.

    With only ``loss_tensor`` and ``fail_on_nan_loss`` this is TF1's
    ``NanTensorHook``: a NaN loss logs "Model diverged with loss = NaN." and
    raises :class:`~monitored.NanLossDuringTrainingError` ("NaN loss during
    training."; ``end`` is not called, as after any error), or with ``False``
    logs and requests a stop. An infinite loss passes, as in TF1, unless
    ``fail_on_inf``.

    Args:
        loss_tensor: the step output or state entry to watch (a name, or
            ``monitored.optional(name)`` to accept steps without it).
        fail_on_nan_loss: TF1's switch between raising and stopping.
        fail_on_inf: treat an infinite loss as a failure too.
        check_state_every_n_steps: every this many steps, scan every floating
            array of the state for NaN and infinities (0: never).
        on_nan: ``"raise"``, ``"stop"`` or ``"rollback"``; overrides
            ``fail_on_nan_loss`` when given.
        checkpoint_dir: where ``"rollback"`` finds checkpoints (default: the
            session's ``checkpoint_dir``, or that of a checkpoint saver hook).
        max_rollbacks: rollbacks allowed in a run; one more failure raises
            :class:`RollbackError`.
        skip_extra_steps: after a rollback, also skip the batches of this many
            steps after the failing one (the recovery of large trainings: restart
            from before a spike and skip the data around it).
        on_rollback: called (sync or async) with each :class:`Rollback`, to tell
            the input pipeline which steps' batches to skip.
        lag: 0 checks each step's loss in that step (TF1; on a GPU the step's
            fetch then waits for the device); 1 never makes a step wait: a loss on
            a device is checked one step late, its copy overlapping the next step
            (a failure still names the step whose loss it was), a loss on the host
            at once. The installed plugin uses 1.
        spike_k: a finite loss more than ``spike_k`` standard deviations above
            the mean of the last ``spike_window`` losses is a failure (``None``: off).
        spike_window: the running window's length.
        spike_min_samples: losses the window needs before spikes are judged.
    """

    #: Keys the hook's state (rollbacks done) in checkpoints.
    plugin_name = "nan_tensor_hook"
    #: Passed in ``hooks=[...]``, it is the session's NaN guard: the installed
    #: ``nan_guard`` plugin steps aside (one guard, the one you configured).
    provides: ClassVar[frozenset[str]] = frozenset({"nan_guard"})

    def __init__(
        self,
        loss_tensor: str = "loss",
        fail_on_nan_loss: bool = True,
        *,
        fail_on_inf: bool = False,
        check_state_every_n_steps: int = 0,
        on_nan: OnNan | None = None,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        max_rollbacks: int = 3,
        skip_extra_steps: int = 0,
        on_rollback: Callable[[Rollback], Any] | None = None,
        spike_k: float | None = None,
        spike_window: int = 100,
        spike_min_samples: int = 20,
        lag: Literal[0, 1] = 0,
    ) -> None:
        where = "NanTensorHook"
        if not isinstance(loss_tensor, str) or not loss_tensor:
            raise NanGuardConfigError(f"{where}: loss_tensor must be a name, got {loss_tensor!r}")
        if on_nan is None:
            on_nan = "raise" if fail_on_nan_loss else "stop"
        if on_nan not in ON_NAN:
            raise NanGuardConfigError(f"{where}: on_nan must be one of {ON_NAN}, got {on_nan!r}")
        for name, value, low in (
            ("check_state_every_n_steps", check_state_every_n_steps, 0),
            ("max_rollbacks", max_rollbacks, 0),
            ("skip_extra_steps", skip_extra_steps, 0),
            ("spike_window", spike_window, 2),
            ("spike_min_samples", spike_min_samples, 2),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise NanGuardConfigError(
                    f"{where}: {name} must be an integer >= {low}, got {value!r}"
                )
        if isinstance(lag, bool) or lag not in (0, 1):
            raise NanGuardConfigError(
                f"{where}: lag must be 0 (check each loss in its step) or 1 (a device's loss "
                f"one step late, without waiting for it), got {lag!r}"
            )
        if spike_k is not None and not (isinstance(spike_k, int | float) and spike_k > 0):
            raise NanGuardConfigError(
                f"{where}: spike_k must be a positive number, got {spike_k!r}"
            )
        self.loss_tensor = loss_tensor
        self.fail_on_inf = fail_on_inf
        self.on_nan: OnNan = on_nan
        self.check_state_every_n_steps = check_state_every_n_steps
        self.checkpoint_dir = os.fspath(checkpoint_dir) if checkpoint_dir is not None else None
        self.max_rollbacks = max_rollbacks
        self.skip_extra_steps = skip_extra_steps
        self.on_rollback = on_rollback
        self.spike_k = spike_k
        self.spike_min_samples = min(spike_min_samples, spike_window)
        self._window: deque[float] = deque(maxlen=spike_window)
        self._sum = 0.0
        self._sum_sq = 0.0
        self._args = SessionRunArgs(loss_tensor)
        self.lag: Literal[0, 1] = lag
        self._name = str(loss_tensor)
        self._optional = isinstance(loss_tensor, OptionalFetch)
        self._late_args = SessionRunArgs(loss_tensor, lag=1)
        #: Whether a finite loss still needs judging (infinities, spikes).
        self._strict = fail_on_inf or spike_k is not None
        #: lag=1: what ``before_run`` asks for. The value one step late while it lives
        #: on a device (and until the first step shows where it lives); ``None`` while
        #: it is a host value, read in ``after_run`` without a fetch.
        self._late: SessionRunArgs | None = self._late_args
        #: lag=1: set by ``before_run``, so that ``after_run`` tells a step from the
        #: extra call that delivers the last step's values when the session stops.
        self._fresh = False
        #: lag=1: the global step whose device value the pending fetch brings, if any.
        self._in_flight: int | None = None
        #: Whether a step without the (optional) output has nothing to watch: no
        #: state entry of that name (entries are fixed once the session is created).
        self._absent = False
        self._next_scan: int | None = None
        #: Every failure detected so far (also those that only stopped or rolled back).
        self.failures: list[Failure] = []
        #: Every rollback done, oldest first (kept across the restores themselves).
        self.rollbacks: list[Rollback] = []
        self._rollback_count = 0
        #: With ``on_nan="rollback"``: who lists and restores checkpoints in this session.
        self._checkpoints: Provider | None = None

    # -- hooks ----------------------------------------------------------------------------------
    def after_create_session(self, session: MonitoredSession, coord: Coordinator) -> None:
        self._absent = self._optional and self._name not in session.state
        if self.check_state_every_n_steps:
            self._next_scan = session.state.global_step + self.check_state_every_n_steps
        if self.on_nan == "rollback":
            if self.checkpoint_dir is None:
                self.checkpoint_dir = _find_checkpoint_dir(session)
            if self.checkpoint_dir is None:
                raise NanGuardConfigError(
                    "NanTensorHook: on_nan='rollback' needs checkpoints to roll back to; "
                    "pass checkpoint_dir=, or give the session a checkpoint_dir "
                    "(MonitoredTrainingSession) or a CheckpointSaverHook"
                )
            # Found now, so that a missing provider fails here, not at the first divergence.
            self._checkpoints = _checkpoint_provider(session)

    def before_run(self, run_context: SessionRunContext) -> SessionRunArgs | None:
        if self.lag:
            self._fresh = True
            return self._late
        return self._args

    @monitored.hookimpl(tryfirst=True)
    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> Any:
        # Sync on purpose: a healthy step returns at once, creating no coroutine.
        # tryfirst: a failure is handled before a checkpoint saver saves the step.
        if self.lag and self._fresh and self._in_flight is None and self._next_scan is None:
            # The common step of the installed guard, at its cheapest: a finite host
            # loss, nothing on its way from a device, no state scans.
            current = run_context.session.last_outputs.get(self._name, _MISSING)
            if (type(current) in _HOST_FLOATS and current == current and not self._strict) or (
                current is _MISSING and self._absent
            ):
                self._fresh = False
                self._late = None
                return None
        return self._after_run(run_context, run_values)

    def _after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> Any:
        value = run_values.results
        session = run_context.session
        state = session.state
        step = state.global_step
        failure = None
        fresh = True
        if self.lag:
            arrived, self._in_flight = self._in_flight, None
            if value is not None and arrived is not None:
                failure = self._check(value, arrived)
            fresh, self._fresh = self._fresh, False
            if fresh and failure is None:
                current = session.last_outputs.get(self._name, _MISSING)
                if type(current) in _HOST_FLOATS:  # the common case, inlined
                    self._late = None
                    if current != current or self._strict:
                        failure = self._check(current, step)
                else:
                    failure = self._check_current(session, step, current)
        elif value is not None:
            failure = self._check(value, step)
        next_scan = self._next_scan
        if fresh and failure is None and next_scan is not None and step >= next_scan:
            self._next_scan = step + self.check_state_every_n_steps
            failure = scan_state(state, step)
        if failure is None:
            return None
        self._in_flight = None  # a later step's value, still on its way: not judged
        return self._handle(run_context, failure)

    def plugin_state(self) -> dict[str, Any]:
        return {"rollbacks": self._rollback_count}

    def load_plugin_state(self, state: dict[str, Any]) -> None:
        # A resumed run counts the rollbacks of the run it resumes (a rollback keeps
        # its own count across the restore it does, see _rollback).
        self._rollback_count = int(state.get("rollbacks", 0))

    # -- checks ---------------------------------------------------------------------------------
    def _check(self, value: Any, step: int) -> Failure | None:
        """The failure that ``value``, the host value of ``step``'s loss, shows, if any."""
        loss = self._scalar(value, step)
        if loss != loss:
            return Failure("nan", step, loss)
        if self.fail_on_inf and (loss == math.inf or loss == -math.inf):
            return Failure("inf", step, loss)
        if self.spike_k is not None and loss != math.inf and loss != -math.inf:
            return self._note_loss(loss, step)
        return None

    def _check_current(self, session: MonitoredSession, step: int, value: Any) -> Failure | None:
        """lag=1: judge this step's ``value`` if on the host; else note it is on its way.

        A device value was asked for in this step's ``before_run`` (it arrives at the
        next step), unless the value was on the host (or missing) until now: then it
        is read at once, this one time, and asked for one step late from then on.
        """
        name = self._name
        if value is _MISSING:
            if name in session.state:
                value = session.state[name]
            elif name == "global_step":  # as the session's fetches resolve it
                value = np.int64(step)
            elif self._optional:
                self._late = None
                return None
            else:
                raise FetchError(
                    f"NanTensorHook: loss_tensor {name!r} is neither an output of step {step} "
                    f"({sorted(session.last_outputs)}) nor a state entry "
                    f"({sorted(session.state)}); monitored.optional({name!r}) accepts steps "
                    "without it"
                )
        kind = type(value)
        on_device = _ON_DEVICE.get(kind)
        if on_device is None:
            on_device = _ON_DEVICE[kind] = is_device_array(value)
        if not on_device:
            self._late = None
            return self._check(value, step)
        if self._late is None:
            self._late = self._late_args
            return self._check(to_host([value])[0], step)
        self._in_flight = step
        return None

    def _scalar(self, value: Any, step: int) -> float:
        return monitored.to_scalar(
            value, f"NanTensorHook: loss_tensor {self.loss_tensor!r}", step, NanGuardConfigError
        )

    def _note_loss(self, loss: float, step: int) -> Failure | None:
        """Judge ``loss`` against the running window, then add it (spikes are not added)."""
        window = self._window
        n = len(window)
        assert self.spike_k is not None
        if n >= self.spike_min_samples:
            mean = self._sum / n
            std = math.sqrt(max(self._sum_sq / n - mean * mean, 0.0))
            limit = mean + self.spike_k * std
            if std > 0 and loss > limit:
                detail = (
                    f"more than {self.spike_k:g} standard deviations above the mean "
                    f"{mean:g} of the last {n} losses (limit {limit:g})"
                )
                return Failure("spike", step, loss, detail=detail)
        if n == window.maxlen:
            old = window[0]
            self._sum -= old
            self._sum_sq -= old * old
        window.append(loss)
        self._sum += loss
        self._sum_sq += loss * loss
        return None

    def _reset_window(self) -> None:
        self._window.clear()
        self._sum = self._sum_sq = 0.0

    # -- failures -------------------------------------------------------------------------------
    def _handle(self, run_context: SessionRunContext, failure: Failure) -> Any:
        self.failures.append(failure)
        if failure.kind == "nan":
            log.error(DIVERGED)
        else:
            log.error("NanTensorHook: %s", failure.describe())
        if self.on_nan == "raise":
            raise _error(failure)
        if self.on_nan == "stop":
            run_context.request_stop()
            return None
        return self._rollback(run_context, failure)

    async def _rollback(self, run_context: SessionRunContext, failure: Failure) -> None:
        session = run_context.session
        done = self._rollback_count
        if done >= self.max_rollbacks:
            raise RollbackError(
                f"NanTensorHook: {failure.describe()}, but max_rollbacks={self.max_rollbacks} "
                f"rollbacks are done already; giving up"
            ) from _error(failure)
        assert self.checkpoint_dir is not None
        checkpoints = self._checkpoints or _checkpoint_provider(session)
        path = await _restore_older(checkpoints, session, self.checkpoint_dir, failure)
        restored = session.state.global_step
        self._rollback_count = done + 1
        self._reset_window()
        if self._next_scan is not None:
            self._next_scan = session.state.global_step + self.check_state_every_n_steps
        rollback = Rollback(
            number=done + 1,
            failure=failure,
            restored_step=restored,
            path=path,
            skip=range(restored + 1, failure.step + 1 + self.skip_extra_steps),
        )
        self.rollbacks.append(rollback)
        log.warning(
            "NanTensorHook: rolled back to %s (step %d) after %s; rollback %d of at most %d, "
            "skipping the batches of steps %d..%d",
            path,
            restored,
            failure.describe(),
            rollback.number,
            self.max_rollbacks,
            rollback.skip.start,
            rollback.skip.stop - 1,
        )
        if self.on_rollback is not None:
            result = self.on_rollback(rollback)
            if inspect.isawaitable(result):
                await result

    def is_skipped(self, step: int) -> bool:
        """Whether the batch of global step ``step`` is to be skipped after a rollback."""
        return any(step in rollback.skip for rollback in self.rollbacks)


def scan_state(state: monitored.TrainState, step: int) -> Failure | None:
    """The first floating state array holding NaN or infinities, as a :class:`Failure`.

    One reduction per array on its device (a count of non-finite elements), and
    one host transfer for all the counts.
    """
    names = [name for name, array in state.items() if array.dtype.kind in "fc"]
    if not names:
        return None
    counts = []
    for name in names:
        array = state[name]
        xp = _module_of(array)
        counts.append(xp.count_nonzero(~xp.isfinite(array)))
    for name, count in zip(names, to_host(counts), strict=True):
        if int(count):
            return Failure("state", step, array=name, count=int(count), size=int(state[name].size))
    return None


def _module_of(array: Any) -> Any:
    if is_device_array(array):
        import cupy

        return cupy
    return np


def _error(failure: Failure) -> NanLossDuringTrainingError:
    if failure.kind == "nan":
        return NanLossDuringTrainingError(NAN_LOSS)
    if failure.kind == "inf":
        return NonFiniteLossError(f"Infinite loss during training: {failure.describe()}.")
    if failure.kind == "spike":
        return LossSpikeError(f"NanTensorHook: {failure.describe()}.")
    return NonFiniteStateError(f"NanTensorHook: {failure.describe()}.")


def _checkpoint_provider(session: MonitoredSession) -> Provider:
    """The session's owner of ``"checkpoint"``, else the installed provider, checked."""
    checkpoints = monitored.provider("checkpoint", _ROLLBACK_NEEDS, session=session)
    checkpoints.require(*_ROLLBACK_HOOKS)
    return checkpoints


def _find_checkpoint_dir(session: MonitoredSession) -> str | None:
    config = session.training_config
    if config is not None and config.checkpoint_dir is not None:
        return config.checkpoint_dir
    for info in session.plugins:
        directory = getattr(info.plugin, "checkpoint_dir", None)
        if isinstance(directory, str) and info.plugin is not None:
            return directory
    return None


async def _restore_older(
    checkpoints: Provider, session: MonitoredSession, checkpoint_dir: str, failure: Failure
) -> str:
    """Restore the newest checkpoint before ``failure.step`` and its plugin states; its path.

    One that is gone or damaged by the time it is read (a saver's rotation, a
    bad disk) is passed over for the next older one, with a warning.
    """
    listed = await _run(checkpoints.call, "list_checkpoints", checkpoint_dir=checkpoint_dir)
    older = sorted(
        (entry for entry in _entries(checkpoints, listed) if entry[1] < failure.step),
        key=lambda entry: entry[1],
        reverse=True,
    )
    for path, _step, plugin_states in older:
        try:
            await _run(checkpoints.call, "restore_checkpoint", state=session.state, path=path)
        except (FileNotFoundError, DamagedCheckpointError) as exc:
            log.warning(
                "NanTensorHook: cannot roll back to %s (%s); trying an older one", path, exc
            )
            continue
        await session.load_plugin_states(plugin_states)  # every plugin back to that step
        return path
    if older:
        why = f"none of the checkpoints of {checkpoint_dir} older than step {failure.step} could "
        why += "be restored"
    else:
        why = f"{checkpoint_dir} holds no checkpoint older than step {failure.step} to roll back to"
    raise RollbackError(f"NanTensorHook: {failure.describe()}, and {why}") from _error(failure)


def _entries(checkpoints: Provider, listed: Any) -> list[tuple[str, int, Mapping[str, Any]]]:
    """``listed`` as ``(path, step, plugin states)`` entries; any other shape names the provider."""
    entries = []
    for entry in listed if isinstance(listed, list | tuple) else [listed]:
        if (
            isinstance(entry, tuple)
            and len(entry) == 3
            and isinstance(entry[0], str)
            and isinstance(entry[1], int)
            and isinstance(entry[2], Mapping)
        ):
            entries.append(entry)
            continue
        raise PluginError(
            f"hook 'list_checkpoints' of {checkpoints.info.describe()} returned {listed!r}; "
            "a sequence of (path, global step, plugin states) was expected",
            plugin=checkpoints.info.name,
            distribution=checkpoints.info.distribution,
            hook="list_checkpoints",
        )
    return entries


async def _run(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(...)`` in a worker thread, or here when CuPy is in use (its stream is per thread)."""
    if "cupy" in sys.modules:
        return fn(*args, **kwargs)
    return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))
