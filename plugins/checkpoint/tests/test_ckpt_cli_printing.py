"""``monitored checkpoint`` prints what a crafted directory holds without obeying it.

Every C0 and C1 control character, DEL, ANSI sequences (CSI, OSC: a terminal
title, the clipboard), newlines and bytes that are not UTF-8 are put in every
field the commands print: array names (the safetensors header and the manifest),
plugin names and states, the run directory's name, an entry named like a
checkpoint file, and the state file. The real ``monitored`` command runs in a
subprocess, under a UTF-8 and an ASCII output encoding: nothing a terminal acts
on reaches its output, each entry stays on its line, no encoding error loses
the listing, and ``--json`` is valid and exact.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from monitored import TrainState, printable
from monitored_checkpoint import Saver

CONTROLS = "".join(chr(c) for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)])
SEQUENCES = "\x1b]0;pwned\x07\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J\x1b[31m\u202e\u2028"
FORGED = "List one: rm -rf ~"
#: A name holding all of it, and a forged line after a newline.
HOSTILE = f"w{CONTROLS}{SEQUENCES}\n{FORGED}"
#: The run directory's name on disk: the same, and bytes that are not UTF-8.
HOSTILE_DIR = os.fsencode(f"run{SEQUENCES}\n{FORGED}") + b"\xff\xfe"

GUARD_SECS = 120


@pytest.fixture
def crafted(tmp_path: Path) -> Path:
    """``tmp_path/<HOSTILE_DIR>`` with a checkpoint of step 5 holding hostile names."""
    plain = tmp_path / "plain"
    state = TrainState({HOSTILE: np.zeros(2), "ok": np.ones(1)})
    state.global_step = 5
    Saver().save(state, f"{plain}/model.ckpt", plugin_states={HOSTILE: {HOSTILE: [HOSTILE]}})
    state.global_step = 6
    state[HOSTILE] += 1
    Saver().save(state, f"{plain}/model.ckpt", plugin_states={HOSTILE: {HOSTILE: [1]}})
    # a manifest that does not read, named (with the directory's name) by ls and verify
    (plain / "model.ckpt-7.json").write_text("{")
    # the state file names a checkpoint that is not there, its name hostile
    state_file = plain / "checkpoint"
    text = state_file.read_text().replace('"model.ckpt-6"', json.dumps(f"model.ckpt-6{HOSTILE}"))
    state_file.write_text(text)
    directory = os.path.join(os.fsencode(tmp_path), HOSTILE_DIR)
    os.rename(os.fsencode(plain), directory)
    return Path(os.fsdecode(directory))


def monitored(*argv: str | Path, encoding: str) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONIOENCODING": encoding, "COLUMNS": "400"}
    return subprocess.run(
        [sys.executable, "-m", "monitored", "checkpoint", *map(str, argv)],
        capture_output=True,
        env=env,
        timeout=GUARD_SECS,
        check=False,
    )


def assert_safe(output: bytes, encoding: str) -> list[str]:
    """No byte a terminal acts on, no forged line; the lines of ``output``."""
    text = output.decode(encoding)  # decodes: nothing unencodable got through raw
    for char in text:
        assert char == "\n" or (char.isprintable() and char not in "\u2028\u2029"), (
            f"{char!r} reached the output: {text!r}"
        )
    lines = text.splitlines()
    assert not [line for line in lines if line.startswith(FORGED)], text
    return lines


@pytest.mark.parametrize("encoding", ["utf-8", "ascii"])
def test_every_command_escapes_every_field_under_any_encoding(crafted: Path, encoding: str) -> None:
    checkpoint = crafted / "model.ckpt-5"
    commands = [
        (["ls", crafted], 1),  # the junk entry is a problem
        (["ls", crafted.parent], 0),  # names the run directory as a holder
        (["show", crafted], 0),
        (["show", checkpoint], 0),
        (["show", "--stats", checkpoint], 0),
        # (no NUL in a command line) not there: the names there are suggested
        (["show", "--array", HOSTILE.replace("\0", ""), checkpoint], 2),
        (["diff", checkpoint, crafted / "model.ckpt-6"], 1),
        (["verify", crafted], 1),
    ]
    for argv, status in commands:
        result = monitored(*argv, encoding=encoding)
        out = assert_safe(result.stdout, encoding)
        err = assert_safe(result.stderr, encoding)
        assert "Traceback" not in "\n".join(err), err
        assert result.returncode == status, (argv, out, err)
        shown = "\n".join(out + err)
        # the names are there, escaped, not dropped
        assert "\\x1b]0;pwned\\x07" in shown, (argv, shown)
        assert "\\x0aList one" in shown or (argv[0] == "ls" and argv[1] == crafted.parent), shown


def test_show_prints_one_line_per_array_and_per_plugin(crafted: Path) -> None:
    lines = assert_safe(
        monitored("show", crafted / "model.ckpt-5", encoding="utf-8").stdout, "utf-8"
    )
    assert len(lines) == 1 + 1 + 2 + 1 + 1  # checkpoint, header, two arrays, total, plugin
    assert lines[2].startswith("ok ")  # sorted by name
    assert lines[3].startswith(f"{printable(HOSTILE)} ")
    assert lines[-1].startswith(f"plugin {printable(HOSTILE)}: ")


@pytest.mark.parametrize("encoding", ["utf-8", "ascii"])
def test_json_stays_exact_and_valid(crafted: Path, encoding: str) -> None:
    shown = json.loads(
        monitored("show", "--json", crafted / "model.ckpt-5", encoding=encoding).stdout
    )
    assert [a["name"] for a in shown["arrays"]] == sorted([HOSTILE, "ok"])
    assert shown["plugins"] == {HOSTILE: {HOSTILE: [HOSTILE]}}
    assert shown["path"] == os.path.join(os.fspath(crafted), "model.ckpt-5")
    listed = json.loads(monitored("ls", "--json", crafted, encoding=encoding).stdout)
    assert [row["step"] for row in listed] == [5, 6, 7]  # 7: the damaged manifest
    assert {os.path.dirname(row["path"]) for row in listed} == {os.fspath(crafted)}


def test_printable_escapes_controls_separators_and_undecodable_bytes_only() -> None:
    assert printable("model.ckpt-5 é 日本 ok") == "model.ckpt-5 é 日本 ok"
    assert printable("a\x1b[2Jb\nc\x9b") == "a\\x1b[2Jb\\x0ac\\x9b"
    assert printable(os.fsdecode(b"x\xff")) == "x\\xff"
    assert printable("\u202e\u2028\U000e0001") == "\\u202e\\u2028\\U000e0001"
    assert all(printable(char).startswith("\\x") for char in CONTROLS)


def test_the_librarys_errors_warnings_and_log_lines_escape_names_from_disk(
    crafted: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from monitored_checkpoint import CorruptCheckpointError, CorruptCheckpointWarning, load_variable

    with pytest.raises(Exception) as caught:
        load_variable(os.fspath(crafted / "model.ckpt-7"), "w")
    assert isinstance(caught.value, CorruptCheckpointError)
    assert "\x1b" not in str(caught.value)
    assert "\\x1b]0;pwned\\x07" in str(caught.value)
    assert "\\x0aList one" in str(caught.value)  # a name's newline starts no line
    assert str(CorruptCheckpointWarning(f"skipping {HOSTILE}")) == f"skipping {printable(HOSTILE)}"
    with caplog.at_level("WARNING", logger="monitored.checkpoint"):
        import logging

        logging.getLogger("monitored.checkpoint").warning("skipping %s: %s", HOSTILE, "bad")
    assert caplog.records[-1].getMessage() == f"skipping {printable(HOSTILE)}: bad"
