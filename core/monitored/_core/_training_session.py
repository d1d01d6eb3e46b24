"""``MonitoredTrainingSession``: a ``MonitoredSession`` with TF1's defaults.

On the chief it adds a :class:`~monitored.StepCounterHook` and asks installed
plugins (``training_hooks``) for the hooks behind ``checkpoint_dir``,
``save_checkpoint_secs``/``steps`` and ``save_summaries_steps``/``secs``. A
feature asked for whose plugin is not installed is a
:class:`~monitored.MissingPluginError` naming the package to install.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from ._basic_hooks import StepCounterHook
from ._config import TrainingConfig
from ._scaffold import Scaffold
from ._session import MonitoredSession
from ._state import TrainState
from ._tf1_arguments import refuse_tf1_arguments
from ._watchdog import FROM_ENV

__all__ = ["USE_DEFAULT", "MonitoredTrainingSession"]


class _UseDefault:
    __slots__ = ()

    def __repr__(self) -> str:
        return "USE_DEFAULT"


#: Marks an argument left at TF1's default (so an explicit ``None`` can switch it off).
USE_DEFAULT: Final[Any] = _UseDefault()


def MonitoredTrainingSession(
    state: TrainState | None = None,
    *,
    master: str = "",
    is_chief: bool = True,
    checkpoint_dir: str | None = None,
    scaffold: Scaffold | None = None,
    hooks: Iterable[object] | None = None,
    chief_only_hooks: Iterable[object] | None = None,
    save_checkpoint_secs: float | None = USE_DEFAULT,
    save_summaries_steps: int | None = USE_DEFAULT,
    save_summaries_secs: float | None = USE_DEFAULT,
    stop_grace_period_secs: float = 120,
    log_step_count_steps: int | None = 100,
    max_wait_secs: float = 7200,
    save_checkpoint_steps: int | None = USE_DEFAULT,
    summary_dir: str | None = None,
    disable_plugins: Iterable[str] = (),
    max_recoveries: int | None = None,
    plugin_options: Mapping[str, Mapping[str, Any]] | None = None,
    recovery_wait_secs: float = 30,
    config: None = None,
    save_graph_def: None = None,
    blocked_loop_warning_secs: float | None = FROM_ENV,
) -> MonitoredSession:
    """A :class:`MonitoredSession` set up for training, with TF1's defaults.

    Checkpoints every 600 s into ``checkpoint_dir`` (needs the ``monitored-checkpoint``
    plugin), summaries every 100 steps into ``summary_dir`` (default
    ``checkpoint_dir``; written by a summaries plugin when one is installed), and
    ``global_step/sec`` logged every ``log_step_count_steps`` steps. Giving only
    ``save_checkpoint_steps`` (or ``save_summaries_secs``) switches off the other
    default, as in TF1; ``0`` or ``None`` switches a feature off (TF1's
    ``save_summaries_steps=0``). ``recovery_wait_secs`` is how often a worker
    checks whether the chief has made the state ready. TF1's ``config=``,
    ``master=`` and ``save_graph_def=`` have no meaning here and are refused with
    what to do instead. ``blocked_loop_warning_secs`` is :class:`MonitoredSession`'s
    (a hook or step holding the event loop longer is named in one warning).
    """
    refuse_tf1_arguments(
        "MonitoredTrainingSession",
        master=master or None,
        config=config,
        save_graph_def=save_graph_def,
    )
    for name, value in {
        "save_checkpoint_secs": save_checkpoint_secs,
        "save_checkpoint_steps": save_checkpoint_steps,
        "save_summaries_steps": save_summaries_steps,
        "save_summaries_secs": save_summaries_secs,
        "log_step_count_steps": log_step_count_steps,
    }.items():
        _check_interval(name, value)
    explicit = {
        name
        for name, value in {
            "save_checkpoint_secs": save_checkpoint_secs,
            "save_checkpoint_steps": save_checkpoint_steps,
            "save_summaries_steps": save_summaries_steps,
            "save_summaries_secs": save_summaries_secs,
        }.items()
        if value is not USE_DEFAULT
    }
    checkpoint_secs, checkpoint_steps = _resolve(save_checkpoint_secs, save_checkpoint_steps, 600)
    summaries_steps, summaries_secs = _resolve(save_summaries_steps, save_summaries_secs, 100)
    log_step_count_steps = log_step_count_steps or None
    # The chief-only hooks are given to the session, which leaves them out where it is
    # not the chief: an installed cluster plugin (MPI) may decide that, not `is_chief`.
    chief_only = list(chief_only_hooks or ())
    all_hooks: list[object] = [*chief_only, *(hooks or ())]
    if log_step_count_steps is not None:
        counter = StepCounterHook(every_n_steps=log_step_count_steps)
        all_hooks.append(counter)
        chief_only.append(counter)
    training_config = TrainingConfig(
        is_chief=is_chief,
        checkpoint_dir=checkpoint_dir,
        summary_dir=summary_dir if summary_dir is not None else checkpoint_dir,
        save_checkpoint_secs=checkpoint_secs,
        save_checkpoint_steps=checkpoint_steps,
        save_summaries_steps=summaries_steps,
        save_summaries_secs=summaries_secs,
        log_step_count_steps=log_step_count_steps,
        max_wait_secs=max_wait_secs,
        stop_grace_period_secs=stop_grace_period_secs,
        explicit=frozenset(explicit),
        chief_only_hooks=tuple(chief_only),
    )
    return MonitoredSession(
        state,
        hooks=all_hooks,
        scaffold=scaffold,
        is_chief=is_chief,
        stop_grace_period_secs=stop_grace_period_secs,
        max_wait_secs=max_wait_secs,
        disable_plugins=disable_plugins,
        max_recoveries=max_recoveries,
        training_config=training_config,
        plugin_options=plugin_options,
        recovery_wait_secs=recovery_wait_secs,
        blocked_loop_warning_secs=blocked_loop_warning_secs,
    )


def _resolve(primary: Any, secondary: Any, default: float) -> tuple[Any, Any]:
    """TF1's rule: both defaulted → ``primary=default``; one given → the other off.

    ``0`` means off, as ``None`` does (TF1's ``save_summaries_steps=0``).
    """
    if primary is USE_DEFAULT and secondary is USE_DEFAULT:
        return default, None
    return (
        None if primary is USE_DEFAULT or not primary else primary,
        None if secondary is USE_DEFAULT or not secondary else secondary,
    )


def _check_interval(name: str, value: Any) -> None:
    """An interval is ``None``/``0`` (off) or a positive number."""
    if value is USE_DEFAULT or value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(
            f"MonitoredTrainingSession({name}={value!r}): give a positive number, or 0 or "
            "None to switch it off"
        )
