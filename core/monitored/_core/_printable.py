"""``printable``: text read from disk or from another process, made safe to print.

File and directory names found by listing a directory, array and plugin names
and states restored from a checkpoint, the host written in another process's
ownership claim, tags read back from an event file, an environment variable:
any of them may hold what someone else chose. Printed raw in a log line, a
warning or an error, an ESC, CSI or OSC sequence in one drives the reader's
terminal (retitles it, clears it, sets its clipboard with OSC 52) and a newline
forges whole lines of output. :func:`printable` shows each such character as a
visible escape instead (``\\x1b``, ``\\x0a``, ``\\u202e``), so what is printed
is what the name holds and a message stays on its line. Bytes that were not
UTF-8 (a name read through ``os.fsdecode``: ``\\udcXX`` surrogates) show as
``\\xXX``.

Where a message already shows a value with ``repr`` (``{path!r}``), nothing more
is needed: ``repr`` escapes the same characters. JSON output needs none of this
either: ``json.dumps`` escapes every control character itself.
"""

from __future__ import annotations

import logging
import unicodedata
from typing import Final, final

__all__ = ["PrintableFilter", "printable"]

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

    For a name or value read from disk or from another process, before it goes
    into a log line, a warning, an error or a command's output. Ordinary text
    (letters of any script, punctuation, spaces) is left as it is; the result
    holds no character a terminal acts on, and no line break: a newline shows
    as ``\\x0a``, unless ``lines`` keeps the ``\\n`` of a message of several
    lines (escape each name in it without ``lines`` first). A name holding
    ESC ``]0;pwned`` BEL, a newline and ``forged`` prints as
    ``\\x1b]0;pwned\\x07\\x0aforged``.
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


@final
class PrintableFilter(logging.Filter):
    """A :class:`logging.Filter` that makes each record's message :func:`printable`.

    For a logger whose every line may name something read from disk (a plugin's
    own logger): added to it, whatever handler the program configures prints no
    terminal sequence and no forged line a name holds. The message becomes one
    line (its newlines escaped); the traceback of ``log.exception`` is left as it
    is. ``monitored-checkpoint`` adds one to ``monitored.checkpoint``::

        logging.getLogger("monitored.my_plugin").addFilter(monitored.PrintableFilter())
    """

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:
            # A call whose arguments do not fit its format: left for the handler,
            # which reports it as logging does ("--- Logging error ---"), never
            # raised into the code that logged.
            return True
        escaped = printable(message)
        if escaped != message:
            record.msg, record.args = escaped, None
        return True
