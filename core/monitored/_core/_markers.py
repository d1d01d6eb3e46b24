"""The pluggy markers of the ``monitored`` project.

``hookimpl`` is optional on hook implementations (any callable named after a
hookspec is one); use it to pass ``tryfirst``/``trylast`` or ``specname``.
"""

from __future__ import annotations

from typing import Final

import pluggy

__all__ = ["PROJECT_NAME", "hookimpl", "hookspec"]

PROJECT_NAME: Final = "monitored"

hookspec: Final = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl: Final = pluggy.HookimplMarker(PROJECT_NAME)
