"""Summary names as TF1 made them tags.

Apart from the protos in ``_encode``: the step-side calls (``scalar``, ...) check a
name with :func:`clean_tag`, and importing them must not import tensorboardX.
"""

from __future__ import annotations

import functools
import logging
import re
from typing import Final

__all__ = ["clean_tag"]

log = logging.getLogger("monitored.summaries")

#: What TF1 allowed in a summary name (``summary_op_util``): word characters, ``-``,
#: ``/`` and ``.``; anything else becomes ``_``.
_INVALID_TAG_CHARACTERS: Final = re.compile(r"[^-/\w.]")


@functools.lru_cache(maxsize=4096)
def clean_tag(name: str) -> str:
    """``name`` as TF1 made it a tag: other characters become ``_``, leading ``/`` go.

    So ``"Train/Training Loss"`` is written as ``Train/Training_Loss``, the tag
    dashboards and scripts of TF1 runs look up. A name that changes is said once at
    INFO, as TF1 did (cached: a name written every step costs one lookup).
    """
    cleaned = _INVALID_TAG_CHARACTERS.sub("_", name).lstrip("/")
    if cleaned != name:
        log.info("Summary name %r is illegal; using %r instead", name, cleaned)
    return cleaned
