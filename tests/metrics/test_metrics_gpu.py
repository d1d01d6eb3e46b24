"""Metrics on CuPy arrays: sums stay on the device; NumPy use never imports CuPy."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from monitored import metrics as m


def test_numpy_metrics_never_import_cupy() -> None:
    code = (
        "import sys; from monitored import metrics as m; a = m.AUC(); a.update([0, 1], [0.2, 0.8]);"
        " a.result(); print('cupy' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.gpu
def test_cupy_inputs_keep_cupy_sums_and_match_numpy() -> None:
    cupy = pytest.importorskip("cupy")
    rng = np.random.default_rng(0)
    labels, preds = rng.integers(0, 2, 500), rng.random(500).astype(np.float32)
    for make in (m.AUC, m.Accuracy, m.MeanSquaredError, lambda: m.MeanIoU(2)):
        on_host, on_device = make(), make()
        p = preds if not isinstance(on_host, m.Accuracy | m.MeanIoU) else (preds > 0.5).astype(int)
        on_host.update(labels, p)
        on_device.update(cupy.asarray(labels), cupy.asarray(p))
        assert all(type(a).__module__.startswith("cupy") for a in on_device.arrays.values())
        assert on_device.result() == pytest.approx(on_host.result(), rel=1e-6)
        merged = type(on_host).from_state(on_device.state()).merge(on_host)
        assert merged.updates == 2
