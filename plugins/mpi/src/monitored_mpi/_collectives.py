"""Collectives for users' own steps: ``allreduce``, ``broadcast``, ``allgather``.

NumPy or CuPy arrays in, the same kind out (CuPy goes through host memory
here). In a process that runs alone each is what one rank of one would get:
``allreduce`` returns a copy, ``allgather`` a list of one. Every collective
waits with the world's deadline and names itself when it times out.

MPI itself does not check that the ranks pass arrays of the same dtype and
size: a mismatch gives garbage or a crash. So each collective first compares a
checksum of what every rank passes (folded into ``allgather``'s exchange of
row counts, one tiny extra collective for ``allreduce`` and ``broadcast``) and
raises :class:`CollectiveMismatchError` naming the ranks and what they passed.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from monitored import is_device_array
from monitored.metrics import Metric

from ._errors import CollectiveMismatchError
from ._host import host as host_of
from ._world import World, world

__all__ = [
    "allgather",
    "allreduce",
    "broadcast",
    "check_same",
    "exchange_bytes",
    "merge_metrics",
    "mismatch",
    "signature",
]

ReduceOp = Literal["mean", "sum", "min", "max"]


def _as_host(array: Any, what: str) -> tuple[np.ndarray[Any, Any], bool]:
    device = is_device_array(array)
    host = host_of(array) if device else array
    if isinstance(host, np.generic):
        host = np.asarray(host)
    if not isinstance(host, np.ndarray):
        raise TypeError(f"{what}: expected a NumPy or CuPy array, got {type(array).__name__}")
    # (np.ascontiguousarray would turn a 0-d array into a 1-d one.)
    return (host if host.flags.c_contiguous else host.copy(order="C")), device


def signature(text: str) -> tuple[int, int]:
    """A checksum and the length of ``text``: equal on two ranks when their texts are."""
    raw = text.encode()
    return zlib.crc32(raw), len(raw)


def mismatch(
    signatures: np.ndarray[Any, Any], text: str, what: str, w: World, *, comm: Any = None
) -> list[str] | None:
    """Every rank's ``text`` when the ``signatures`` (one row per rank) differ, else None.

    All ranks see the same ``signatures``, so all of them take the same branch
    and join the exchange of the texts, which happens only when they differ (on
    ``comm``, ``w.comm`` unless given).
    """
    if (signatures == signatures[0]).all():
        return None
    channel = w.comm if comm is None else comm
    raw = exchange_bytes(text.encode(), f"{what} (comparing the ranks)", w, comm=channel)
    return [r.decode() for r in raw]


def _describe(host: np.ndarray[Any, Any]) -> str:
    return f"{host.dtype} {host.shape}"


def _refuse(what: str, texts: list[str], needed: str) -> CollectiveMismatchError:
    lines = [f"rank {rank}: {text}" for rank, text in enumerate(texts)]
    return CollectiveMismatchError(
        f"{what}: the ranks pass different arrays; every rank must pass {needed}:\n  "
        + "\n  ".join(lines)
    )


def check_same(text: str, what: str, needed: str, w: World) -> None:
    """Raise :class:`CollectiveMismatchError` unless every rank passes the same ``text``.

    One allgather of 16 bytes per rank (on ``w.comm``, where the collective
    being checked runs, so the two stay in order).
    """
    mine = np.array(signature(text), dtype=np.int64)
    signatures = np.empty((w.size, 2), dtype=np.int64)
    w.wait(w.comm.Iallgather(mine, signatures), f"{what} (dtypes and shapes)")
    texts = mismatch(signatures, text, what, w)
    if texts is not None:
        raise _refuse(what, texts, needed)


def _like(host: np.ndarray[Any, Any], device: bool) -> Any:
    if not device:
        return host
    import cupy

    return cupy.asarray(host)


def allreduce(
    array: Any, op: ReduceOp = "mean", *, name: str = "allreduce", world_: World | None = None
) -> Any:
    """``op`` of ``array`` over all ranks (``"mean"``, ``"sum"``, ``"min"``, ``"max"``)."""
    if op not in ("mean", "sum", "min", "max"):
        raise ValueError(f"allreduce {name!r}: op must be mean, sum, min or max, got {op!r}")
    host, device = _as_host(array, f"allreduce {name!r}")
    w = world_ if world_ is not None else world()
    if w is None:
        return _like(host.copy(), device)
    MPI = w.MPI
    mpi_op = {"mean": MPI.SUM, "sum": MPI.SUM, "min": MPI.MIN, "max": MPI.MAX}[op]
    what = f"allreduce {name!r}"
    check_same(_describe(host), what, "the same dtype and shape", w)
    out = np.empty_like(host)
    w.wait(w.comm.Iallreduce(host, out, op=mpi_op), f"{what} of {host.shape}")
    if op == "mean":
        out /= out.dtype.type(w.size) if out.dtype.kind in "fc" else w.size
    return _like(out, device)


def broadcast(
    array: Any, root: int = 0, *, name: str = "broadcast", world_: World | None = None
) -> Any:
    """``array`` as rank ``root`` has it, on every rank (same shape and dtype everywhere)."""
    host, device = _as_host(array, f"broadcast {name!r}")
    w = world_ if world_ is not None else world()
    if w is None:
        return _like(host.copy(), device)
    if not 0 <= root < w.size:
        raise ValueError(f"broadcast {name!r}: root {root} is not a rank (0..{w.size - 1})")
    check_same(_describe(host), f"broadcast {name!r}", "the same dtype and shape", w)
    out = host.copy()
    w.wait(w.comm.Ibcast(out, root=root), f"broadcast {name!r} from rank {root}")
    return _like(out, device)


def allgather(array: Any, *, name: str = "allgather", world_: World | None = None) -> list[Any]:
    """Every rank's ``array``, in rank order (the first axis may differ between ranks)."""
    host, device = _as_host(array, f"allgather {name!r}")
    w = world_ if world_ is not None else world()
    if w is None:
        return [_like(host.copy(), device)]
    scalar = host.ndim == 0
    rows = host.reshape(1) if scalar else host
    row_shape = rows.shape[1:]
    # The row counts travel with a signature of what may not differ between ranks.
    text = f"a scalar {rows.dtype}" if scalar else f"{rows.dtype} rows of shape {row_shape}"
    exchanged = np.empty((w.size, 3), dtype=np.int64)
    mine = np.array([rows.shape[0], *signature(text)], dtype=np.int64)
    w.wait(w.comm.Iallgather(mine, exchanged), f"allgather {name!r} (sizes)")
    texts = mismatch(exchanged[:, 1:], text, f"allgather {name!r}", w)
    if texts is not None:
        raise _refuse(
            f"allgather {name!r}", texts, "the same dtype and the same shape after the first axis"
        )
    counts = exchanged[:, 0].copy()
    per_row = int(np.prod(row_shape, dtype=np.int64))
    sizes = counts * per_row
    flat = np.empty(int(sizes.sum()), dtype=rows.dtype)
    w.wait(
        w.comm.Iallgatherv(rows.reshape(-1), [flat, sizes]), f"allgather {name!r} of {rows.dtype}"
    )
    parts: list[Any] = []
    start = 0
    for count in counts.tolist():
        part = flat[start : start + count * per_row].reshape((count, *row_shape))
        parts.append(_like(part.reshape(()) if scalar else part, device))
        start += count * per_row
    return parts


