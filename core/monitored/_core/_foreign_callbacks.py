"""Methods named after other frameworks' callbacks, on a hook object: said, not ignored.

A hook object is any object whose methods are named after hooks, so a method
named ``on_step_end`` (Hugging Face's ``TrainerCallback``), ``on_train_batch_end``
(Keras, Lightning) or ``after_batch`` (fastai) on an object that also has a real
hook would never be called, silently: a user porting a callback keeps half of it.
Such a method is named in a warning with the hook that does its job here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Final

__all__ = ["FOREIGN_CALLBACKS", "foreign_callbacks", "warn_foreign_callbacks"]

log = logging.getLogger("monitored")

_STEP_START: Final = "before_run"
_STEP_END: Final = "after_run"
#: Callback names of other frameworks, and the hook closest to each.
FOREIGN_CALLBACKS: Final[dict[str, str]] = {
    # Keras callbacks
    "on_train_begin": "begin",
    "on_train_end": "end",
    "on_batch_begin": _STEP_START,
    "on_batch_end": _STEP_END,
    "on_train_batch_begin": _STEP_START,
    "on_train_batch_end": _STEP_END,
    "on_epoch_begin": _STEP_START,
    "on_epoch_end": _STEP_END,
    "on_test_end": "after_evaluate",
    # PyTorch Lightning callbacks
    "on_fit_start": "begin",
    "on_fit_end": "end",
    "on_train_start": "after_create_session",
    "on_train_batch_start": _STEP_START,
    "on_train_epoch_start": _STEP_START,
    "on_train_epoch_end": _STEP_END,
    "on_validation_end": "after_evaluate",
    "on_validation_epoch_end": "after_evaluate",
    "on_save_checkpoint": "plugin_state",
    "on_load_checkpoint": "load_plugin_state",
    "on_exception": "before_close",
    "teardown": "end",
    # Hugging Face TrainerCallback
    "on_init_end": "begin",
    "on_step_begin": _STEP_START,
    "on_step_end": _STEP_END,
    "on_substep_end": _STEP_END,
    "on_evaluate": "after_evaluate",
    "on_save": "after_save",
    "on_log": _STEP_END,
    # fastai callbacks
    "before_fit": "begin",
    "after_fit": "end",
    "before_batch": _STEP_START,
    "after_batch": _STEP_END,
    "after_step": _STEP_END,
    "before_epoch": _STEP_START,
    "after_epoch": _STEP_END,
    "after_validate": "after_evaluate",
}


def foreign_callbacks(names: Iterable[str]) -> dict[str, str]:
    """Those of ``names`` that are other frameworks' callbacks, each with its closest hook."""
    return {name: FOREIGN_CALLBACKS[name] for name in sorted(names) if name in FOREIGN_CALLBACKS}


def warn_foreign_callbacks(described: str, names: Iterable[str]) -> None:
    """Warn that ``described``'s methods named like other frameworks' callbacks are no hooks."""
    found = foreign_callbacks(names)
    if found:
        methods = ", ".join(
            f"{name!r} (the closest hook: {hook!r})" for name, hook in found.items()
        )
        log.warning(
            "%s has methods named like another framework's callbacks, which monitored never "
            "calls: %s; rename each to its hook (see the hook reference) or give it a leading "
            "underscore",
            described,
            methods,
        )
