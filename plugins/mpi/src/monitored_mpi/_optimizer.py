"""``DistributedOptimizer``: any optimizer of the toolkit, with gradients averaged.

Horovod's pattern: wrap the optimizer, keep the step function as it was. The
dense gradients of a step are packed into one buffer per dtype (one dtype in
the usual model, so one fused reduction per step), summed over the ranks and
divided by their number (from 1 MiB on, as a reduce-scatter, each rank
dividing its own block, and an allgather); ``IndexedSlices`` are gathered from every rank (rows
and indices concatenated, values divided by the number of ranks). With
``compression="fp16"`` the floating gradients travel as float16, gathered and
summed in rank order in float32, so every rank computes the same average.

Before the gradients travel, the ranks compare a checksum of their layout (the
variables' names, order, dtypes and shapes, which gradients are sparse or
``None``), one allgather of 16 bytes per step: ranks that pass different
variables would otherwise exchange buffers of different sizes, which MPI turns
into garbage. The checksum is computed again only when this rank's layout
changes; the comparison runs every step, since a layout may change on one rank
only (a gradient that is ``None`` there), and a check run on some ranks only
would itself be a collective called by some ranks only.

The comparison costs no round trip of its own: while this rank's layout is
the one every rank passed last time, it is posted together with the first
reduction and read before any reduced value is used. A layout new on this
rank is compared first, before any gradient travels (buffers of other sizes
in one collective would make MPICH abort); ranks that kept the old layout
have then posted its first reduction already, which the others join with
zeros before every rank raises :class:`CollectiveMismatchError`, so no
collective is left unmatched.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final, Literal, final

import numpy as np

from monitored import IndexedSlices, TrainState, UnsupportedArgumentError
from monitored.train import Optimizer

from ._collectives import allgather, mismatch, signature
from ._errors import CollectiveMismatchError
from ._host import host as host_of
from ._host import like
from ._world import World, world

__all__ = ["DistributedOptimizer"]

#: Packed gradients of at least this many bytes are averaged by reduce-scatter,
#: division of each rank's block, allgather; smaller ones by one allreduce and a
#: division (two collectives cost more latency than the division they save).
SCATTER_BYTES: Final = 1 << 20


#: Horovod's ``DistributedOptimizer`` arguments that have no meaning here, and why.
HOROVOD_ARGUMENTS: Final = {
    "name": "there is no graph to name ops in; drop it",
    "use_locking": "there are no graph variables to lock; drop it",
    "device_dense": "arrays stay where they are (NumPy on the host, CuPy on its device); drop it",
    "device_sparse": "arrays stay where they are (NumPy on the host, CuPy on its device); drop it",
    "sparse_as_dense": (
        "IndexedSlices gradients are gathered from every rank (rows and indices), as "
        "Horovod's default did; to average one densely, pass a dense gradient; drop it"
    ),
    "backward_passes_per_step": (
        "not supported: add up the gradients of several batches in your step and call "
        "apply_gradients once"
    ),
    "average_aggregated_gradients": (
        "not supported: add up the gradients of several batches in your step and call "
        "apply_gradients once"
    ),
    "num_groups": (
        "every dense gradient of one dtype is already fused into one reduction per step; drop it"
    ),
    "groups": (
        "every dense gradient of one dtype is already fused into one reduction per step; drop it"
    ),
    "process_set": "every rank of the job takes part; drop it",
    "scale_local_gradients": "there are no local (rank-only) variables here; drop it",
}


@final
class DistributedOptimizer:
    """Wraps ``optimizer`` so that ``apply_gradients``/``minimize`` average gradients.

    Every other attribute is the wrapped optimizer's (slots, learning rate,
    name). Alone (no ``mpiexec``), gradients pass through untouched.

    Args:
        optimizer: a ``monitored.train`` optimizer.
        compression: ``None`` or ``"fp16"`` (Horovod's ``Compression.fp16``:
            ``monitored_mpi.Compression.fp16``).
        op: ``"mean"`` (the average, Horovod's ``op=hvd.Average``:
            ``monitored_mpi.Average``) or ``"sum"`` (``monitored_mpi.Sum``).
        gradient_predivide_factor: Horovod's split of the averaging around the
            sum; only its default ``1.0`` is accepted (see below).

    Horovod's other arguments (``name``, ``device_dense``, ``sparse_as_dense``,
    ``backward_passes_per_step``, ...) are refused with what to do instead
    (:class:`~monitored.UnsupportedArgumentError`).
    """

    __slots__ = (
        "_buffers",
        "_compression",
        "_first",
        "_layout",
        "_layout_signature",
        "_layout_text",
        "_mean",
        "_optimizer",
        "_world",
    )

    def __init__(
        self,
        optimizer: Optimizer,
        *,
        compression: Literal["fp16"] | None = None,
        op: Literal["mean", "sum"] = "mean",
        gradient_predivide_factor: float = 1.0,
        world_: World | None = None,
        **horovod: Any,
    ) -> None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(
                "DistributedOptimizer wraps a monitored.train optimizer, got "
                f"{type(optimizer).__name__}"
            )
        for argument in horovod:
            why = HOROVOD_ARGUMENTS.get(argument)
            if why is None:
                raise TypeError(
                    f"DistributedOptimizer() got an unexpected keyword argument {argument!r}"
                )
            raise UnsupportedArgumentError(f"DistributedOptimizer({argument}=...): {why}")
        if compression not in (None, "fp16"):
            raise ValueError(
                f"DistributedOptimizer: compression must be None or 'fp16' "
                f"(monitored_mpi.Compression.none or .fp16), got {compression!r}"
            )
        if op not in ("mean", "sum"):
            raise ValueError(
                f"DistributedOptimizer: op must be 'mean' (monitored_mpi.Average) or 'sum' "
                f"(monitored_mpi.Sum), got {op!r}; Horovod's Adasum is not supported"
            )
        if gradient_predivide_factor != 1.0:
            raise UnsupportedArgumentError(
                f"DistributedOptimizer(gradient_predivide_factor={gradient_predivide_factor!r})"
                ": not needed here. Horovod divides before the sum to keep float16 sums from "
                "overflowing; here compression='fp16' gradients are summed in float32 and "
                "other dtypes in their own, then divided once by the number of ranks: drop it"
            )
        self._optimizer = optimizer
        self._compression = compression
        self._mean = op == "mean"
        self._world = world_
        #: Receive buffers by (role, dtype, size), reused from step to step by apply_gradients
        #: (a fresh 40 MB buffer per step costs its page faults every step).
        self._buffers: dict[tuple[str, str, int], np.ndarray[Any, Any]] = {}
        #: The layout of the last call's gradients, its text and that text's signature.
        self._layout: tuple[tuple[Any, ...], ...] | None = None
        self._layout_text = ""
        self._layout_signature = np.zeros(2, dtype=np.int64)
        #: The first collective the last call posted before its layout check was
        #: read (kind, wire dtype, elements), or None: what ranks whose layout did
        #: not change post first, and others join on a mismatch.
        self._first: tuple[str, np.dtype[Any], int] | None = None

    @property
    def optimizer(self) -> Optimizer:
        """The wrapped optimizer."""
        return self._optimizer

    def __getattr__(self, name: str) -> Any:
        try:
            return getattr(self._optimizer, name)
        except AttributeError:
            hint = (
                ": TF's SyncReplicasOptimizer has it; monitored_mpi.SyncReplicasOptimizer "
                "maps it onto this optimizer"
                if name in ("make_session_run_hook", "get_chief_queue_runner")
                else ""
            )
            raise AttributeError(
                f"DistributedOptimizer (wrapping {type(self._optimizer).__name__}) has no "
                f"attribute {name!r}{hint}"
            ) from None

    def __repr__(self) -> str:
        op = "mean" if self._mean else "sum"
        return (
            f"DistributedOptimizer({self._optimizer!r}, compression={self._compression!r}, "
            f"op={op!r})"
        )

    def compute_gradients(
        self, state: TrainState, fn: Any, var_list: Iterable[str] | None = None
    ) -> tuple[Any, list[tuple[Any, str]]]:
        """The wrapped optimizer's: this rank's own (not yet averaged) gradients."""
        return self._optimizer.compute_gradients(state, fn, var_list)

    def apply_gradients(
        self,
        state: TrainState,
        grads_and_vars: Mapping[str, Any] | Iterable[tuple[Any, str]],
        global_step: bool = True,
        *,
        learning_rate: float | None = None,
    ) -> None:
        """Average the gradients over the ranks, then apply them (the wrapped optimizer's)."""
        self._optimizer.apply_gradients(
            state,
            self.reduce_gradients(grads_and_vars, reuse_buffers=True),
            global_step=global_step,
            learning_rate=learning_rate,
        )

    def minimize(
        self,
        state: TrainState,
        fn: Any,
        var_list: Iterable[str] | None = None,
        global_step: bool = True,
        *,
        learning_rate: float | None = None,
    ) -> Any:
        """``compute_gradients``, the average over ranks, ``apply_gradients``; the local loss."""
        loss, pairs = self.compute_gradients(state, fn, var_list)
        self.apply_gradients(state, pairs, global_step=global_step, learning_rate=learning_rate)
        return loss

    def reduce_gradients(
        self,
        grads_and_vars: Mapping[str, Any] | Iterable[tuple[Any, str]],
        *,
        reuse_buffers: bool = False,
    ) -> Any:
        """The gradients averaged over all ranks, in the form given (mapping or pairs).

        ``reuse_buffers=True`` (what ``apply_gradients`` does) returns dense
        gradients that are views of buffers kept for the next call: no allocation
        per step, and valid only until the next call.
        """
        w = self._world if self._world is not None else world()
        if w is None:
            return grads_and_vars
        if isinstance(grads_and_vars, Mapping):
            averaged = self._average(list(grads_and_vars.items()), w, reuse_buffers)
            return dict(averaged)
        pairs = [(name, grad) for grad, name in grads_and_vars]
        return [(grad, name) for name, grad in self._average(pairs, w, reuse_buffers)]

    def _start_layout_check(self, pairs: list[tuple[str, Any]], w: World) -> _LayoutCheck:
        """Post the comparison of this rank's layout with every rank's.

        Not waited for when the layout is the one every rank passed last time
        (the comparison then travels with the reduction); waited for at once
        when it is new here.
        """
        layout = tuple(_layout_entry(name, grad) for name, grad in pairs)
        agreed = self._layout_signature if self._layout is not None else None
        first, self._first = self._first, None
        if layout == self._layout:
            return _LayoutCheck(self._layout_signature, self._layout_text, w, agreed, first)
        # A new layout (the first call, or one that changed here): compared before
        # any gradient travels. Posted together, buffers of another size than the
        # other ranks' would be a malformed collective (MPICH aborts on it). The
        # ranks whose layout did not change have posted the first reduction of
        # the layout agreed last time: on a mismatch this rank joins it with zeros
        # (``first``), so that no collective is left unmatched.
        text = "\n".join(f"{entry[0]}\t{_show_entry(entry)}" for entry in layout)
        op = "mean" if self._mean else "sum"
        text = f"compression {self._compression}, op {op}\n{text}"
        mine = np.array(signature(text), dtype=np.int64)
        check = _LayoutCheck(mine, text, w, agreed, first)
        check.finish()
        self._layout, self._layout_text, self._layout_signature = layout, text, mine
        return check

    def _average(
        self, pairs: list[tuple[str, Any]], w: World, reuse: bool
    ) -> list[tuple[str, Any]]:
        # The layout comparison and the first reduction travel together: both are
        # posted before either is waited for, so a step costs one network round
        # trip, and the comparison is read before any reduced value is used.
        check = self._start_layout_check(pairs, w)
        result: dict[str, Any] = {}
        dense: dict[np.dtype[Any], list[tuple[str, Any]]] = {}
        sparse = False
        for name, grad in pairs:
            if grad is None:
                result[name] = None
            elif isinstance(grad, IndexedSlices):
                sparse = True
            else:
                host = host_of(grad)
                wire = host.dtype
                if self._compression == "fp16" and host.dtype.kind == "f":
                    wire = np.dtype(np.float16)
                dense.setdefault(wire, []).append((name, grad))
        if sparse or not dense:
            check.ahead = False
            check.finish()
        for wire, group in dense.items():
            result.update(self._reduce_dense(wire, group, w, reuse, check))
        for name, grad in pairs:
            if isinstance(grad, IndexedSlices):
                result[name] = self._gather_sparse(name, grad, w)
        return [(name, result[name]) for name, _ in pairs]

    def _reduce_dense(
        self,
        wire: np.dtype[Any],
        group: list[tuple[str, Any]],
        w: World,
        reuse: bool,
        check: _LayoutCheck,
    ) -> dict[str, Any]:
        hosts = [host_of(grad) for _, grad in group]
        flat = [h.reshape(-1).astype(wire, copy=False) for h in hosts]
        packed = flat[0] if len(flat) == 1 else np.concatenate(flat)
        names = [name for name, _ in group]
        what = f"averaging the gradients of {names[:3]}{'...' if len(names) > 3 else ''}"
        if wire == np.float16 and self._compression == "fp16":
            gathered = np.empty((w.size, packed.size), dtype=np.float16)
            request = w.comm.Iallgather(packed, gathered)
            self._posted(check, "fp16", wire, packed.size)
            check.finish(request)
            w.wait(request, what + " (fp16)")
            total = gathered[0].astype(np.float32)
            for row in gathered[1:]:
                total += row
            averaged = False
        else:
            total = self._buffer(packed.dtype, packed.size, reuse)
            averaged = self._mean and packed.nbytes >= SCATTER_BYTES
            if averaged:
                self._reduce_scatter_average(packed, total, w, what, reuse, check)
            else:
                request = w.comm.Iallreduce(packed, total, op=w.MPI.SUM)
                self._posted(check, "allreduce", wire, packed.size)
                check.finish(request)
                w.wait(request, what)
        out: dict[str, Any] = {}
        start = 0
        for (name, grad), host in zip(group, hosts, strict=True):
            part = total[start : start + host.size].reshape(host.shape)
            part = part.astype(host.dtype, copy=False)
            start += host.size
            if not averaged and self._mean:
                _divide(part, w.size)
            out[name] = like(part, grad)
        return out

    def _posted(self, check: _LayoutCheck, kind: str, wire: np.dtype[Any], size: int) -> None:
        """Note the collective just posted when it is the first of a layout that posts
        it ahead of reading the check (dense gradients only)."""
        if check.ahead:
            check.ahead = False
            self._first = (kind, wire, size)

    def _buffer(
        self, dtype: np.dtype[Any], size: int, reuse: bool, role: str = "sum"
    ) -> np.ndarray[Any, Any]:
        """An uninitialized array, kept for the next call when ``reuse``.

        ``role`` keeps apart buffers of the same dtype and size used in one
        call (with one rank, its block is the whole sum: MPI refuses aliases).
        """
        key = (role, dtype.str, size)
        buffer = self._buffers.get(key) if reuse else None
        if buffer is None:
            buffer = np.empty(size, dtype=dtype)
            if reuse:
                self._buffers[key] = buffer
        return buffer

    def _reduce_scatter_average(
        self,
        packed: np.ndarray[Any, Any],
        total: np.ndarray[Any, Any],
        w: World,
        what: str,
        reuse: bool,
        check: _LayoutCheck,
    ) -> None:
        """``total`` = the average of ``packed`` over the ranks, for large buffers.

        Each rank sums one block of the buffer (reduce-scatter), divides only
        that block, and the blocks are gathered back to every rank: the same
        traffic as an allreduce's large-message algorithm, a division over
        ``1/size`` of the buffer instead of all of it, and every rank receives
        the same bits. Measured faster than MPICH's own ``Allreduce`` of the
        buffer (docs/performance.md).
        """
        counts, displacements = _blocks(packed.size, w.size)
        mine = self._buffer(packed.dtype, counts[w.rank], reuse, role="block")
        request = w.comm.Ireduce_scatter(packed, mine, counts, op=w.MPI.SUM)
        self._posted(check, "scatter", packed.dtype, packed.size)
        check.finish(request)
        w.wait(request, what + " (reduce-scatter)")
        _divide(mine, w.size)
        w.wait(w.comm.Iallgatherv(mine, [total, (counts, displacements)]), what + " (allgather)")

    def _gather_sparse(self, name: str, grad: IndexedSlices, w: World) -> IndexedSlices:
        values = allgather(grad.values, name=f"gradient rows of {name!r}", world_=w)
        indices = allgather(grad.indices, name=f"gradient indices of {name!r}", world_=w)
        host_values = np.concatenate([host_of(v) for v in values])
        if self._mean:
            host_values /= host_values.dtype.type(w.size)
        host_indices = np.concatenate([host_of(i) for i in indices])
        return IndexedSlices(
            like(host_values, grad.values), like(host_indices, grad.indices), grad.dense_shape
        )


@final
class _LayoutCheck:
    """The comparison of the ranks' gradient layouts, posted and not yet waited for.

    :meth:`finish` waits for it and raises :class:`CollectiveMismatchError`
    naming each rank and variable that differs; only the first call waits.
    ``agreed`` is the signature every rank passed last time (None on the
    first call) and ``first`` the first collective of that layout, which the
    ranks that still pass it post before the check is read.
    """

    __slots__ = ("_agreed", "_first", "_request", "_signatures", "_text", "_world", "ahead")

    def __init__(
        self,
        mine: np.ndarray[Any, Any],
        text: str,
        w: World,
        agreed: np.ndarray[Any, Any] | None,
        first: tuple[str, np.dtype[Any], int] | None,
    ) -> None:
        self._signatures = np.empty((w.size, 2), dtype=np.int64)
        self._request: Any = w.comm.Iallgather(mine, self._signatures)
        self._text = text
        self._world = w
        self._agreed = agreed
        self._first = first
        #: Until the first reduction is posted: whether it goes ahead of the check
        #: (no sparse gradients, some dense ones).
        self.ahead = True

    def finish(self, posted: Any = None) -> None:
        """Read the comparison; ``posted``: the reduction this rank posted before it."""
        if self._request is None:
            return
        w, request, self._request = self._world, self._request, None
        what = "DistributedOptimizer: comparing the gradients' layouts"
        w.wait(request, what)
        if (self._signatures == self._signatures[0]).all():
            return
        self._complete_first(posted, what)
        texts = mismatch(self._signatures, self._text, what, w, comm=w.control)
        if texts is not None:
            lines = [
                f"rank {rank}: {problem}"
                for rank, text in enumerate(texts)
                for problem in _layout_problems(texts[0], text)
            ]
            raise CollectiveMismatchError(
                "DistributedOptimizer: the ranks pass different gradients; every rank must "
                "pass the same variables in the same order, with the same dtypes and shapes "
                "(and the same compression and op):\n  " + "\n  ".join(lines)
            )

    def _complete_first(self, posted: Any, what: str) -> None:
        """On a mismatch, complete the reduction the ranks that kept the agreed layout
        posted: the others join it with zeros, so the channel stays usable."""
        if self._agreed is None or self._first is None:
            return
        w = self._world
        kept = (self._signatures == self._agreed).all(axis=1)
        if not kept.any():
            return
        if kept[w.rank]:
            request = posted
        else:
            kind, wire, size = self._first
            zeros = np.zeros(size, dtype=wire)
            if kind == "allreduce":
                out = np.empty_like(zeros)
                request = w.comm.Iallreduce(zeros, out, op=w.MPI.SUM)
            elif kind == "scatter":
                counts, _ = _blocks(size, w.size)
                out = np.empty(counts[w.rank], dtype=wire)
                request = w.comm.Ireduce_scatter(zeros, out, counts, op=w.MPI.SUM)
            else:  # "fp16"
                out = np.empty((w.size, size), dtype=wire)
                request = w.comm.Iallgather(zeros, out)
        if request is not None:
            w.wait(request, f"{what} (the reduction of the ranks that kept their layout)")


def _blocks(size: int, parts: int) -> tuple[list[int], list[int]]:
    """Counts and offsets of ``parts`` contiguous blocks covering ``size`` elements."""
    base, extra = divmod(size, parts)
    counts = [base + (1 if i < extra else 0) for i in range(parts)]
    offsets = [0] * parts
    for i in range(1, parts):
        offsets[i] = offsets[i - 1] + counts[i - 1]
    return counts, offsets


def _divide(values: np.ndarray[Any, Any], ranks: int) -> None:
    """``values`` (a sum over ``ranks``) divided in place by their number."""
    values /= values.dtype.type(ranks) if values.dtype.kind in "fc" else ranks


def _layout_entry(name: str, grad: Any) -> tuple[Any, ...]:
    """What must agree between ranks about the gradient of ``name``.

    Dtype objects, not their names: ``str(dtype)`` costs microseconds, and this
    runs for every variable at every step.
    """
    if grad is None:
        return (name, None)
    if isinstance(grad, IndexedSlices):
        values = grad.values
        return (name, "sparse", values.dtype, values.shape[1:], grad.dense_shape)
    if not (hasattr(grad, "dtype") and hasattr(grad, "shape")):
        grad = np.asarray(grad)
    return (name, grad.dtype, grad.shape)


def _show_entry(entry: tuple[Any, ...]) -> str:
    if entry[1] is None:
        return "no gradient (None)"
    if isinstance(entry[1], str):  # "sparse"
        _, _, dtype, row_shape, dense_shape = entry
        return f"sparse {dtype} rows of shape {tuple(row_shape)} of {tuple(dense_shape)}"
    return f"{entry[1]} {tuple(entry[2])}"


def _layout_problems(chief: str, mine: str) -> list[str]:
    """How the layout text ``mine`` differs from rank 0's ``chief``, naming the variables."""
    if mine == chief:
        return []
    chief_setting, *chief_lines = chief.split("\n")
    my_setting, *my_lines = mine.split("\n")
    theirs = dict(line.split("\t", 1) for line in chief_lines if line)
    ours = dict(line.split("\t", 1) for line in my_lines if line)
    problems = [f"{my_setting} here, {chief_setting} on rank 0"] * (my_setting != chief_setting)
    problems += [
        f"no gradient for {name!r} here (rank 0 passes one)"
        for name in sorted(theirs.keys() - ours.keys())
    ]
    problems += [
        f"a gradient for {name!r}, which rank 0 does not pass"
        for name in sorted(ours.keys() - theirs.keys())
    ]
    problems += [
        f"{name!r}: {desc} here, {theirs[name]} on rank 0"
        for name, desc in ours.items()
        if name in theirs and theirs[name] != desc
    ]
    if not problems:
        problems.append(
            f"the variables in the order {list(ours)}, rank 0 in the order {list(theirs)}"
        )
    return problems
