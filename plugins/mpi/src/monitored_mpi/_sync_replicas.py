"""``SyncReplicasOptimizer``: TF's synchronous replicas, as MPI data parallelism.

TF's ``SyncReplicasOptimizer(opt, replicas_to_aggregate, total_num_replicas)``
had the chief collect ``replicas_to_aggregate`` gradients per step from
workers through parameter-server queues, average them and apply them once;
``total_num_replicas > replicas_to_aggregate`` made the slowest workers
*backups* whose gradients were dropped. Here every rank computes a gradient
on its own batch, the gradients are averaged over all ranks in one collective
(:class:`DistributedOptimizer`) and every rank applies the same update: TF's
mode with ``replicas_to_aggregate == total_num_replicas ==`` the number of
ranks. Backup workers, and more gradients per step than ranks, have no
counterpart and are refused with what to do instead; the number of ranks is
checked against ``replicas_to_aggregate`` when the session begins.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, final

from monitored import MonitoredSession, TrainState, UnsupportedArgumentError
from monitored.train import Optimizer

from ._optimizer import DistributedOptimizer
from ._world import world

__all__ = ["SyncReplicasOptimizer"]


def _count(what: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"SyncReplicasOptimizer({what}={value!r}): a whole number > 0")
    return value


@final
class SyncReplicasOptimizer:
    """``opt`` with its gradients averaged over ``replicas_to_aggregate`` ranks each step.

    ``mpiexec -n N python train.py`` with ``replicas_to_aggregate=N``: each
    rank's step computes the gradients of its own batch; ``apply_gradients``
    (or ``minimize``) averages them over the ranks and applies the average on
    every rank, so every rank holds the same variables, and the global step
    counts steps of the whole job (one per averaged update), as TF's did.
    ``make_session_run_hook(is_chief)`` gives the hook TF's scripts pass to
    ``MonitoredTrainingSession``; here it checks the number of ranks.
    """

    __slots__ = ("_distributed", "replicas_to_aggregate", "total_num_replicas")

    def __init__(
        self,
        opt: Optimizer,
        replicas_to_aggregate: int,
        total_num_replicas: int | None = None,
        variable_averages: Any = None,
        variables_to_average: Any = None,
        use_locking: bool = False,
        name: str = "sync_replicas",
    ) -> None:
        self.replicas_to_aggregate = _count("replicas_to_aggregate", replicas_to_aggregate)
        self.total_num_replicas = (
            self.replicas_to_aggregate
            if total_num_replicas is None
            else _count("total_num_replicas", total_num_replicas)
        )
        if self.total_num_replicas > self.replicas_to_aggregate:
            raise UnsupportedArgumentError(
                f"SyncReplicasOptimizer(replicas_to_aggregate={self.replicas_to_aggregate}, "
                f"total_num_replicas={self.total_num_replicas}): backup workers have no "
                "counterpart here: every rank's gradient is averaged every step. Launch "
                f"{self.replicas_to_aggregate} ranks and drop total_num_replicas"
            )
        if self.total_num_replicas < self.replicas_to_aggregate:
            raise UnsupportedArgumentError(
                f"SyncReplicasOptimizer(replicas_to_aggregate={self.replicas_to_aggregate}, "
                f"total_num_replicas={self.total_num_replicas}): more gradients per step than "
                "ranks is not supported; launch replicas_to_aggregate ranks, or add up the "
                "gradients of several batches in your step before apply_gradients"
            )
        if variable_averages is not None or variables_to_average is not None:
            raise UnsupportedArgumentError(
                "SyncReplicasOptimizer(variable_averages=...): apply a "
                "monitored.train.ExponentialMovingAverage after apply_gradients in your step "
                "instead (every rank holds the same variables, so its averages agree)"
            )
        if use_locking:
            raise UnsupportedArgumentError(
                "SyncReplicasOptimizer(use_locking=True): there are no shared variables to lock"
            )
        del name  # TF named its graph ops with it
        self._distributed = DistributedOptimizer(opt)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._distributed, name)

    def __repr__(self) -> str:
        return (
            f"SyncReplicasOptimizer({self._distributed.optimizer!r}, "
            f"replicas_to_aggregate={self.replicas_to_aggregate})"
        )

    def compute_gradients(
        self, state: TrainState, fn: Any, var_list: Iterable[str] | None = None
    ) -> tuple[Any, list[tuple[Any, str]]]:
        """This rank's gradients (the wrapped optimizer's)."""
        return self._distributed.compute_gradients(state, fn, var_list)

    def apply_gradients(
        self,
        state: TrainState,
        grads_and_vars: Mapping[str, Any] | Iterable[tuple[Any, str]],
        global_step: bool = True,
        *,
        learning_rate: float | None = None,
    ) -> None:
        """Average the gradients over the ranks and apply the average, on every rank."""
        self._distributed.apply_gradients(
            state, grads_and_vars, global_step=global_step, learning_rate=learning_rate
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
        return self._distributed.minimize(
            state, fn, var_list, global_step=global_step, learning_rate=learning_rate
        )

    def make_session_run_hook(self, is_chief: bool, num_tokens: int = -1) -> SyncReplicasHook:
        """The hook TF's scripts add to their session: here it checks the number of ranks."""
        if num_tokens != -1:
            raise UnsupportedArgumentError(
                f"SyncReplicasOptimizer.make_session_run_hook(num_tokens={num_tokens}): there "
                "is no token queue: every rank takes part in every step; drop it"
            )
        return SyncReplicasHook(self.replicas_to_aggregate)

    def get_chief_queue_runner(self) -> Any:
        """Refused: there is no chief queue; the hook of :meth:`make_session_run_hook` is all."""
        raise UnsupportedArgumentError(
            "SyncReplicasOptimizer.get_chief_queue_runner(): there is no token queue here; "
            "pass make_session_run_hook(is_chief) to the session and nothing else"
        )

    def get_init_tokens_op(self, num_tokens: int = -1) -> Any:
        """Refused, as :meth:`get_chief_queue_runner`."""
        return self.get_chief_queue_runner()


@final
class SyncReplicasHook:
    """Checks, when the session begins, that the job has ``replicas_to_aggregate`` ranks."""

    __slots__ = ("replicas_to_aggregate",)

    def __init__(self, replicas_to_aggregate: int) -> None:
        self.replicas_to_aggregate = replicas_to_aggregate

    def begin(self, session: MonitoredSession) -> None:
        found = world()
        ranks = 1 if found is None else found.size
        if ranks != self.replicas_to_aggregate:
            raise UnsupportedArgumentError(
                f"SyncReplicasOptimizer(replicas_to_aggregate={self.replicas_to_aggregate}): "
                f"this job has {ranks} rank{'s' if ranks != 1 else ''}; each step averages "
                f"one gradient per rank, so launch it with mpiexec -n "
                f"{self.replicas_to_aggregate} (or set replicas_to_aggregate={ranks})"
            )
