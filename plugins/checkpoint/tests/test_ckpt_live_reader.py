"""Readers beside a live writer tell "being written" from "damaged" (``_settle``).

A real trainer process saves at every step and keeps two checkpoints, so its
directory changes every few milliseconds (a data file renamed in, then its
manifest, the state file, a rotation's deletes); ``monitored checkpoint ls`` and
``verify`` run against it round after round and must never call it damaged.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from monitored._cli import main

#: Rounds against the live writer (each round: ls, verify, show and ls --json).
ROUNDS = int(os.environ.get("MONITORED_LIVE_READER_ROUNDS", "60"))

WRITER = textwrap.dedent(
    """
    import sys
    import anyio, numpy as np
    from monitored import MonitoredSession, Scaffold, TrainState
    from monitored_checkpoint import CheckpointSaverHook, Saver

    def init(state):
        state["w"] = np.zeros(1000)

    def step(state):
        state["w"] += 1.0
        state.global_step += 1

    async def main():
        state = TrainState(seed=1)
        hook = CheckpointSaverHook(
            sys.argv[1], save_steps=1, saver=Saver(max_to_keep=2), handle_signals=False
        )
        async with MonitoredSession(state, hooks=[hook], scaffold=Scaffold(init_fn=init)) as s:
            while True:
                await s.run(step)
                if state.global_step == 3:
                    print("saving", flush=True)

    anyio.run(main)
    """
)


@pytest.fixture
def live_writer(tmp_path: Path) -> Iterator[Path]:
    """A directory a real trainer process is saving into at every step."""
    directory = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(directory)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line == "saving\n", proc.stderr.read() if proc.stderr else ""
        yield directory
        assert proc.poll() is None, "the writer died during the test"
    finally:
        proc.kill()
        proc.wait(timeout=60)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["checkpoint", *argv])
    return status, out.getvalue(), err.getvalue()


def test_ls_show_and_verify_beside_a_live_writer_never_say_damaged(live_writer: Path) -> None:
    failures = []
    for _ in range(ROUNDS):
        for command in ("ls", "verify", "show"):
            status, out, err = _cli(command, str(live_writer))
            if status != 0:
                failures.append((command, status, out, err))
        status, out, _ = _cli("ls", "--json", str(live_writer))
        rows = json.loads(out)
        if status != 0 or not any(row["restored"] for row in rows):
            failures.append(("ls --json", status, out, ""))
    assert failures == []


def test_the_command_line_beside_a_live_writer(live_writer: Path) -> None:
    # The real console script, a separate process, a few times.
    for _ in range(3):
        for command in ("ls", "verify", "show"):
            done = subprocess.run(
                [sys.executable, "-m", "monitored", "checkpoint", command, str(live_writer)],
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode == 0, done.stdout + done.stderr


def _save(directory: Path, steps: int) -> None:
    import numpy as np

    from monitored import TrainState
    from monitored_checkpoint import Saver

    saver = Saver(max_to_keep=5)
    state = TrainState({"w": np.zeros(4)})
    for step in range(1, steps + 1):
        state.global_step = step
        saver.save(state, str(directory / "model.ckpt"))


def test_verify_notes_an_interrupted_save_and_exits_0(tmp_path: Path) -> None:
    _save(tmp_path, 2)
    # A save killed between its data file and its manifest: an orphan data file.
    orphan = tmp_path / "model.ckpt-3.safetensors"
    orphan.write_bytes((tmp_path / "model.ckpt-2.safetensors").read_bytes())
    status, out, _ = _cli("verify", str(tmp_path))
    assert status == 0, out
    assert f"note: {tmp_path / 'model.ckpt-3'}: its data file model.ckpt-3.safetensors" in out
    assert out.splitlines()[-1] == "2 checkpoints checked: all verified"
    status, out, err = _cli("ls", str(tmp_path))
    assert status == 0, out + err
    assert "incomplete (no manifest), ignored by a restore" in out


def test_verify_tells_corrupt_from_nothing_restorable(tmp_path: Path) -> None:
    _save(tmp_path, 2)
    data = bytearray((tmp_path / "model.ckpt-2.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (tmp_path / "model.ckpt-2.safetensors").write_bytes(bytes(data))
    status, out, _ = _cli("verify", str(tmp_path))
    assert status == 1, out
    assert "nothing restorable" not in out
    data = bytearray((tmp_path / "model.ckpt-1.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (tmp_path / "model.ckpt-1.safetensors").write_bytes(bytes(data))
    status, out, _ = _cli("verify", str(tmp_path))
    assert status == 3, out
    assert "nothing restorable: no checkpoint of this directory verifies" in out
    assert out.splitlines()[-1] == "2 checkpoints checked: 2 problems"
