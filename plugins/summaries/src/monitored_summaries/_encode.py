"""Turning host values into TensorBoard ``Summary`` protos (tensorboardX's protos).

Runs in the writer's thread, off the step loop: the step only validates what it
can see without touching data (names, ranks, dtypes) and copies values to host.
Histograms use TensorFlow's bucket scheme (``histogram.cc``): right-open buckets
with limits growing by 10% from 1e-12 to 1e20, mirrored for negative values,
runs of empty buckets folded into one, so TensorBoard draws what TF1 drew.
"""

from __future__ import annotations

import io
import struct
import sys
import wave
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np
from tensorboardX.proto.summary_pb2 import HistogramProto, Summary, SummaryMetadata
from tensorboardX.proto.tensor_pb2 import TensorProto
from tensorboardX.proto.tensor_shape_pb2 import TensorShapeProto

from ._errors import SummaryNameError, SummaryValueError
from ._tags import clean_tag

__all__ = [
    "TF_BUCKET_LIMITS",
    "clean_tag",
    "encode",
    "encode_audio",
    "encode_histogram",
    "encode_image",
    "encode_scalar",
    "encode_text",
    "histogram_proto",
]

_DBL_MAX: Final = sys.float_info.max


def _tf_bucket_limits() -> np.ndarray:
    positive: list[float] = []
    v = 1e-12
    while v < 1e20:
        positive.append(v)
        v *= 1.1
    positive.append(_DBL_MAX)
    negative = [-x for x in reversed(positive)]
    return np.array([*negative, 0.0, *positive], dtype=np.float64)


#: TensorFlow's default histogram bucket limits (each the right edge of its bucket).
TF_BUCKET_LIMITS: Final = _tf_bucket_limits()


def histogram_proto(values: np.ndarray, name: str, step: int) -> HistogramProto:
    """TF's histogram of ``values`` (any shape, finite) as a ``HistogramProto``.

    Sorts the values once and finds each bucket limit in them (as ``np.histogram``
    does): much faster than looking each value up among the limits.
    """
    flat = np.sort(np.asarray(values).reshape(-1))
    if flat.dtype.kind != "f" or flat.dtype.itemsize > 8:
        flat = flat.astype(np.float64)
    if flat.size == 0:
        return HistogramProto(
            min=0.0, max=0.0, num=0, sum=0.0, sum_squares=0.0, bucket_limit=[_DBL_MAX], bucket=[0]
        )
    low, high = float(flat[0]), float(flat[-1])  # NaN sorts last, -inf first
    if not (np.isfinite(low) and np.isfinite(high)):
        bad = int(np.count_nonzero(~np.isfinite(flat)))
        raise SummaryValueError(
            f"histogram {name!r} at step {step}: {bad} of {flat.size} values are NaN or "
            "infinite; TensorBoard histograms hold finite values only (as TF1's "
            "'Nan in summary histogram')"
        )
    # A value v falls in the first bucket whose limit is > v (TF's upper_bound): the
    # count of bucket i is the number of values in [limit[i-1], limit[i]).
    first = int(np.searchsorted(TF_BUCKET_LIMITS, low, side="right"))
    last = int(np.searchsorted(TF_BUCKET_LIMITS, high, side="right"))
    edges = TF_BUCKET_LIMITS[first : last + 1]
    below = np.searchsorted(flat, edges.astype(flat.dtype), side="left")
    # Limits rounded to float32 can move a value across an edge; recount those exactly.
    if flat.dtype != np.float64:
        exact = np.asarray(edges, dtype=np.float64)
        for j in range(len(below)):
            k = int(below[j])
            while k > 0 and float(flat[k - 1]) >= exact[j]:
                k -= 1
            while k < flat.size and float(flat[k]) < exact[j]:
                k += 1
            below[j] = k
    counts = np.diff(np.concatenate([[0], below]))
    counts[-1] += flat.size - below[-1]  # values at or above the last limit's left edge
    limits_out: list[float] = []
    counts_out: list[float] = []
    if first > 0:
        limits_out.append(float(TF_BUCKET_LIMITS[first - 1]))  # the empty run before
        counts_out.append(0.0)
    run_limit: float | None = None
    for limit, count in zip(edges.tolist(), counts.tolist(), strict=True):
        if count == 0:
            run_limit = limit  # a run of empty buckets is folded into one
            continue
        if run_limit is not None:
            limits_out.append(run_limit)
            counts_out.append(0.0)
            run_limit = None
        limits_out.append(limit)
        counts_out.append(float(count))
    if last < TF_BUCKET_LIMITS.size - 1:
        limits_out.append(float(TF_BUCKET_LIMITS[-1]))
        counts_out.append(0.0)
    wide = flat.astype(np.float64, copy=False)
    return HistogramProto(
        min=low,
        max=high,
        num=float(flat.size),
        sum=float(wide.sum()),
        sum_squares=float(np.dot(wide, wide)),
        bucket_limit=limits_out,
        bucket=counts_out,
    )


