"""Dead and interrupted trials come back: Optuna's heartbeats and retries, for ``optimize``.

Optuna notices a trial whose process died through its storage's heartbeats:
an ``RDBStorage`` made with ``heartbeat_interval`` (and ``grace_period``)
expects each running trial to record a heartbeat every interval; a trial
with none for the grace period is *stale*. Before each new trial, Optuna's
``study.optimize`` fails the stale trials of the study and hands each to the
storage's stale-trial callback; with Optuna's ``RetryFailedTrialCallback``
(``RetryHeartbeatStaleTrialCallback`` since Optuna 4.9) that callback queues a
copy of the trial, ``WAITING``, with its parameters and the original trial's
number in its system attributes (``retried_trial_number``), for the next
``study.ask()`` to take.

Optuna does that in ``study.optimize`` only, not for ``ask``/``tell``.
:func:`~monitored_optuna.optimize` is an ask/tell loop, so it does the same
here: :func:`fail_stale_trials` before each ``ask``, and a
:class:`Heartbeat` thread per running trial. A thread, not a task of the
event loop: a step that holds the loop for a while does not make its trial
look dead to the other processes.

A trial interrupted by Ctrl-C is told ``FAIL`` and goes through the same
callback (:func:`retry`), so the next ``optimize`` on the study takes it up
again. Its objective finds its checkpoints under the original trial's number
(:func:`original_trial_number`).
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import optuna

__all__ = [
    "Heartbeat",
    "fail_stale_trials",
    "heartbeat_interval",
    "original_trial_number",
    "retry",
    "retry_chain",
    "system_attrs",
]

log = logging.getLogger("monitored.optuna")

#: ``warnings.catch_warnings`` changes the process's filters: one thread at a time.
_warnings_lock = threading.Lock()
#: One ``ask`` at a time in this process: two threads asking at once may both take the
#: same ``WAITING`` trial (a retry) from a SQLite study, which has no row locks.
_ask_lock = threading.Lock()

#: The system attributes Optuna's retry callback writes (read by its
#: ``retried_trial_number`` and ``retry_history``, which are experimental and warn).
FAILED_TRIAL_ATTR = "failed_trial"
RETRY_HISTORY_ATTR = "retry_history"


def heartbeat_interval(storage: object) -> int | None:
    """The storage's heartbeat interval in seconds; ``None`` where it records no heartbeats."""
    get = getattr(storage, "get_heartbeat_interval", None)
    if not callable(get):
        return None
    interval = get()
    return interval if isinstance(interval, int) and interval > 0 else None


def _stale_trial_callback(storage: object) -> Callable[..., None] | None:
    """The storage's callback for a stale trial (Optuna's names before and after 4.9)."""
    for name in ("get_heartbeat_stale_trial_callback", "get_failed_trial_callback"):
        get = getattr(storage, name, None)
        if callable(get):
            with _warnings_lock, warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # the old name, deprecated
                callback = get()
            return callback if callable(callback) else None
    return None


def fail_stale_trials(study: optuna.Study) -> None:
    """Fail ``study``'s trials whose heartbeat stopped, and hand them to the storage's callback.

    Optuna's own ``fail_stale_trials`` (what its ``study.optimize`` calls
    before each trial), without its "experimental" warning. Called in a worker
    thread; a storage without heartbeats costs nothing.
    """
    import optuna

    if heartbeat_interval(study._storage) is None:
        return
    with _warnings_lock, warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


def ask(study: optuna.Study) -> optuna.trial.Trial:
    """``study.ask()``, as inside Optuna's own optimize loop.

    With heartbeats on, Optuna warns that an ``ask`` outside ``study.optimize``
    gets none; :func:`~monitored_optuna.optimize` records them itself, so the
    warning would be false. The flag Optuna checks is per thread. Asks of this
    process take turns (:data:`_ask_lock`).
    """
    local = getattr(study, "_thread_local", None)
    before = getattr(local, "in_optimize_loop", None)
    if local is not None and before is not None:
        local.in_optimize_loop = True
    try:
        with _ask_lock:
            return study.ask()
    finally:
        if local is not None and before is not None:
            local.in_optimize_loop = before


