"""``monitored.printable`` and ``monitored.PrintableFilter`` (``_core/_printable``).

The sites that use them (the session manager, evaluation, ownership, the opener,
the launcher check, the plugins) are tested with real files in their own modules'
tests; here, what the function escapes and what it leaves alone.
"""

from __future__ import annotations

import logging
import os
import unicodedata
from pathlib import Path

import pytest
from _hostile import CONTROLS, FORGED, HOSTILE, HOSTILE_NAME, assert_safe_line

import monitored
from monitored import PrintableFilter, printable

DOCS = Path(__file__).parent.parent.parent / "docs"


def test_every_control_character_shows_as_a_visible_escape() -> None:
    for char in CONTROLS:
        assert printable(char) == f"\\x{ord(char):02x}"
    assert printable(f"a{CONTROLS}b").count("\\x") == len(CONTROLS)


def test_sequences_newlines_and_separators_are_escaped_so_the_text_is_one_line() -> None:
    shown = printable(HOSTILE)
    assert_safe_line(shown)
    assert "\\x0aList one" in shown  # the forged line is on the name's line, escaped
    assert not shown.startswith(FORGED)
    assert printable("\u202e\u2028\u2029\u200b\ufeff\U000e0001") == (
        "\\u202e\\u2028\\u2029\\u200b\\ufeff\\U000e0001"
    )


def test_bytes_that_are_not_utf8_show_as_bytes() -> None:
    assert printable(os.fsdecode(b"run-\xff\xfe")) == "run-\\xff\\xfe"
    assert_safe_line(printable(HOSTILE_NAME))
    assert printable(HOSTILE_NAME).endswith("\\xff\\xfe")
    # Any output encoding takes the result: it is ASCII wherever the name was not text.
    printable(HOSTILE_NAME).encode("utf-8")


def test_ordinary_text_of_any_script_is_left_as_it_is() -> None:
    for text in ["model.ckpt-5", "é 日本 ok — «x»", "tab-free text with spaces", ""]:
        assert printable(text) == text
    letters = "".join(chr(c) for c in range(0x20, 0x3000) if chr(c).isprintable())
    assert printable(letters) == letters


def test_no_character_a_terminal_acts_on_is_left_anywhere_in_the_bmp() -> None:
    everything = "".join(chr(c) for c in range(0x10000))
    shown = printable(everything)
    acted_on = {"Cc", "Cf", "Cs", "Zl", "Zp"}  # controls, format, surrogates, separators
    assert not [char for char in shown if unicodedata.category(char) in acted_on]
    kept = {char for char in everything if unicodedata.category(char) not in acted_on}
    assert kept <= set(shown)  # every other character is printed as it is


def test_lines_keeps_only_the_messages_own_line_breaks() -> None:
    first, second = printable("a\nb"), printable("c\x1b[2J")
    message = f"two problems:\n  {first}\n  {second}"
    shown = printable(message, lines=True)
    assert shown.splitlines() == ["two problems:", "  a\\x0ab", "  c\\x1b[2J"]
    assert printable("a\r\nb", lines=True) == "a\\x0d\nb"


def test_it_takes_any_object_and_escaping_twice_changes_nothing() -> None:
    assert printable(5) == "5"
    assert printable(None) == "None"
    assert printable(OSError(f"cannot read {HOSTILE}")).startswith("cannot read w\\x00")
    once = printable(HOSTILE)
    assert printable(once) == once


def test_the_filter_escapes_a_records_message_and_its_arguments(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("monitored.test_printable")
    logger.addFilter(PrintableFilter())
    try:
        with caplog.at_level(logging.INFO, logger=logger.name):
            logger.warning("skipping %s: %s", HOSTILE, "damaged")
            logger.info("plain %s", "name")
            try:
                raise ValueError("boom")
            except ValueError:
                logger.exception("failed on %s", HOSTILE)
    finally:
        logger.filters.clear()
    hostile, plain, failed = caplog.records
    assert hostile.getMessage() == f"skipping {printable(HOSTILE)}: damaged"
    assert_safe_line(hostile.getMessage())
    assert (plain.msg, plain.args) == ("plain %s", ("name",))  # nothing to escape: as it was
    assert failed.exc_info is not None  # the traceback is the handler's, left as it is
    assert_safe_line(failed.getMessage())


def test_both_are_public_and_documented_for_plugin_authors() -> None:
    assert {"printable", "PrintableFilter"} <= set(monitored.__all__)
    assert monitored.printable.__module__ == "monitored"
    guide = (DOCS / "plugins.md").read_text()
    assert "monitored.printable" in guide
    assert "monitored.PrintableFilter" in guide
    reference = (DOCS / "plugin-api.md").read_text()
    assert "::: monitored.printable" in reference
    assert "::: monitored.PrintableFilter" in reference


@pytest.mark.parametrize(
    ("package", "logger"),
    [
        ("monitored_checkpoint", "monitored.checkpoint"),
        ("monitored_mlflow", "monitored.mlflow"),
        ("monitored_optuna", "monitored.optuna"),
        ("monitored_nan_guard", "monitored.nan_guard"),
        ("monitored_early_stopping", "monitored.early_stopping"),
        ("monitored_summaries", "monitored.summaries"),
        ("monitored._core._ownership", "monitored.ownership"),
    ],
)
def test_the_loggers_whose_lines_name_what_was_read_escape_them(
    package: str, logger: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Run ids and a store's answers (MLflow), storage errors (Optuna), checkpoints
    rolled back to or exported, event files, claims: each such logger filters its lines
    (their real sites are tested in each package's tests)."""
    pytest.importorskip(package)
    with caplog.at_level(logging.INFO, logger=logger):
        logging.getLogger(logger).warning("run %s: %s", HOSTILE, HOSTILE_NAME)
    (record,) = caplog.records
    assert_safe_line(record.getMessage())


def test_the_filter_never_raises_for_a_call_whose_arguments_do_not_fit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A bad log call is reported as logging does, not raised into the code that logged."""
    logger = logging.getLogger("monitored.test_printable_bad_call")
    logger.addFilter(monitored.PrintableFilter())
    logger.addHandler(handler := logging.StreamHandler())
    logger.propagate = False
    try:
        logger.warning("a %s %s", 1)  # one argument for two
    finally:
        logger.removeHandler(handler)
    assert "--- Logging error ---" in capsys.readouterr().err
