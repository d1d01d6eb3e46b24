"""TF1 arguments that have no meaning here, refused with what to do instead.

A TF1 script ported as it is passes ``config=tf.ConfigProto(...)``,
``master=...`` or ``session_creator=...``; Python's own "unexpected keyword
argument" would say nothing about why. Each is accepted by name and, when given
a value, refused with the reason and the replacement (listed in the TF1 page).
"""

from __future__ import annotations

from typing import Any, Final

from ._errors import UnsupportedArgumentError

__all__ = ["TF1_ARGUMENTS", "refuse_tf1_arguments"]

#: TF1 argument → what to do instead.
TF1_ARGUMENTS: Final = {
    "config": (
        "there is no tf.Session to configure: drop config=. Device placement is the "
        "arrays' (NumPy on the CPU, CuPy on the current CUDA device: "
        "cupy.cuda.Device(i).use()); thread counts are NumPy's BLAS settings "
        "(OMP_NUM_THREADS)"
    ),
    "master": (
        "remote masters are not supported: drop master=. Every process runs its own "
        "session; distributed training runs one process per rank over MPI, with "
        "is_chief=True on rank 0"
    ),
    "session_creator": (
        "sessions are not created by a SessionCreator: drop session_creator= and pass "
        "what it carried to the session itself (ChiefSessionCreator(scaffold=..., "
        "checkpoint_dir=...) → scaffold=..., a checkpoint hook or checkpoint_dir=...; "
        "WorkerSessionCreator → is_chief=False)"
    ),
    "save_graph_def": (
        "there is no graph to save: drop save_graph_def= (checkpoints hold the arrays, "
        "global step, RNG state and plugin states)"
    ),
}


def refuse_tf1_arguments(where: str, **given: Any) -> None:
    """Raise :class:`UnsupportedArgumentError` naming the first TF1-only argument given."""
    for name, value in given.items():
        if value is not None:
            raise UnsupportedArgumentError(f"{where}({name}=...): {TF1_ARGUMENTS[name]}")