def exchange_bytes(
    payload: bytes, what: str, world_: World, timeout: float | None = None, *, comm: Any = None
) -> list[bytes]:
    """Every rank's ``payload``, in rank order, over ``comm`` (the session's control
    channel unless given)."""
    w = world_
    channel = w.control if comm is None else comm
    mine = np.array([len(payload)], dtype=np.int64)
    lengths = np.empty(w.size, dtype=np.int64)
    w.wait(channel.Iallgather(mine, lengths), f"{what} (sizes)", timeout)
    data = np.empty(int(lengths.sum()), dtype=np.uint8)
    w.wait(
        channel.Iallgatherv(np.frombuffer(payload, dtype=np.uint8), [data, lengths]),
        what,
        timeout,
    )
    out, start = [], 0
    for length in lengths.tolist():
        out.append(data[start : start + length].tobytes())
        start += length
    return out


def merge_metrics(metrics: Sequence[Metric], *, world_: World | None = None) -> None:
    """Merge each metric with the same metric of every other rank, in place.

    After the call every rank holds, for each metric, the result over all ranks'
    batches: the accumulators of all ranks are gathered in one collective and
    summed in rank order, so every rank computes bitwise the same values.
    """
    w = world_ if world_ is not None else world()
    if w is None or not metrics:
        return
    layout: list[tuple[int, str, tuple[int, ...]]] = []
    pieces: list[np.ndarray[Any, Any]] = []
    for i, metric in enumerate(metrics):
        pieces.append(np.array([metric.updates], dtype=np.float64))
        for key, value in sorted(metric.arrays.items()):
            host = np.asarray(host_of(value), dtype=np.float64)
            layout.append((i, key, host.shape))
            pieces.append(host.reshape(-1))
    packed = np.concatenate(pieces)
    what = f"merge_metrics of {[m.name for m in metrics]}"
    described = repr([(m.kind, m.name, m.config()) for m in metrics] + layout).encode()
    signature = np.array([packed.size, zlib.crc32(described)], dtype=np.int64)
    signatures = np.empty((w.size, 2), dtype=np.int64)
    w.wait(w.comm.Iallgather(signature, signatures), f"{what} (layouts)")
    differ = [rank for rank in range(w.size) if (signatures[rank] != signatures[0]).any()]
    if differ:
        raise CollectiveMismatchError(
            f"{what}: ranks {differ} hold other metrics (kinds, names, configurations or "
            "shapes) than rank 0; every rank must merge the same metrics in the same order"
        )
    gathered = np.empty((w.size, packed.size), dtype=np.float64)
    w.wait(w.comm.Iallgather(packed, gathered), what)
    for metric in metrics:
        metric.reset()
    for rank in range(w.size):
        row, offset = gathered[rank], 0
        for i, metric in enumerate(metrics):
            state = metric.state()
            state["updates"] = int(row[offset])
            offset += 1
            arrays = {}
            for owner, key, shape in layout:
                if owner != i:
                    continue
                size = int(np.prod(shape, dtype=np.int64))
                arrays[key] = row[offset : offset + size].reshape(shape).copy()
                offset += size
            state["arrays"] = arrays
            metric.merge(type(metric).from_state(state))
