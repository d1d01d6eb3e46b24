"""Names a crafted directory, claim file or environment may hold, and the check that a
message built from them is safe to print (issue 34 §2).

Every C0 and C1 control character and DEL, ANSI sequences (CSI, OSC: a terminal's
title, OSC 52: its clipboard), bidi and line separators, a newline that forges a
line, and bytes that are not UTF-8 (``surrogateescape``, as ``os.listdir`` gives).
"""

from __future__ import annotations

import os

#: Every C0 control, DEL and every C1 control.
CONTROLS = "".join(chr(c) for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)])
#: A terminal title, the clipboard (OSC 52), clear screen, red, a bidi override, a line separator.
SEQUENCES = "\x1b]0;pwned\x07\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J\x1b[31m\u202e\u2028"
#: What a newline in a name would start a line of the output with.
FORGED = "List one: rm -rf ~"
#: All of it in one name (NUL included: a name from a file, an environment or a pipe).
HOSTILE = f"w{CONTROLS}{SEQUENCES}\n{FORGED}"
#: The same as a file name: no NUL or "/", and bytes that are not UTF-8 at its end.
HOSTILE_NAME = os.fsdecode(os.fsencode(HOSTILE.replace("\0", "")) + b"\xff\xfe")
#: How the terminal title's sequence reads once escaped (it must be there, not dropped).
ESCAPED_TITLE = "\\x1b]0;pwned\\x07"


def assert_safe_line(text: str, shown: str = ESCAPED_TITLE) -> None:
    """``text`` holds no character a terminal acts on, no line break, and shows the
    hostile name escaped (``shown``) rather than dropping it."""
    bad = sorted({char for char in text if not char.isprintable()})
    assert not bad, f"{bad!r} would reach the terminal raw in {text!r}"
    assert shown in text, text  # repr (``{name!r}``) escapes it the same way
