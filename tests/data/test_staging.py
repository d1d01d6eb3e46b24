"""GPU staging with CuPy (skipped without CuPy and a GPU)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from monitored import data

pytestmark = pytest.mark.gpu


def _cupy() -> Any:
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA device")
    except Exception as exc:  # CUDA runtime missing or broken
        pytest.skip(f"no usable CUDA device: {exc}")
    return cupy


async def test_batches_arrive_on_the_device_in_order() -> None:
    cupy = _cupy()
    source = [{"x": np.full((4, 3), i, np.float32), "y": np.arange(4) + i} for i in range(6)]
    pipeline = data.prefetch(source, buffer_size=3, device=True)
    async with pipeline:
        out = [b async for b in pipeline]
    assert all(isinstance(b["x"], cupy.ndarray) for b in out)
    assert [float(b["x"][0, 0]) for b in out] == list(range(6))
    assert cupy.asnumpy(out[5]["y"]).tolist() == [5, 6, 7, 8]


def test_without_cupy_device_staging_says_what_to_install() -> None:
    try:
        import cupy  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match=r"monitored\[gpu\]"):
            data.prefetch([np.zeros(1)], device=True)
    else:
        pytest.skip("CuPy is installed")
