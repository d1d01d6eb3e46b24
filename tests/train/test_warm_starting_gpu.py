"""warm_start into CuPy entries: filled in place on their device.

Skipped unless CuPy is installed and a CUDA device is present (the ``device``
tool runs this module where a GPU is lent).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import monitored
from monitored.train import warm_start
from monitored_checkpoint import Saver

cupy = pytest.importorskip("cupy")
try:
    _devices = cupy.cuda.runtime.getDeviceCount()
except Exception:  # pragma: no cover - depends on the machine
    _devices = 0
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_devices == 0, reason="no CUDA device"),
]


def test_cupy_entries_are_filled_in_place(tmp_path: Path) -> None:
    source = monitored.TrainState({"w": np.arange(6, dtype=np.float32).reshape(2, 3)})
    Saver().save(source, tmp_path / "model.ckpt", global_step=1)
    state = monitored.TrainState({"w": cupy.zeros((2, 3), cupy.float32)})
    device_w = state["w"]
    warm_start(state, tmp_path)
    assert state["w"] is device_w
    np.testing.assert_array_equal(cupy.asnumpy(state["w"]), np.arange(6).reshape(2, 3))
