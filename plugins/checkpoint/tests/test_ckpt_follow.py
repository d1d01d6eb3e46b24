"""A reader following a directory while a real trainer process rotates it every step.

The trainer saves every step and keeps one checkpoint (``max_to_keep=1``), so
each checkpoint is deleted, manifest first, as the next one lands; the
reader, another process, follows with ``checkpoints_iterator`` and restores
each checkpoint into a state that has its array already (the in-place
restore opens the data file twice, the widest window there is). Every
restore must give one whole checkpoint or raise ``CheckpointNotFoundError``
(deleted meanwhile): never ``CorruptCheckpointError``, never a mix.
``MONITORED_RACE_SECS`` (2 by default) sets how long they race.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

TRAINER = textwrap.dedent(
    """
    import os, sys, time
    import numpy as np
    from monitored import TrainState
    from monitored_checkpoint import Saver

    directory, seconds, ready = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    while not os.path.exists(ready):
        time.sleep(0.01)
    saver, state = Saver(max_to_keep=1), TrainState({"w": np.zeros(1 << 20)})
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        state.global_step += 1
        state["w"].fill(state.global_step)
        saver.save(state, os.path.join(directory, "model.ckpt"))
    print(state.global_step)
    """
)

READER = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import numpy as np
    from monitored import TrainState
    from monitored_checkpoint import CheckpointNotFoundError, checkpoints_iterator, restore

    directory, ready = sys.argv[1], sys.argv[2]
    Path(ready).touch()
    counts = {"restored": 0, "deleted meanwhile": 0, "last": 0}
    checkpoints = checkpoints_iterator(directory, timeout=2.0, poll_secs=0.002)
    state = TrainState({"w": np.zeros(1 << 20)})
    for path in checkpoints:
        try:
            manifest = restore(state, path)
        except CheckpointNotFoundError as exc:
            counts["deleted meanwhile"] += 1
            checkpoints.reject(path, str(exc))
            continue
        w = state["w"]
        if not (w.min() == w.max() == manifest.step == state.global_step):
            sys.exit(f"{path}: a mixed state (w from {w.min()} to {w.max()})")
        counts["restored"] += 1
        counts["last"] = manifest.step
    print(json.dumps(counts))
    """
)


def test_a_reader_beside_a_trainer_rotating_every_step_restores_whole_checkpoints(
    tmp_path: Path,
) -> None:
    seconds = os.environ.get("MONITORED_RACE_SECS", "2")
    ready = tmp_path / "ready"
    env = {**os.environ, "PYTHONWARNINGS": "error"}
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, str(tmp_path), str(ready)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        trainer = subprocess.run(
            [sys.executable, "-c", TRAINER, str(tmp_path), seconds, str(ready)],
            capture_output=True,
            env=env,
            timeout=120 + float(seconds),
            check=False,
        )
        output, _ = reader.communicate(timeout=120)
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait()
    assert trainer.returncode == 0, trainer.stderr.decode()
    assert reader.returncode == 0, output.decode()
    counts = json.loads(output.decode().splitlines()[-1])
    last_step = int(trainer.stdout.decode())
    assert counts["restored"] >= 1
    assert counts["last"] == last_step, (counts, last_step)  # the newest, once training stopped
    print(f"{last_step} saved, {counts}")
