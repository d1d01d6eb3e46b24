"""Command-line parsers that answer a mistyped command with a "did you mean".

``monitored checkpont`` or ``monitored checkpoint lss`` get argparse's usage
and its list of choices, plus the choice closest to what was typed (Python
3.14's ``suggest_on_error``, for every Python this project supports). Every
parser of the ``monitored`` command, plugins' included, is one of these.
"""

from __future__ import annotations

import argparse
import difflib
import re
from typing import Final, NoReturn

__all__ = ["SuggestingParser"]

#: argparse's message for a choice it does not know (quoted choices up to Python 3.11,
#: bare ones after).
_INVALID_CHOICE: Final = re.compile(
    r"invalid choice: '?(?P<given>[^'(]*?)'? \(choose from (?P<choices>.*)\)"
)


class SuggestingParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose "invalid choice" error names the closest choice."""

    def error(self, message: str) -> NoReturn:
        match = _INVALID_CHOICE.search(message)
        if match is not None:
            choices = [c.strip().strip("'\"") for c in match["choices"].split(",")]
            close = difflib.get_close_matches(match["given"], choices, n=1, cutoff=0.6)
            if close:
                message = f"{message}; did you mean {close[0]!r}?"
        super().error(message)
