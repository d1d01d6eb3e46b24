"""monitored-summaries: TensorBoard summaries with TF1's semantics.

A plugin for ``monitored``: installed, it gives ``MonitoredTrainingSession`` its
``save_summaries_steps``/``save_summaries_secs`` (a :class:`SummarySaverHook`
writing into ``summary_dir or checkpoint_dir`` on the chief). In a step,
``import monitored_summaries as summaries`` and call ``summaries.scalar(...)``,
``histogram``, ``image``, ``audio``, ``text``: on steps that are not due these
return at once. Event files are written by tensorboardX in a background thread,
into a local directory or any fsspec URL, and TensorBoard shows a resumed run as
one curve (``SessionLog`` events).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from ._encode import TF_BUCKET_LIMITS
from ._errors import (
    SummaryDirectoryError,
    SummaryError,
    SummaryNameError,
    SummaryReaderError,
    SummaryScheduleError,
    SummaryValueError,
    SummaryWriteError,
)
from ._hook import SummarySaverHook
from ._reader import MAX_RECORD_BYTES, summary_iterator
from ._record import audio, histogram, hparams, image, scalar, text
from ._writer import FileWriter, FileWriterCache, SummaryWriter

try:
    __version__ = version("monitored-summaries")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0+unknown"

__all__ = [
    "MAX_RECORD_BYTES",
    "TF_BUCKET_LIMITS",
    "FileWriter",
    "FileWriterCache",
    "SummaryDirectoryError",
    "SummaryError",
    "SummaryNameError",
    "SummaryReaderError",
    "SummarySaverHook",
    "SummaryScheduleError",
    "SummaryValueError",
    "SummaryWriteError",
    "SummaryWriter",
    "__version__",
    "audio",
    "histogram",
    "hparams",
    "image",
    "scalar",
    "summary_iterator",
    "text",
]
