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
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import monitored

from . import _record
from ._hook import SummarySaverHook

if TYPE_CHECKING:
    from monitored import TrainingConfig

__all__ = ["chief_only", "declare_options", "training_hooks"]

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
    steps, secs = config.save_summaries_steps, config.save_summaries_secs
    if steps is not None and steps > 0:
        return [
            SummarySaverHook(
                save_steps=steps, output_dir=config.summary_dir, hparams=hparams, metrics=metrics
            )
        ]
    if secs is not None and secs > 0:
        return [
            SummarySaverHook(
                save_secs=secs, output_dir=config.summary_dir, hparams=hparams, metrics=metrics
            )
        ]
    return None
