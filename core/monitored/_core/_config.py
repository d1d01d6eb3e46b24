"""``TrainingConfig``: what ``MonitoredTrainingSession`` was asked for.

Plugins read it in their ``training_hooks`` implementation to decide which hooks
to contribute. ``explicit`` lists the arguments the user passed (rather than left
at TF1's defaults), so a plugin can tell "checkpoint every 600 s because that is
the default" from "the user asked for it".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, final

__all__ = ["TrainingConfig"]


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingConfig:
    """The resolved arguments of one ``MonitoredTrainingSession``."""

    is_chief: bool = True
    checkpoint_dir: str | None = None
    summary_dir: str | None = None
    save_checkpoint_secs: float | None = 600
    save_checkpoint_steps: int | None = None
    save_summaries_steps: int | None = 100
    save_summaries_secs: float | None = None
    log_step_count_steps: int | None = 100
    max_wait_secs: float = 7200
    stop_grace_period_secs: float = 120
    explicit: frozenset[str] = field(default_factory=frozenset)
    #: Hooks for the chief only (``chief_only_hooks``, the step counter): the session
    #: leaves them out on other processes, once it knows its role.
    chief_only_hooks: tuple[object, ...] = ()
    #: Every plugin's resolved options (``declare_options``), by plugin name.
    plugin_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: Whether the session is an evaluation (``evaluate_once``, ...): a summary
    #: plugin keeps its directory's writer open for the next evaluation, so the
    #: evaluations of one process append to one event file.
    evaluation: bool = False

    @property
    def wants_checkpoints(self) -> bool:
        """Whether checkpoints are to be written (on this process)."""
        return (
            self.is_chief
            and self.checkpoint_dir is not None
            and (self.save_checkpoint_secs is not None or self.save_checkpoint_steps is not None)
        )

    @property
    def wants_summaries(self) -> bool:
        """Whether summaries are to be written (on this process)."""
        return (
            self.is_chief
            and self.summary_dir is not None
            and (self.save_summaries_steps is not None or self.save_summaries_secs is not None)
        )
