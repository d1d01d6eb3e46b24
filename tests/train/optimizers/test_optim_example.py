"""examples/mlp.py: gradient-checked MLP whose loss goes down with every optimizer."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "mlp.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("monitored_example_mlp", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_trains_with_every_optimizer(capsys: pytest.CaptureFixture[str]) -> None:
    mlp = _load()
    assert mlp.main(["--epochs", "2"]) == 0
    out = capsys.readouterr().out
    assert "gradient check: max |backprop - numerical|" in out
    for name in mlp.OPTIMIZERS:
        assert f"| {name} |" in out


def test_example_gradient_check_catches_a_wrong_backprop(monkeypatch: pytest.MonkeyPatch) -> None:
    mlp = _load()
    right = mlp.loss_and_grads

    def wrong(params, x, y):  # type: ignore[no-untyped-def]
        loss, grads = right(params, x, y)
        grads["b1"] = grads["b1"] * 1.01
        return loss, grads

    data = mlp.load_data(0)
    assert mlp.check_gradients(data[0], data[2], 0) < 1e-7
    monkeypatch.setattr(mlp, "loss_and_grads", wrong)
    assert mlp.check_gradients(data[0], data[2], 0) > 1e-5