def encode_scalar(name: str, value: Any, step: int) -> list[Summary.Value]:
    """A ``simple_value``; NaN and infinities are written as they are (as TF does)."""
    array = np.asarray(value)
    if array.size != 1 or array.dtype.kind not in "biuf":
        raise SummaryValueError(
            f"scalar {name!r} at step {step}: expected one real number, got an array of "
            f"shape {array.shape} and dtype {array.dtype}"
        )
    return [Summary.Value(tag=name, simple_value=float(array.reshape(()).item()))]


def encode_histogram(name: str, values: Any, step: int) -> list[Summary.Value]:
    """A histogram of ``values`` in TF's buckets."""
    return [Summary.Value(tag=name, histo=histogram_proto(values, name, step))]


def _png(image: np.ndarray) -> bytes:
    """``image`` (HWC uint8, C in 1, 3, 4) as a PNG file: stored rows, zlib-compressed."""
    height, width, channels = image.shape
    color_type = {1: 0, 3: 2, 4: 6}[channels]
    rows = np.concatenate(
        [np.zeros((height, 1), dtype=np.uint8), image.reshape(height, width * channels)], axis=1
    )

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows.tobytes(), 6))
        + chunk(b"IEND", b"")
    )


def _to_uint8(images: np.ndarray) -> np.ndarray:
    if images.dtype == np.uint8:
        return images
    scaled = np.clip(np.nan_to_num(images.astype(np.float64)), 0.0, 1.0) * 255.0
    return np.rint(scaled).astype(np.uint8)


def _numbered(name: str, kind: str, count: int, max_outputs: int) -> list[str]:
    if max_outputs == 1:
        return [f"{name}/{kind}"]
    return [f"{name}/{kind}/{i}" for i in range(count)]


def encode_image(name: str, images: Any, step: int, max_outputs: int) -> list[Summary.Value]:
    """Up to ``max_outputs`` PNG images from an NHWC batch, tagged as TF1 tags them."""
    batch = _to_uint8(np.asarray(images))[:max_outputs]
    tags = _numbered(name, "image", len(batch), max_outputs)
    return [
        Summary.Value(
            tag=tag,
            image=Summary.Image(
                height=int(img.shape[0]),
                width=int(img.shape[1]),
                colorspace=int(img.shape[2]),
                encoded_image_string=_png(np.ascontiguousarray(img)),
            ),
        )
        for tag, img in zip(tags, batch, strict=True)
    ]


def _wav(clip: np.ndarray, sample_rate: int) -> bytes:
    pcm = np.rint(np.clip(np.nan_to_num(clip.astype(np.float64)), -1.0, 1.0) * 32767.0)
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(clip.shape[1])
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes(pcm.astype("<i2").tobytes())
    return buffer.getvalue()


def encode_audio(
    name: str, audio: Any, step: int, sample_rate: int, max_outputs: int
) -> list[Summary.Value]:
    """Up to ``max_outputs`` 16-bit WAV clips from ``[batch, frames(, channels)]`` in [-1, 1]."""
    batch = np.asarray(audio)
    if batch.ndim == 2:
        batch = batch[:, :, None]
    batch = batch[:max_outputs]
    tags = _numbered(name, "audio", len(batch), max_outputs)
    return [
        Summary.Value(
            tag=tag,
            audio=Summary.Audio(
                sample_rate=float(sample_rate),
                num_channels=int(clip.shape[1]),
                length_frames=int(clip.shape[0]),
                encoded_audio_string=_wav(clip, sample_rate),
                content_type="audio/wav",
            ),
        )
        for tag, clip in zip(tags, batch, strict=True)
    ]


def encode_text(name: str, text: Any, step: int) -> list[Summary.Value]:
    """A string tensor for TensorBoard's text plugin (Markdown), as TF1's ``summary.text``."""
    array = np.asarray(text)
    strings = [s if isinstance(s, bytes) else str(s).encode() for s in array.reshape(-1).tolist()]
    metadata = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="text"))
    shape = TensorShapeProto(dim=[TensorShapeProto.Dim(size=d) for d in array.shape])
    tensor = TensorProto(dtype=7, string_val=strings, tensor_shape=shape)  # 7: DT_STRING
    return [Summary.Value(tag=name, metadata=metadata, tensor=tensor)]


def encode(
    records: Sequence[tuple[str, str, Any, Mapping[str, Any]]], host: Sequence[Any], step: int
) -> Summary:
    """One ``Summary`` holding every record of a step, with its host value.

    Names become tags by TF1's rules (:func:`clean_tag`).
    """
    values: list[Summary.Value] = []
    for (kind, raw_name, _, extra), value in zip(records, host, strict=True):
        name = clean_tag(raw_name)
        if not name:
            raise SummaryNameError(
                f"{kind} {raw_name!r} at step {step}: nothing is left of the name once "
                "TF1's rules clean it (letters, digits, '_', '-', '/', '.'; no leading '/')"
            )
        if kind == "scalar":
            values += encode_scalar(name, value, step)
        elif kind == "histogram":
            values += encode_histogram(name, value, step)
        elif kind == "image":
            values += encode_image(name, value, step, extra["max_outputs"])
        elif kind == "audio":
            values += encode_audio(name, value, step, extra["sample_rate"], extra["max_outputs"])
        elif kind == "text":
            values += encode_text(name, value, step)
        else:  # pragma: no cover - records are made by this package only
            raise AssertionError(kind)
    return Summary(value=values)
