"""An evaluator process beside a live trainer (or a copier) never dies of their normal behaviour.

Real processes race on a real directory (see ``_evaluator_roles.py``): a
trainer saving every step and keeping only its newest checkpoint, a copier
bringing a directory over file by file in name order, an evaluator following
it. Each evaluation must be of one whole checkpoint (every entry of ``w`` is
its step), each checkpoint at most once, and the evaluator must go on until
it has evaluated the trainer's final checkpoint, then end normally.

Each case races for ``MONITORED_RACE_SECS`` seconds (2 by default), over
``MONITORED_RACE_TRIALS`` trials (1): set them to soak, e.g.
``MONITORED_RACE_SECS=60 MONITORED_RACE_TRIALS=5``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import monitored
from monitored._core._plugins import installed_plugin_names
from monitored_checkpoint import Saver

ROLES = str(Path(__file__).with_name("_evaluator_roles.py"))
SECONDS = float(os.environ.get("MONITORED_RACE_SECS", "2"))
TRIALS = int(os.environ.get("MONITORED_RACE_TRIALS", "1"))
#: How long an evaluator waits without a new checkpoint before it gives up (a failure).
QUIET = 60.0
#: The step of the trainer's last checkpoint (``_evaluator_roles.FINAL_STEP``).
FINAL_STEP = 1_000_000


def _start(role: str, log: Path, env: dict[str, str] | None = None, **arguments: Any) -> Any:
    with log.open("wb") as output:
        return subprocess.Popen(
            [sys.executable, ROLES, role, json.dumps(arguments)],
            stdout=output,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONWARNINGS": "error", **(env or {})},
        )


def _finish(process: Any, log: Path, timeout: float) -> str:
    try:
        process.wait(timeout=timeout)
    finally:
        if process.returncode is None:
            process.kill()
            process.wait()
    text = log.read_text()
    assert process.returncode == 0, text
    return text


def _check(results: list[list[Any]], evaluator_log: str) -> None:
    assert results, f"nothing evaluated:\n{evaluator_log}"
    steps = [step for step, *_ in results]
    assert steps == sorted(set(steps)), f"each checkpoint once, in order: {steps}"
    for step, w, spread, path in results:
        assert (w, spread) == (step, 0), f"{path} evaluated half copied or mixed"
        assert path.endswith(f"model.ckpt-{step}")
    assert steps[-1] == FINAL_STEP, f"the final checkpoint was not evaluated: {steps}"


def _race(
    tmp_path: Path, *, size: int, how: str, copy: str | None, template: bool = False
) -> tuple[int, int, str]:
    """One trial; returns (checkpoints saved, evaluations, the evaluator's log)."""
    written = tmp_path / "written"
    followed = tmp_path / "copy" if copy else written
    written.mkdir(parents=True)
    followed.mkdir(exist_ok=True)
    ready, done, out = tmp_path / "ready", tmp_path / "done", tmp_path / "results.json"
    logs = {role: tmp_path / f"{role}.log" for role in ("trainer", "copier", "evaluator")}
    evaluator = _start(
        "evaluator",
        logs["evaluator"],
        directory=str(followed),
        how=how,
        timeout=QUIET,
        template=size if template else 0,
        ready=str(ready),
        out=str(out),
    )
    trainer = _start(
        "trainer",
        logs["trainer"],
        directory=str(written),
        seconds=SECONDS,
        size=size,
        keep=2 if copy else 1,
        ready=str(ready),
    )
    copier = None
    if copy:
        copier = _start(
            "copier",
            logs["copier"],
            source=str(written),
            target=str(followed),
            mode=copy,
            done=str(done),
        )
    try:
        saved = json.loads(_finish(trainer, logs["trainer"], 120 + SECONDS))["saved"]
        done.touch()
        if copier is not None:
            _finish(copier, logs["copier"], 60)
        evaluator_log = _finish(evaluator, logs["evaluator"], 120 + SECONDS)
    finally:
        for process in (trainer, copier, evaluator):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
    results = json.loads(out.read_text())
    _check(results, evaluator_log)
    return saved, len(results), evaluator_log


@pytest.mark.parametrize(
    ("size", "how", "template"),
    [(16, "repeatedly", False), (1 << 20, "repeatedly", True), (16, "continuous", False)],
)
def test_an_evaluator_survives_a_trainer_rotating_every_step(
    tmp_path: Path, size: int, how: str, template: bool
) -> None:
    # max_to_keep=1 and a save every step: each checkpoint is deleted as the next lands,
    # often while the evaluator is reading it (1 << 20 float64: an 8 MB state, restored
    # in place after a verifying pass, which gives the rotation time to strike).
    for trial in range(TRIALS):
        saved, evaluated, log = _race(
            tmp_path / str(trial), size=size, how=how, copy=None, template=template
        )
        print(
            f"trial {trial}: {saved} saved, {evaluated} evaluated, {log.count('skipping')} skipped"
        )


@pytest.mark.parametrize(
    ("copy", "how", "size"), [("rsync", "repeatedly", 1 << 20), ("inplace", "continuous", 1 << 19)]
)
def test_an_evaluator_never_evaluates_a_half_copied_checkpoint(
    tmp_path: Path, copy: str, how: str, size: int
) -> None:
    # A copier brings the directory over file by file, in name order: the state file
    # first, then each manifest before its data file (whole files renamed into place
    # with rsync; written in place, piece by piece, with inplace).
    for trial in range(TRIALS):
        saved, evaluated, log = _race(tmp_path / str(trial), size=size, how=how, copy=copy)
        print(
            f"trial {trial}: {saved} saved, {evaluated} evaluated, {log.count('skipping')} skipped"
        )


def test_an_evaluator_that_may_only_read_the_model_directory_works(tmp_path: Path) -> None:
    model = tmp_path / "model"
    Saver().save(monitored.TrainState({"w": np.full(3, 7.0)}, global_step=7), f"{model}/model.ckpt")
    env = {  # the summaries plugin loaded, as an evaluator has it
        "MONITORED_DISABLE_PLUGIN_AUTOLOAD": "",
        "MONITORED_DISABLE_PLUGINS": ",".join(
            sorted(installed_plugin_names() - {"summaries", "checkpoint"})
        ),
    }
    out, log = tmp_path / "out.json", tmp_path / "evaluator.log"
    command = [
        sys.executable,
        ROLES,
        "read_only",
        json.dumps({"directory": str(model), "out": str(out)}),
    ]
    if os.geteuid() == 0:  # root writes anywhere: a read-only mount, private to the evaluator
        if shutil.which("unshare") is None:
            pytest.skip("needs unshare(1) to mount the directory read-only as root")
        mount = 'mount --bind -o ro "$1" "$1" && shift && exec "$@"'
        command = [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            mount,
            "sh",
            str(model),
            *command,
        ]
    else:
        model.chmod(0o555)
    try:
        with log.open("wb") as output:
            result = subprocess.run(
                command,
                stdout=output,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONWARNINGS": "error", **env},
                timeout=120,
                check=False,
            )
    finally:
        model.chmod(0o755)
    text = log.read_text()
    if result.returncode != 0 and "mount:" in text:
        pytest.skip(f"cannot mount read-only here: {text}")
    assert result.returncode == 0, text
    assert json.loads(out.read_text()) == [7, 7, 7, 7]
    assert text.count("WARNING") == 1, text
    assert f"Evaluation summaries are off: {model}/eval cannot be written" in text
    assert "give summary_dir= to write them elsewhere" in text
    assert not (model / "eval").exists()
