"""``DistributedOptimizer``: any optimizer of the toolkit, with gradients averaged.

Horovod's pattern: wrap the optimizer, keep the step function as it was. The
dense gradients of a step are packed into one buffer per dtype (one dtype in
the usual model, so one fused allreduce per step), summed over the ranks and
divided by their number; ``IndexedSlices`` are gathered from every rank (rows
and indices concatenated, values divided by the number of ranks). With
``compression="fp16"`` the floating gradients travel as float16, gathered and
summed in rank order in float32, so every rank computes the same average.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal, final

import numpy as np

from monitored import IndexedSlices, TrainState
from monitored.train import Optimizer

from ._collectives import allgather
from ._host import host as host_of
from ._host import like
from ._world import World, world

__all__ = ["DistributedOptimizer"]


@final
class DistributedOptimizer:
    """Wraps ``optimizer`` so that ``apply_gradients``/``minimize`` average gradients.

    Every other attribute is the wrapped optimizer's (slots, learning rate,
    name). Alone (no ``mpiexec``), gradients pass through untouched.
    """

    __slots__ = ("_buffers", "_compression", "_optimizer", "_world")

    def __init__(
        self,
        optimizer: Optimizer,
        *,
        compression: Literal["fp16"] | None = None,
        world_: World | None = None,
    ) -> None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(
                "DistributedOptimizer wraps a monitored.train optimizer, got "
                f"{type(optimizer).__name__}"
            )
        if compression not in (None, "fp16"):
            raise ValueError(
                f"DistributedOptimizer: compression must be None or 'fp16', got {compression!r}"
            )
        self._optimizer = optimizer
        self._compression = compression
        self._world = world_
        #: Receive buffers by (dtype, size), reused from step to step by apply_gradients
        #: (a fresh 40 MB buffer per step costs its page faults every step).
        self._buffers: dict[tuple[str, int], np.ndarray[Any, Any]] = {}

    @property
    def optimizer(self) -> Optimizer:
        """The wrapped optimizer."""
        return self._optimizer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._optimizer, name)

    def __repr__(self) -> str:
        return f"DistributedOptimizer({self._optimizer!r}, compression={self._compression!r})"

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

    def _average(
        self, pairs: list[tuple[str, Any]], w: World, reuse: bool
    ) -> list[tuple[str, Any]]:
        result: dict[str, Any] = {}
        dense: dict[np.dtype[Any], list[tuple[str, Any]]] = {}
        for name, grad in pairs:
            if grad is None:
                result[name] = None
            elif isinstance(grad, IndexedSlices):
                result[name] = self._gather_sparse(name, grad, w)
            else:
                host = host_of(grad)
                wire = host.dtype
                if self._compression == "fp16" and host.dtype.kind == "f":
                    wire = np.dtype(np.float16)
                dense.setdefault(wire, []).append((name, grad))
        for wire, group in dense.items():
            result.update(self._reduce_dense(wire, group, w, reuse))
        return [(name, result[name]) for name, _ in pairs]

    def _reduce_dense(
        self, wire: np.dtype[Any], group: list[tuple[str, Any]], w: World, reuse: bool
    ) -> dict[str, Any]:
        hosts = [host_of(grad) for _, grad in group]
        flat = [h.reshape(-1).astype(wire, copy=False) for h in hosts]
        packed = flat[0] if len(flat) == 1 else np.concatenate(flat)
        names = [name for name, _ in group]
        what = f"allreduce of the gradients of {names[:3]}{'...' if len(names) > 3 else ''}"
        if wire == np.float16 and self._compression == "fp16":
            gathered = np.empty((w.size, packed.size), dtype=np.float16)
            w.wait(w.comm.Iallgather(packed, gathered), what + " (fp16)")
            total = gathered[0].astype(np.float32)
            for row in gathered[1:]:
                total += row
        else:
            key = (packed.dtype.str, packed.size)
            total = self._buffers.get(key) if reuse else None
            if total is None:
                total = np.empty_like(packed)
                if reuse:
                    self._buffers[key] = total
            w.wait(w.comm.Iallreduce(packed, total, op=w.MPI.SUM), what)
        out: dict[str, Any] = {}
        start = 0
        for (name, grad), host in zip(group, hosts, strict=True):
            part = total[start : start + host.size].reshape(host.shape)
            part = part.astype(host.dtype, copy=False)
            start += host.size
            part /= host.dtype.type(w.size) if host.dtype.kind in "fc" else w.size
            out[name] = like(part, grad)
        return out

    def _gather_sparse(self, name: str, grad: IndexedSlices, w: World) -> IndexedSlices:
        values = allgather(grad.values, name=f"gradient rows of {name!r}", world_=w)
        indices = allgather(grad.indices, name=f"gradient indices of {name!r}", world_=w)
        host_values = np.concatenate([host_of(v) for v in values])
        host_values /= host_values.dtype.type(w.size)
        host_indices = np.concatenate([host_of(i) for i in indices])
        return IndexedSlices(
            like(host_values, grad.values), like(host_indices, grad.indices), grad.dense_shape
        )
