"""The ``summaries`` entry point's options: hyperparameters set without editing the script."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tensorboard.plugins.hparams import plugin_data_pb2
from tensorboardX.proto.summary_pb2 import Summary

import monitored_summaries as summaries
from monitored import MonitoredTrainingSession, PluginOptionError, StopAtStepHook, TrainState
from monitored_summaries import SummaryNameError, SummarySaverHook, SummaryValueError


def step(state: TrainState) -> dict[str, Any]:
    state.global_step += 1
    summaries.scalar("accuracy", 0.5)
    return {"loss": np.float32(1.0)}


async def train(directory: Path, **kwargs: Any) -> None:
    kwargs.setdefault("save_summaries_steps", 1)
    async with MonitoredTrainingSession(
        TrainState(), summary_dir=str(directory), hooks=[StopAtStepHook(last_step=2)], **kwargs
    ) as sess:
        while not sess.should_stop():
            await sess.run(step)


def event_files(directory: Path) -> list[Path]:
    return list(directory.glob("events.out.tfevents.*"))


def hparams_of(events: list[Any]) -> tuple[dict[str, Any], list[str]]:
    """The hyperparameters of the run's first session, and the experiment's metric tags."""
    values: dict[str, Any] = {}
    metrics: list[str] = []
    for event in events:
        for value in event.summary.value:
            if value.metadata.plugin_data.plugin_name != "hparams":
                continue
            data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
            if data.HasField("session_start_info") and not values:
                for k, v in data.session_start_info.hparams.items():
                    values[k] = v.number_value or v.string_value or v.bool_value
            if data.HasField("experiment"):
                metrics = [m.name.tag for m in data.experiment.metric_infos]
    return values, metrics


async def test_hparams_and_metrics_from_plugin_options(tmp_path: Path, events: Any) -> None:
    options = {"summaries": {"hparams": {"lr": 0.1, "opt": "sgd"}, "metrics": ["accuracy"]}}
    await train(tmp_path, plugin_options=options)
    assert hparams_of(events(str(tmp_path))) == ({"lr": 0.1, "opt": "sgd"}, ["accuracy"])


async def test_hparams_from_the_environment_as_json(
    tmp_path: Path, events: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "MONITORED_PLUGIN_OPTIONS",
        'summaries.hparams={"lr": 0.01, "layers": 3, "bn": true};summaries.metrics=accuracy',
    )
    await train(tmp_path)
    assert hparams_of(events(str(tmp_path))) == (
        {"lr": 0.01, "layers": 3, "bn": True},
        ["accuracy"],
    )


async def test_without_options_no_hparams_are_written(tmp_path: Path, events: Any) -> None:
    await train(tmp_path)
    assert hparams_of(events(str(tmp_path))) == ({}, [])


@pytest.mark.parametrize(
    ("hparams", "error", "match"),
    [
        (
            {"layers": [1, 2]},
            SummaryValueError,
            r"plugin option summaries.hparams: 'layers' must be a str, bool or number, got list",
        ),
        ({"": 1}, SummaryNameError, r"plugin option summaries.hparams: names must be non-empty"),
        (
            {"lr": {"value": 0.1}},
            SummaryValueError,
            r"summaries.hparams: 'lr' must be a str, bool or number, got dict",
        ),
    ],
)
async def test_bad_hparams_are_refused_before_training(
    tmp_path: Path, hparams: Any, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        await train(tmp_path, plugin_options={"summaries": {"hparams": hparams}})
    assert not event_files(tmp_path)


async def test_bad_hparams_are_refused_even_with_summaries_off(tmp_path: Path) -> None:
    with pytest.raises(SummaryValueError, match="summaries.hparams: 'x' must be"):
        await train(
            tmp_path,
            save_summaries_steps=0,
            plugin_options={"summaries": {"hparams": {"x": [1]}}},
        )


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"hparams": [("lr", 0.1)]}, r"summaries.hparams: expected a mapping with string keys"),
        ({"metrics": "accuracy"}, r"summaries.metrics: expected a list of strings"),
        ({"hparam": {}}, r"no option 'hparam'.*did you mean 'hparams'\?"),
    ],
)
async def test_bad_option_types_are_plugin_option_errors(
    tmp_path: Path, options: dict[str, Any], match: str
) -> None:
    with pytest.raises(PluginOptionError, match=match):
        await train(tmp_path, plugin_options={"summaries": options})


async def test_not_json_in_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MONITORED_PLUGIN_OPTIONS", "summaries.hparams={'lr': 0.1}")
    with pytest.raises(PluginOptionError, match=r"summaries.hparams: expected .*JSON object"):
        await train(tmp_path)


def test_the_hook_checks_its_hparams_when_made(tmp_path: Path) -> None:
    with pytest.raises(SummaryValueError, match=r"SummarySaverHook: hparams: expected a mapping"):
        SummarySaverHook(save_steps=1, output_dir=str(tmp_path), hparams=[("lr", 1)])  # type: ignore[arg-type]


# The plugin installed in a session that writes no summaries (no summary_dir), a step
# calling scalar(): tensorboardX (and protobuf) stay unimported. Then the public names
# that need it resolve on first use.
_IDLE_SESSION = """
import sys

