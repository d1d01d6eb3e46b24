"""The installed plugin: idle (no hook, no files) until configured; on with a URI or ``enabled``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mlflow import MlflowClient

from monitored import MonitoredTrainingSession, StopAtStepHook, TrainState
from monitored_mlflow import MlflowHook


def step(state: TrainState) -> dict[str, Any]:
    state.global_step += 1
    return {"loss": np.float32(0.5)}


async def run(**kwargs: Any) -> Any:
    async with MonitoredTrainingSession(
        TrainState(), hooks=[StopAtStepHook(last_step=3)], log_step_count_steps=1, **kwargs
    ) as sess:
        while not sess.should_stop():
            await sess.run(step)
    return sess


async def test_unconfigured_the_plugin_adds_no_hook_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    sess = await run()
    assert "mlflow" in [i.name for i in sess.plugins], "installed and loaded"
    assert not [i for i in sess.plugins if isinstance(i.plugin, MlflowHook)]
    assert not sess.implements("write_summaries") or "summaries" in [
        i.name for i in sess.plugins
    ], "an idle plugin is no summary sink"
    assert os.listdir(tmp_path) == [], "no mlflow.db, no mlruns in the working directory"


def loaded_line(caplog: pytest.LogCaptureFixture) -> str:
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Loaded plugins")]
    return line


async def test_the_loaded_plugins_line_says_where_it_logs_or_how_to_switch_it_on(
    tracking_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    caplog.set_level("INFO", logger="monitored")
    monkeypatch.chdir(tmp_path)
    await run()
    assert "off: set MLFLOW_TRACKING_URI" in loaded_line(caplog)
    caplog.clear()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri)
    await run()
    assert f"; logging to {tracking_uri})" in loaded_line(caplog)


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        ("http://alice:s3cret@host:5000/x", "http://alice:***@host:5000/x"),
        ("http://host:5000", "http://host:5000"),
        ("sqlite:///runs/mlflow.db", "sqlite:///runs/mlflow.db"),
        (None, "MLflow's default store"),
        ("http://host:notaport", "http://host:notaport"),
    ],
)
def test_a_password_in_the_tracking_uri_never_reaches_the_log(uri: str | None, shown: str) -> None:
    from monitored_mlflow._uri import without_password

    assert without_password(uri) == shown


async def test_mlflow_tracking_uri_in_the_environment_turns_it_on(
    tracking_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri)
    sess = await run()
    [hook] = [i.plugin for i in sess.plugins if isinstance(i.plugin, MlflowHook)]
    assert hook.tracking_uri == tracking_uri
    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name("monitored")
    assert experiment is not None
    [found] = client.search_runs([experiment.experiment_id])
    assert found.info.status == "FINISHED"


async def test_the_tracking_uri_option_through_the_environment(
    tracking_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "MONITORED_PLUGIN_OPTIONS", f"mlflow.tracking_uri={tracking_uri};mlflow.experiment=env"
    )
    await run()
    assert MlflowClient(tracking_uri).get_experiment_by_name("env") is not None


def test_enabled_without_a_uri_uses_mlflows_default_store_in_the_working_directory(
    tmp_path: Path,
) -> None:
    # A process of its own: MLflow resolves its default store from the working directory.
    script = textwrap.dedent(
        """
        import anyio, numpy as np
        from monitored import MonitoredTrainingSession, StopAtStepHook, TrainState

        def step(state):
            state.global_step += 1
            return {"loss": np.float32(0.5)}

        async def main():
            async with MonitoredTrainingSession(
                TrainState(), hooks=[StopAtStepHook(last_step=3)],
                plugin_options={"mlflow": {"enabled": True}},
            ) as sess:
                while not sess.should_stop():
                    await sess.run(step)

        anyio.run(main)
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "MONITORED_"))}
    done = subprocess.run(
        [sys.executable, "-W", "ignore::DeprecationWarning", "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "mlflow.db").is_file(), "MLflow's own default: sqlite:///mlflow.db"
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("monitored")
    assert experiment is not None
    [found] = client.search_runs([experiment.experiment_id])
    assert found.data.metrics["loss"] == 0.5


def test_an_idle_plugin_never_imports_mlflow(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import sys, anyio
        from monitored import MonitoredTrainingSession, StopAtStepHook, TrainState

        def step(state):
            state.global_step += 1

        async def main():
            async with MonitoredTrainingSession(
                TrainState(), hooks=[StopAtStepHook(last_step=2)]
            ) as sess:
                assert "mlflow" in [i.name for i in sess.plugins]
                while not sess.should_stop():
                    await sess.run(step)

        anyio.run(main)
        print(sorted(m for m in sys.modules if m == "mlflow" or m.startswith("mlflow.")))
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "MONITORED_"))}
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert os.listdir(tmp_path) == []


def test_a_password_in_a_changed_option_never_reaches_the_runs_params() -> None:
    from types import SimpleNamespace

    import monitored
    from monitored_mlflow._hook import _changed_options

    class Tracker:
        @staticmethod
        def declare_options() -> list[monitored.Option]:
            return [monitored.Option("tracking_uri", ""), monitored.Option("retries", 3)]

    info = SimpleNamespace(name="tracker", plugin=Tracker())
    changed = _changed_options(
        info,  # type: ignore[arg-type]
        {"tracking_uri": "https://bob:hunter2@mlflow.example:443", "retries": 3},
    )
    assert changed == {"tracking_uri": "https://bob:***@mlflow.example:443"}
