"""Text read from disk made safe to print on a terminal, one entry per line.

Array names, plugin names and states, and directory and file names come from
files anyone may have written: printed raw, an ESC, CSI or OSC sequence in one
would drive the reader's terminal (retitle it, clear it, set its clipboard) and
a newline would forge whole lines of output. :func:`printable` shows each such
character as a visible escape instead, so what is printed is what the name
holds and each entry stays on its line. Bytes that are not UTF-8 (a directory
name read through ``os.fsdecode``, ``\\udcXX`` surrogates) show as ``\\xXX``.

The commands' ``--json`` output needs none of this: ``json.dumps`` escapes
every control character and every non-ASCII one, and stays exact.
"""

from __future__ import annotations

import logging
import unicodedata
from typing import Final

__all__ = ["EscapeRecords", "printable"]

#: Unicode categories escaped: controls (C0, DEL, C1), format characters (bidi
#: overrides, zero-width ones that hide text), lone surrogates, line and paragraph
#: separators.
_ESCAPED: Final = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def _escape(char: str) -> str:
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def printable(text: object, *, lines: bool = False) -> str:
    """``str(text)`` with every control, format, separator and surrogate character escaped.

    Ordinary text (letters of any script, punctuation, spaces) is left as it is;
    the result holds no character a terminal acts on, and no line break unless
    ``lines`` keeps the ``\\n`` of a message of several lines.
    """
    text = str(text)
    if text.isprintable():  # the common case: nothing to escape (space included)
        return text
    return "".join(
        _escape(char)
        if unicodedata.category(char) in _ESCAPED and not (lines and char == "\n")
        else char
        for char in text
    )


class EscapeRecords(logging.Filter):
    """Makes a log record's message printable (it names files and arrays from disk).

    Installed on the plugin's logger, ``monitored.checkpoint``, so whatever
    handler a program configures prints no terminal sequence a name holds.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        escaped = printable(message)
        if escaped != message:
            record.msg, record.args = escaped, None
        return True