import anyio
import monitored
import monitored_summaries as summaries

HEAVY = ("tensorboardX", "google.protobuf")


def step(state):
    state.global_step += 1
    summaries.scalar("accuracy", 0.5)
    return {}


async def main():
    session = monitored.MonitoredTrainingSession(
        hooks=[monitored.StopAtStepHook(last_step=3)], log_step_count_steps=None
    )
    async with session:
        while not session.should_stop():
            await session.run(step)
    assert "summaries" in [info.name for info in session.plugins]
    return session.state.global_step


print(anyio.run(main), [m for m in HEAVY if m in sys.modules])
from monitored_summaries import FileWriter, SummarySaverHook, summary_iterator

print(SummarySaverHook.__name__, summaries.TF_BUCKET_LIMITS.size, "tensorboardX" in sys.modules)
"""


def test_neither_the_package_nor_an_idle_plugin_imports_tensorboardx() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONITORED_")}
    env["MONITORED_DISABLE_PLUGINS"] = ",".join(
        ep.name for ep in entry_points(group="monitored") if ep.name != "summaries"
    )
    done = subprocess.run(
        [sys.executable, "-c", _IDLE_SESSION],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "3 []", done.stdout + done.stderr
    assert lines[1] == f"SummarySaverHook {summaries.TF_BUCKET_LIMITS.size} True"


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'SummaryWritter'"):
        summaries.SummaryWritter  # noqa: B018
    assert {"SummarySaverHook", "FileWriter", "scalar"} <= set(dir(summaries))


def unwritten(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "HParams metric" in r.getMessage()]


async def test_an_hparams_metric_nothing_writes_is_a_warning_naming_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An empty column in the dashboard, said: 'accuracy' and 'loss' are written, 'f1' not."""
    options = {"summaries": {"hparams": {"lr": 0.1}, "metrics": ["accuracy", "loss", "f1"]}}
    caplog.set_level("WARNING", logger="monitored.summaries")
    await train(tmp_path, plugin_options=options)
    [message] = unwritten(caplog)
    assert message.startswith(
        f"HParams metric 'f1' was never written to {tmp_path}, the run's directory, so its "
        "column in TensorBoard's HParams dashboard stays empty. Write a scalar"
    )
    assert "metrics={'f1': value}" in message


async def test_an_hparams_metric_written_to_a_sub_directory_only_says_where(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The dashboard reads a metric from the run's own directory, not from ``eval``."""
    evaluation = summaries.FileWriter(tmp_path / "eval")
    evaluation.add_summary(Summary(value=[Summary.Value(tag="f1", simple_value=0.9)]), 1)
    evaluation.close()
    options = {"summaries": {"hparams": {"lr": 0.1}, "metrics": ["f1"]}}
    caplog.set_level("WARNING", logger="monitored.summaries")
    await train(tmp_path, plugin_options=options)
    [message] = unwritten(caplog)
    assert "stays empty; it was written to 'eval' only, where the dashboard does not look" in (
        message
    )


async def test_an_hparams_metric_given_its_final_value_is_no_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def final_step(state: TrainState) -> None:
        state.global_step += 1
        summaries.hparams({"lr": 0.1}, metrics={"f1": 0.7})

    caplog.set_level("WARNING", logger="monitored.summaries")
    async with MonitoredTrainingSession(
        TrainState(),
        summary_dir=str(tmp_path),
        save_summaries_steps=1,
        hooks=[StopAtStepHook(last_step=2)],
    ) as sess:
        while not sess.should_stop():
            await sess.run(final_step)
    assert unwritten(caplog) == []
