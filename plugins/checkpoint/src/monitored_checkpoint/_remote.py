"""Bounds on remote checkpoint stores: every call answers in time or fails, naming the store.

An object store that accepts connections and then never answers (a server
stopped, a proxy that stopped forwarding, a network partition after the
handshake) would hold a save, and the process, forever: an upload waiting for a
full TCP window has no timeout of its own, and the client libraries' retries
multiply the ones there are. So two layers bound it:

* **the client's own timeouts**, passed to the fsspec filesystem when the store
  is opened: for S3 (s3fs, botocore) ``connect_timeout``, ``read_timeout`` and
  botocore's ``retries``; a value the user already set in fsspec's
  configuration (``fsspec.config.conf["s3"]["config_kwargs"]``) wins;
* **a deadline on every store operation** (a file written or read whole, a
  listing, a removal), and on a whole save: the operation runs in a daemon
  thread and the caller waits at most that long. One that does not end in time
  is left behind (it cannot hold the process at exit) and the caller gets
  :class:`CheckpointStoreTimeoutError`, naming the store, what it was doing
  and the setting; a save's writer wraps it in a ``CheckpointWriteError`` that
  names the checkpoint and the step. A save cut short never becomes a
  checkpoint: its manifest is written last (see ``_format``), so the newest
  complete checkpoint stays the one a restore finds.

Each bound is an environment variable with a documented default, read when a
store is opened (``docs/checkpoint.md``, "Remote stores").
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any, Final, TypeVar, final

from ._errors import CheckpointStoreTimeoutError

__all__ = [
    "CONNECT_TIMEOUT_ENV",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_OPERATION_TIMEOUT",
    "DEFAULT_READ_TIMEOUT",
    "DEFAULT_RETRIES",
    "DEFAULT_SAVE_TIMEOUT",
    "OPERATION_TIMEOUT_ENV",
    "READ_TIMEOUT_ENV",
    "RETRIES_ENV",
    "SAVE_TIMEOUT_ENV",
    "RemoteBounds",
    "storage_options",
]

T = TypeVar("T")

#: Seconds to open a connection to the store (per attempt).
CONNECT_TIMEOUT_ENV: Final = "MONITORED_CHECKPOINT_CONNECT_TIMEOUT"
DEFAULT_CONNECT_TIMEOUT: Final = 10.0
#: Seconds without a byte of an answer before a request is given up (per attempt).
READ_TIMEOUT_ENV: Final = "MONITORED_CHECKPOINT_READ_TIMEOUT"
DEFAULT_READ_TIMEOUT: Final = 60.0
#: Attempts per request, the first included (botocore's ``max_attempts``).
RETRIES_ENV: Final = "MONITORED_CHECKPOINT_RETRIES"
DEFAULT_RETRIES: Final = 3
#: Seconds one store operation (a file written or read whole, a listing) may take.
OPERATION_TIMEOUT_ENV: Final = "MONITORED_CHECKPOINT_OPERATION_TIMEOUT"
DEFAULT_OPERATION_TIMEOUT: Final = 600.0
#: Seconds a whole save to a remote store may take (every file, the state file).
SAVE_TIMEOUT_ENV: Final = "MONITORED_CHECKPOINT_SAVE_TIMEOUT"
DEFAULT_SAVE_TIMEOUT: Final = 1800.0

#: The fsspec protocols whose client is botocore (s3fs).
_S3_PROTOCOLS: Final = frozenset({"s3", "s3a"})


def _seconds(env: str, default: float) -> float:
    raw = os.environ.get(env)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise ValueError(f"{env}={raw!r}: it must be a number of seconds > 0")
    return value


def _attempts(env: str, default: int) -> int:
    raw = os.environ.get(env)
    if raw is None or not raw.strip():
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{env}={raw!r}: it must be a whole number of attempts >= 1")
    return value


@final
class RemoteBounds:
    """The bounds of a remote store, read from the environment (checked)."""

    __slots__ = ("attempts", "connect", "operation", "read", "save")

    def __init__(self) -> None:
        self.connect = _seconds(CONNECT_TIMEOUT_ENV, DEFAULT_CONNECT_TIMEOUT)
        self.read = _seconds(READ_TIMEOUT_ENV, DEFAULT_READ_TIMEOUT)
        self.attempts = _attempts(RETRIES_ENV, DEFAULT_RETRIES)
        self.operation = _seconds(OPERATION_TIMEOUT_ENV, DEFAULT_OPERATION_TIMEOUT)
        self.save = _seconds(SAVE_TIMEOUT_ENV, DEFAULT_SAVE_TIMEOUT)


def storage_options(protocol: str, bounds: RemoteBounds) -> dict[str, Any]:
    """The keyword arguments that bound the client of ``protocol``'s filesystem.

    Merged under what fsspec's configuration already gives for the protocol
    (``fsspec.config.conf``, also filled from ``FSSPEC_<PROTOCOL>_*`` environment
    variables): a setting made there is kept.
    """
    if protocol not in _S3_PROTOCOLS:
        return {}
    import fsspec.config  # type: ignore[import-untyped]

    configured = fsspec.config.conf.get(protocol, {}).get("config_kwargs") or {}
    config = {
        "connect_timeout": bounds.connect,
        "read_timeout": bounds.read,
        "retries": {"max_attempts": bounds.attempts, "mode": "standard"},
        **configured,
    }
    return {"config_kwargs": config}


def call_with_deadline(func: Callable[[], T], seconds: float, describe: Callable[[], str]) -> T:
    """``func()``, or :class:`CheckpointStoreTimeoutError` once ``seconds`` have passed.

    ``func`` runs in a daemon thread, left behind if it does not end in time (a
    call blocked on a socket cannot be interrupted); ``describe()`` says what
    did not answer, for the error.
    """
    if seconds <= 0:
        raise CheckpointStoreTimeoutError(describe())
    outcome: list[tuple[bool, Any]] = []
    done = threading.Event()

    def run() -> None:
        try:
            outcome.append((True, func()))
        except BaseException as exc:  # handed to the caller, never lost
            outcome.append((False, exc))
        finally:
            done.set()

    threading.Thread(target=run, name="monitored-checkpoint store call", daemon=True).start()
    if not done.wait(seconds):
        raise CheckpointStoreTimeoutError(describe())
    ok, value = outcome[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


@final
class Deadline:
    """The end of a whole save, if one is running (``None``: operations only)."""

    __slots__ = ("at", "seconds")

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def left(self) -> float:
        return self.at - time.monotonic()
