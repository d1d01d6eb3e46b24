"""The ``summaries`` entry point of the ``monitored`` plugin group.

Gives ``MonitoredTrainingSession`` its ``save_summaries_steps`` /
``save_summaries_secs``: on the chief with a ``summary_dir`` (default
``checkpoint_dir``), a :class:`SummarySaverHook` writing there. ``0`` or ``None``
switches summaries off (TF1's switch). ``chief_only`` makes the core skip this
plugin on workers, which write nothing.

Options (``plugin_options={"summaries": {...}}`` or ``MONITORED_PLUGIN_OPTIONS``):
``hparams``, the run's hyperparameters for TensorBoard's HParams dashboard (a
mapping; a JSON object in the environment), and ``metrics``, the scalar tags the
dashboard compares runs by. They go to the hook made here, so a run launched
with different settings is told apart without editing the script.

It provides the ``"summaries"`` capability: a :class:`SummarySaverHook` passed in
``hooks=[...]`` takes it over (no second hook then writes each value again), and
the core (the ``Supervisor``) gets writers and hooks through the capability
hooks below, never by importing this package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import monitored

from . import _record

if TYPE_CHECKING:
    from monitored import TrainingConfig

    from ._writer import FileWriter

__all__ = [
    "chief_only",
    "declare_options",
    "provides",
    "summary_hooks",
    "summary_session_log",
    "summary_writer",
    "training_hooks",
]

#: The capability this plugin owns unless an explicit ``SummarySaverHook`` takes it over.
provides: Final = frozenset({"summaries"})
#: Summaries are written by the chief only.
chief_only: Final = True


def declare_options() -> list[monitored.Option]:
    return [
        monitored.Option(
            "hparams", None, "hyperparameters for TensorBoard's HParams dashboard", type=dict
        ),
        monitored.Option("metrics", [], "scalar tags the HParams dashboard compares", type=list),
    ]


def training_hooks(config: TrainingConfig) -> list[object] | None:
    """The summary hook for ``config``; steps win when both intervals are set."""
    options = config.plugin_options.get("summaries", {})
    hparams = options.get("hparams")
    if hparams is not None:  # checked even where nothing is written, so a typo shows
        hparams = _record.check_hparams(hparams, "plugin option summaries.hparams")
    metrics = options.get("metrics") or ()
    if not config.is_chief or config.summary_dir is None:
        return None
    # Here, not at the top: a session that writes no summaries never imports tensorboardX.
    from ._hook import SummarySaverHook

    steps, secs = config.save_summaries_steps, config.save_summaries_secs
    # An evaluation's results are its summaries: its eval steps' outputs are not.
    outputs = not config.evaluation
    if steps is not None and steps > 0:
        hook = SummarySaverHook(
            save_steps=steps,
            output_dir=config.summary_dir,
            hparams=hparams,
            metrics=metrics,
            step_outputs=outputs,
        )
    elif secs is not None and secs > 0:
        hook = SummarySaverHook(
            save_secs=secs,
            output_dir=config.summary_dir,
            hparams=hparams,
            metrics=metrics,
            step_outputs=outputs,
        )
    else:
        return None
    hook.claims_directory = True  # the run's log directory: one writer (run_directories)
    # An evaluation's writer stays open for the next evaluation of the directory: the
    # evaluations of one process append to one event file.
    hook.keep_writer_open = config.evaluation
    return [hook]


def summary_writer(logdir: str | None, writer: object | None) -> FileWriter | None:
    """``writer`` when it is a :class:`FileWriter`; else ``logdir``'s shared writer."""
    from ._writer import FileWriterCache

    if writer is not None:
        return _file_writer(writer)
    return None if logdir is None else FileWriterCache.get(logdir)


def summary_session_log(writer: object, status: str, global_step: int | None) -> bool:
    """Write a ``SessionLog`` of ``status`` (``"start"``, ``"stop"``) to ``writer``."""
    from tensorboardX.proto.event_pb2 import SessionLog

    statuses = {"start": SessionLog.START, "stop": SessionLog.STOP}
    if status not in statuses:
        raise ValueError(f"session log status must be 'start' or 'stop', got {status!r}")
    _file_writer(writer).add_session_log(SessionLog(status=statuses[status]), global_step)
    return True


def summary_hooks(
    save_secs: float, summary_writer: object | None, output_dir: str | None
) -> list[object]:
    """A :class:`SummarySaverHook` writing every ``save_secs`` seconds."""
    from ._hook import SummarySaverHook

    writer = None if summary_writer is None else _file_writer(summary_writer)
    return [SummarySaverHook(save_secs=save_secs, summary_writer=writer, output_dir=output_dir)]


def _file_writer(writer: object) -> FileWriter:
    from ._writer import FileWriter

    if not isinstance(writer, FileWriter):
        raise TypeError(f"got {type(writer).__name__}; pass a monitored_summaries.FileWriter")
    return writer
