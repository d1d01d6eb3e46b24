"""Metrics on CuPy arrays: sums stay on the device, updates never wait for it (on the
stand-in CuPy everywhere, on a GPU with ``-m gpu``); NumPy use never imports CuPy."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from _standin_device import StandinCupy

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


# -- transfers per update, on the stand-in CuPy (every run) and on a GPU (-m gpu) ---------


def _inputs(rng: np.random.Generator) -> dict[str, Any]:
    labels = rng.integers(0, 3, 64)
    return {
        "labels01": labels % 2,
        "preds": rng.random(64).astype(np.float32),
        "classes": labels,
        "predicted": rng.integers(0, 3, 64),
        "weights": rng.random(64),
    }


def _updates(xp: Any, data: dict[str, Any]) -> list[tuple[m.Metric, tuple[Any, ...], Any]]:
    """(metric, update arguments, weights) for every kind, inputs in ``xp``'s arrays."""
    a = {k: xp.asarray(v) for k, v in data.items()}
    return [
        (m.AUC(), (a["labels01"], a["preds"]), None),
        (m.AUC(curve="PR"), (a["labels01"], a["preds"]), a["weights"]),
        (m.MeanPerClassAccuracy(3), (a["classes"], a["predicted"]), None),
        (m.MeanPerClassAccuracy(3), (a["classes"], a["predicted"]), a["weights"]),
        (m.MeanIoU(3), (a["classes"], a["predicted"]), None),
        (m.MeanIoU(3), (a["classes"], a["predicted"]), a["weights"]),
        (m.Accuracy(), (a["classes"], a["predicted"]), a["weights"]),
        (m.Precision(), (a["labels01"], a["preds"] > 0.5), None),
        (m.MeanSquaredError(), (a["preds"], a["weights"]), None),
        (m.Mean(), (a["preds"],), None),
    ]


def _update(metric: m.Metric, args: tuple[Any, ...], weights: Any) -> None:
    if weights is None:
        metric.update(*args)  # type: ignore[attr-defined]
    else:
        metric.update(*args, weights=weights)  # type: ignore[attr-defined]


def test_updates_on_cupy_make_no_transfer_and_result_one(standin_cupy: StandinCupy) -> None:
    cupy = standin_cupy.module
    rng = np.random.default_rng(0)
    batches = [_inputs(rng) for _ in range(3)]
    on_device = [metric for metric, _, _ in _updates(cupy, batches[0])]
    on_host = [metric for metric, _, _ in _updates(np, batches[0])]
    for data in batches:
        for metric, (_, args, weights) in zip(on_device, _updates(cupy, data), strict=True):
            standin_cupy.transfers.reset()
            _update(metric, args, weights)
            assert standin_cupy.transfers.to_host == 0, (metric, standin_cupy.transfers)
        for metric, (_, args, weights) in zip(on_host, _updates(np, data), strict=True):
            _update(metric, args, weights)
    for device_metric, host_metric in zip(on_device, on_host, strict=True):
        standin_cupy.transfers.reset()
        result = device_metric.result()
        assert standin_cupy.transfers.to_host == 1, (device_metric, standin_cupy.transfers)
        assert result == pytest.approx(host_metric.result(), rel=1e-9), device_metric


@pytest.mark.parametrize(
    ("make", "bad"),
    [
        (lambda: m.AUC(), lambda c: ([0, 1], c.asarray(np.float32([0.5, 1.5])))),
        (lambda: m.AUC(), lambda c: ([0, 1], c.asarray(np.float32([np.nan, 0.5])))),
        (lambda: m.MeanIoU(2), lambda c: (c.asarray([0, 2]), c.asarray([0, 1]))),
        (lambda: m.MeanIoU(2), lambda c: (c.asarray([0, 1]), c.asarray([-1, 1]))),
        (lambda: m.MeanPerClassAccuracy(2), lambda c: (c.asarray([0, 5]), c.asarray([0, 1]))),
    ],
)
def test_out_of_range_inputs_on_cupy_fail_when_the_sums_are_read(
    standin_cupy: StandinCupy, make: Any, bad: Any
) -> None:
    cupy = standin_cupy.module
    metric = make()
    metric.update(*bad(cupy))  # checked on the device: nothing waits here
    with pytest.raises(m.MetricValueError, match=r"since the last check.*result\(\)"):
        metric.result()
    with pytest.raises(m.MetricValueError, match="got values from"):
        metric.state()  # and again: the bad sums stay refused until reset()
    metric.reset()
    assert metric.result() == 0.0


def test_a_good_update_after_a_checked_one_is_judged_alone(standin_cupy: StandinCupy) -> None:
    cupy = standin_cupy.module
    auc = m.AUC()
    auc.update(cupy.asarray([0, 1]), cupy.asarray(np.float32([0.2, 0.9])))
    auc.result()  # judged and cleared
    assert not auc._deferred
    auc.update(cupy.asarray([0, 1]), cupy.asarray(np.float32([0.1, 0.7])))
    assert set(auc._deferred) == {"predictions must be in [0, 1] (TF asserts it)"}


def test_merging_cupy_metrics_carries_their_pending_checks(standin_cupy: StandinCupy) -> None:
    cupy = standin_cupy.module
    good, bad = m.MeanIoU(2), m.MeanIoU(2)
    good.update(cupy.asarray([0, 1]), cupy.asarray([0, 1]))
    bad.update(cupy.asarray([0, 1]), cupy.asarray([3, 1]))
    standin_cupy.transfers.reset()
    good.merge(bad)  # device to device: no transfer, the check travels along
    assert standin_cupy.transfers.to_host == 0
    with pytest.raises(m.MetricValueError, match=r"predictions must be class ids in \[0, 2\)"):
        good.result()
    on_host = m.MeanIoU(2)
    on_host.update([0, 1], [0, 1])
    with pytest.raises(m.MetricValueError, match="from 1 to 3"):
        on_host.merge(bad)  # into NumPy sums: judged before they are added
    assert on_host.updates == 1


@pytest.mark.gpu
def test_updates_on_a_gpu_never_synchronize() -> None:
    cupy = pytest.importorskip("cupy")
    import cupyx

    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA device")
    except Exception as exc:  # CUDA runtime missing or broken
        pytest.skip(f"no usable CUDA device: {exc}")
    data = _inputs(np.random.default_rng(0))
    for (metric, args, weights), (on_host, host_args, host_weights) in zip(
        _updates(cupy, data), _updates(np, data), strict=True
    ):
        _update(metric, args, weights)  # kernels compiled, caches warm
        with cupyx.allow_synchronize(False):
            _update(metric, args, weights)
        _update(on_host, host_args, host_weights)
        _update(on_host, host_args, host_weights)
        assert metric.result() == pytest.approx(on_host.result(), rel=1e-6), metric
