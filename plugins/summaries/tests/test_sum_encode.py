"""What TensorBoard reads: TF's histogram buckets, images, audio, text, hparams."""

from __future__ import annotations

import io
import sys
import wave
from typing import Any

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

import monitored_summaries as summaries
from monitored import MonitoredSession, StopAtStepHook, TrainState
from monitored_summaries import TF_BUCKET_LIMITS, SummarySaverHook

pytestmark = pytest.mark.anyio


def test_tf_bucket_limits() -> None:
    limits = TF_BUCKET_LIMITS
    assert limits[0] == -sys.float_info.max
    assert limits[-1] == sys.float_info.max
    assert 0.0 in limits
    assert np.all(np.diff(limits) > 0)
    positive = limits[limits > 0][:-1]
    assert positive[0] == 1e-12
    assert positive[-1] < 1e20 <= positive[-1] * 1.1
    np.testing.assert_allclose(positive[1:] / positive[:-1], 1.1)


async def test_what_tensorboard_reads(logdir: str) -> None:
    images = np.zeros((4, 2, 3, 3), np.float32)
    images[:, :, :, 0] = 1.0  # red

    def step(state: TrainState) -> None:
        state.global_step += 1
        summaries.histogram("w", np.array([0.0, 1.0, 1.0, -2.5, 1e30]))
        summaries.image("img", images, max_outputs=2)
        summaries.image("one", images[:1].astype(np.float64), max_outputs=1)
        summaries.audio("sound", np.linspace(-1, 1, 64, dtype=np.float32)[None, :], 8000)
        summaries.text("notes", "**bold**")

    hooks = [StopAtStepHook(last_step=1), SummarySaverHook(save_steps=1, output_dir=logdir)]
    async with MonitoredSession(TrainState(), hooks=hooks) as s:
        await s.run(step)

    acc = EventAccumulator(logdir, size_guidance={"images": 0, "audio": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    assert tags["images"] == ["img/image/0", "img/image/1", "one/image"]
    [histogram] = acc.Histograms("w")
    value = histogram.histogram_value
    assert (value.min, value.max, value.num, value.sum) == (-2.5, 1e30, 5, 1e30 - 0.5)
    assert sum(value.bucket) == 5
    # Each value lies in the first bucket whose limit is greater than it (TF's rule).
    for v in (0.0, 1.0, -2.5, 1e30):
        limit = TF_BUCKET_LIMITS[np.searchsorted(TF_BUCKET_LIMITS, v, side="right")]
        assert limit in value.bucket_limit
    [image] = acc.Images("img/image/0")
    assert (image.width, image.height) == (3, 2)
    from PIL import Image

    pixels = np.asarray(Image.open(io.BytesIO(image.encoded_image_string)))
    assert pixels.shape == (2, 3, 3)
    assert (pixels[..., 0] == 255).all()
    assert (pixels[..., 1] == 0).all()
    [clip] = acc.Audio("sound/audio/0")
    with wave.open(io.BytesIO(clip.encoded_audio_string)) as wav:
        assert (wav.getframerate(), wav.getnframes(), wav.getnchannels()) == (8000, 64, 1)
    [text] = acc.Tensors("notes")
    assert text.tensor_proto.string_val == [b"**bold**"]


async def test_hparams_for_the_dashboard(logdir: str, events: Any) -> None:
    def step(state: TrainState) -> None:
        state.global_step += 1
        summaries.scalar("accuracy", 0.5)

    hook = SummarySaverHook(
        save_steps=1, output_dir=logdir, hparams={"lr": 0.1, "opt": "sgd", "bn": True}
    )
    async with MonitoredSession(TrainState(), hooks=[StopAtStepHook(last_step=2), hook]) as s:
        summaries.hparams({"layers": 3}, metrics={"final_loss": 0.25})
        while not s.should_stop():
            await s.run(step)
    found: dict[str, Any] = {}
    scalars: dict[str, float] = {}
    for event in events(logdir):
        for value in event.summary.value:
            if value.metadata.plugin_data.plugin_name == "hparams":
                data = plugin_data_pb2.HParamsPluginData.FromString(
                    value.metadata.plugin_data.content
                )
                found.setdefault(data.WhichOneof("data"), []).append(data)
            elif value.WhichOneof("value") == "simple_value":
                scalars[value.tag] = value.simple_value
    starts = found["session_start_info"]
    assert {
        k: v.number_value or v.string_value or v.bool_value
        for k, v in starts[0].session_start_info.hparams.items()
    } == {"lr": 0.1, "opt": "sgd", "bn": True}
    assert starts[1].session_start_info.hparams["layers"].number_value == 3
    assert [m.name.tag for m in found["experiment"][1].experiment.metric_infos] == ["final_loss"]
    assert len(found["session_end_info"]) == 1
    assert scalars["final_loss"] == 0.25


# -- issue 22: TF1's tag rules ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "tag"),
    [
        ("Train/Training Loss", "Train/Training_Loss"),
        ("/Valid/loss", "Valid/loss"),
        ("//a", "a"),
        ("a:b(c)", "a_b_c_"),
        ("a.b-c/d_e", "a.b-c/d_e"),
        ("précision", "précision"),  # TF1's \w on Python 3 is Unicode
    ],
)
def test_clean_tag_follows_tf1s_rules(name: str, tag: str) -> None:
    from monitored_summaries._encode import clean_tag

    assert clean_tag(name) == tag


def test_a_cleaned_name_is_said_once_at_info(caplog: pytest.LogCaptureFixture) -> None:
    from monitored_summaries._encode import clean_tag

    clean_tag.cache_clear()
    with caplog.at_level("INFO", logger="monitored.summaries"):
        for _ in range(3):
            clean_tag("Said Once")
    said = [r for r in caplog.records if "is illegal; using 'Said_Once'" in r.getMessage()]
    assert len(said) == 1


async def test_a_name_that_cleans_to_nothing_is_refused_naming_it(logdir: str) -> None:
    def bad_step(state: TrainState) -> None:
        state.global_step += 1
        summaries.scalar("/", 1.0)

    with pytest.raises(summaries.SummaryNameError, match=r"got '/'"):
        async with MonitoredSession(
            TrainState(), hooks=[SummarySaverHook(save_steps=1, output_dir=logdir)]
        ) as s:
            await s.run(bad_step)


def test_encode_refuses_a_name_that_cleans_to_nothing() -> None:
    from monitored_summaries._encode import encode

    with pytest.raises(summaries.SummaryNameError, match="nothing is left of the name"):
        encode([("scalar", "///", 1.0, {})], [1.0], 3)


async def test_hparams_metrics_name_the_cleaned_tags(logdir: str, events: Any) -> None:
    def step(state: TrainState) -> None:
        state.global_step += 1
        summaries.scalar("Valid/Validation Loss", 0.5)

    hook = SummarySaverHook(
        save_steps=1, output_dir=logdir, hparams={"lr": 0.1}, metrics=["Valid/Validation Loss"]
    )
    async with MonitoredSession(TrainState(), hooks=[StopAtStepHook(last_step=1), hook]) as s:
        summaries.hparams({"layers": 3}, metrics={"Final Loss": 0.25})
        while not s.should_stop():
            await s.run(step)
    tags: list[str] = []
    scalars: set[str] = set()
    for event in events(logdir):
        for value in event.summary.value:
            if value.metadata.plugin_data.plugin_name == "hparams":
                data = plugin_data_pb2.HParamsPluginData.FromString(
                    value.metadata.plugin_data.content
                )
                if data.WhichOneof("data") == "experiment":
                    tags += [m.name.tag for m in data.experiment.metric_infos]
            elif value.WhichOneof("value") == "simple_value":
                scalars.add(value.tag)
    assert sorted(tags) == ["Final_Loss", "Valid/Validation_Loss"]
    assert {"Final_Loss", "Valid/Validation_Loss"} <= scalars