class Heartbeat:
    """Records ``trial_id``'s heartbeat in ``storage`` every ``interval`` seconds, from a thread.

    A daemon thread: it never keeps the process alive, and a process that dies
    stops it, which is what makes the trial stale for the others. A failed
    record is warned about once, and tried again next interval.
    """

    def __init__(self, storage: Any, trial_id: int, number: int, interval: int) -> None:
        self._storage = storage
        self._trial_id = trial_id
        self._number = number
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._beat, name=f"monitored-optuna-heartbeat-{number}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and wait for it (at most one ``record_heartbeat`` call)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _beat(self) -> None:
        warned = False
        while True:
            try:
                self._storage.record_heartbeat(self._trial_id)
            except Exception as exc:  # a busy database: the next beat may get through
                if not warned:
                    warned = True
                    log.warning(
                        "optimize: could not record the heartbeat of trial %d (%s: %s); "
                        "trying again every %ds: other processes will take it for dead if "
                        "none gets through within the storage's grace period",
                        self._number,
                        type(exc).__name__,
                        exc,
                        self._interval,
                    )
            if self._stop.wait(self._interval):
                return


def system_attrs(trial: optuna.trial.BaseTrial) -> dict[str, Any]:
    import optuna

    if isinstance(trial, optuna.trial.FrozenTrial):
        return dict(trial.system_attrs)
    if isinstance(trial, optuna.trial.Trial):
        # A Trial shows no system attributes; its storage holds them.
        return dict(trial.storage.get_trial(trial._trial_id).system_attrs)
    return {}


def original_trial_number(trial: optuna.trial.BaseTrial) -> int:
    """The number of the trial whose work ``trial`` goes on with: name its checkpoints by it.

    For a retry of a trial that died or was interrupted (queued by Optuna's
    ``RetryFailedTrialCallback``, or by :func:`~monitored_optuna.optimize`
    after Ctrl-C), the first trial's number, as Optuna's
    ``RetryFailedTrialCallback.retried_trial_number`` gives it; for any other
    trial, its own. An objective that keeps its checkpoints in
    ``runs/<study>/trial-<original_trial_number(trial)>`` resumes a retried
    trial from where it stopped, with its parameters.
    """
    original = system_attrs(trial).get(FAILED_TRIAL_ATTR)
    if isinstance(original, int) and not isinstance(original, bool):
        return original
    number = getattr(trial, "number", None)
    if not isinstance(number, int):
        raise TypeError(f"original_trial_number: {trial!r} has no trial number")
    return number


def retry_chain(trial: optuna.trial.BaseTrial) -> set[int]:
    """``trial``'s number and those of the trials it retries (its checkpoints may be theirs)."""
    attrs = system_attrs(trial)
    chain = {getattr(trial, "number", -1)}
    original = attrs.get(FAILED_TRIAL_ATTR)
    if isinstance(original, int):
        chain.add(original)
    history = attrs.get(RETRY_HISTORY_ATTR)
    if isinstance(history, list):
        chain.update(n for n in history if isinstance(n, int))
    return chain


def retry(study: optuna.Study, trial_id: int) -> None:
    """Queue a retry of the trial ``trial_id`` (told ``FAIL``): the storage's callback, or ours.

    The storage's stale-trial callback when it has one (Optuna's
    ``RetryFailedTrialCallback`` and its ``max_retry``, or your own); otherwise
    a ``WAITING`` copy of the trial with its parameters and user attributes,
    and the system attributes Optuna's callback writes, so that
    ``retried_trial_number`` and :func:`original_trial_number` name the first
    trial. Called in a worker thread.
    """
    import optuna

    storage = study._storage
    frozen = storage.get_trial(trial_id)
    callback = _stale_trial_callback(storage)
    if callback is not None:
        callback(study, frozen)
        return
    attrs = dict(frozen.system_attrs)
    history = attrs.get(RETRY_HISTORY_ATTR)
    history = [*history, frozen.number] if isinstance(history, list) else [frozen.number]
    attrs[RETRY_HISTORY_ATTR] = history
    attrs.setdefault(FAILED_TRIAL_ATTR, frozen.number)
    study.add_trial(
        optuna.trial.create_trial(
            state=optuna.trial.TrialState.WAITING,
            params=frozen.params,
            distributions=frozen.distributions,
            user_attrs=frozen.user_attrs,
            system_attrs=attrs,
        )
    )
