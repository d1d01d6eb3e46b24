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

import importlib
import logging
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any, Final

from monitored import PrintableFilter as _PrintableFilter

from ._errors import (
    SummaryDirectoryError,
    SummaryError,
    SummaryNameError,
    SummaryReaderError,
    SummaryScheduleError,
    SummaryValueError,
    SummaryWriteError,
)
from ._record import audio, histogram, hparams, image, scalar, text

if TYPE_CHECKING:
    from ._encode import TF_BUCKET_LIMITS
    from ._hook import SummarySaverHook
    from ._reader import MAX_RECORD_BYTES, summary_iterator
    from ._writer import FileWriter, FileWriterCache, SummaryWriter

#: The names whose modules import tensorboardX (and protobuf), by module: imported
#: at first use, so that a session with this plugin installed but writing nothing,
#: and a step calling ``scalar(...)``, never pay for them.
_LAZY: Final = {
    "TF_BUCKET_LIMITS": "_encode",
    "SummarySaverHook": "_hook",
    "MAX_RECORD_BYTES": "_reader",
    "summary_iterator": "_reader",
    "FileWriter": "_writer",
    "FileWriterCache": "_writer",
    "SummaryWriter": "_writer",
}

# Its log lines name event files and log directories (read back, maybe hostile): none prints a
# terminal sequence or a forged line.
logging.getLogger("monitored.summaries").addFilter(_PrintableFilter())

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


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # the next lookup finds it without this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
