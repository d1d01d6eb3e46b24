"""The demo logs its run to MLflow with ``--mlflow`` (here ``mlflow=True``)."""

from __future__ import annotations

import importlib.util
import shlex
import sys
from pathlib import Path
from types import ModuleType

import anyio
import pytest
from mlflow import MlflowClient

DEMO = Path(__file__).parents[3] / "examples" / "demo.py"


def load_demo() -> ModuleType:
    spec = importlib.util.spec_from_file_location("monitored_demo_for_mlflow", DEMO)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_demo_logs_its_run_and_evaluations_into_its_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    demo = load_demo()
    directory = tmp_path / "my runs" / "démo 1"  # the command it prints is pasted as is
    anyio.run(demo.train, 200, 0, str(directory), 100, True)
    [line] = [x for x in capsys.readouterr().out.splitlines() if "mlflow ui" in x]
    command = shlex.split(line[line.index("(") + 1 : -1])
    assert command == ["mlflow", "ui", "--backend-store-uri", f"sqlite:///{directory}/mlflow.db"]
    client = MlflowClient(f"sqlite:///{directory / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("demo")
    assert experiment is not None
    [run] = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.params["optimizer"] == "MomentumOptimizer"
    assert run.data.params["batch_size"] == "32"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "eval/accuracy")] == [
        100,
        200,
    ]
    # Every 100 steps from the step's outputs, and what the summaries hook writes (its
    # scalars=["loss", ...] at 1, 101 and the last step, 200, which holds one point).
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [
        1,
        100,
        101,
        200,
    ]


def test_the_demo_never_names_a_run_that_was_not_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A store that cannot be opened: its directory is a file.
    (tmp_path / "not-a-dir").write_text("")
    uri = f"sqlite:///{tmp_path / 'not-a-dir' / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    demo = load_demo()
    anyio.run(demo.train, 20, 0, str(tmp_path / "demo"), 10, True)
    out = capsys.readouterr().out
    assert "logged to MLflow run None" not in out
    assert f"nothing was logged to MLflow: no run could be created on {uri}" in out
