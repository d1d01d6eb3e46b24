"""The ``summaries`` entry point of the ``monitored`` plugin group.

Gives ``MonitoredTrainingSession`` its ``save_summaries_steps`` /
``save_summaries_secs``: on the chief with a ``summary_dir`` (default
``checkpoint_dir``), a :class:`SummarySaverHook` writing there. ``0`` or ``None``
switches summaries off (TF1's switch). ``chief_only`` makes the core skip this
plugin on workers, which write nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from ._hook import SummarySaverHook

if TYPE_CHECKING:
    from monitored import TrainingConfig

__all__ = ["chief_only", "training_hooks"]

#: Summaries are written by the chief only.
chief_only: Final = True


def training_hooks(config: TrainingConfig) -> list[object] | None:
    """The summary hook for ``config``; steps win when both intervals are set."""
    if not config.is_chief or config.summary_dir is None:
        return None
    steps, secs = config.save_summaries_steps, config.save_summaries_secs
    if steps is not None and steps > 0:
        return [SummarySaverHook(save_steps=steps, output_dir=config.summary_dir)]
    if secs is not None and secs > 0:
        return [SummarySaverHook(save_secs=secs, output_dir=config.summary_dir)]
    return None
