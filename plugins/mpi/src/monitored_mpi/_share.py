"""Sharing the chief's state: every rank starts from the arrays the chief has.

The chief describes its state (names, shapes, dtypes, trainable flags, global
step, RNG state, plugin states) in a JSON manifest; each rank compares the
manifest with its own state, and the problems of all ranks are exchanged so
that every rank raises the same :class:`StateMismatchError` naming the arrays
and the ranks. Then each array is broadcast from the chief. Each rank's RNG is
the chief's jumped ``rank`` times, so ranks draw different numbers, and a run
resumed from the chief's checkpoint gets the same per-rank streams again.
"""

from __future__ import annotations

import inspect
import json
from typing import TYPE_CHECKING, Any

import numpy as np

from monitored import TrainState, is_device_array

from ._collectives import exchange_bytes
from ._errors import ChiefTimeoutError, CollectiveTimeoutError, MPIError, StateMismatchError
from ._host import host as host_of
from ._world import World

if TYPE_CHECKING:
    from monitored import MonitoredSession

__all__ = ["describe", "jump_rng", "share_state"]


def describe(state: TrainState) -> dict[str, list[Any]]:
    """Name -> [shape, dtype, trainable] of every entry of ``state``."""
    return {
        name: [list(np.shape(value)), str(value.dtype), state.is_trainable(name)]
        for name, value in state.items()
    }


def _problems(chief: dict[str, list[Any]], mine: dict[str, list[Any]]) -> list[str]:
    problems = [f"array {name!r} is missing here" for name in chief if name not in mine]
    problems += [f"array {name!r} is not on the chief" for name in mine if name not in chief]
    for name, (shape, dtype, trainable) in chief.items():
        if name not in mine:
            continue
        my_shape, my_dtype, my_trainable = mine[name]
        if my_shape != shape:
            problems.append(
                f"array {name!r} has shape {tuple(my_shape)} here, {tuple(shape)} on the chief"
            )
        if my_dtype != dtype:
            problems.append(f"array {name!r} has dtype {my_dtype} here, {dtype} on the chief")
        if my_trainable != trainable:
            problems.append(
                f"array {name!r} is {'' if my_trainable else 'not '}trainable here, "
                f"{'' if trainable else 'not '}trainable on the chief"
            )
    return problems


async def share_state(world: World, session: MonitoredSession, max_wait_secs: float) -> None:
    """Broadcast the chief's state to every rank (called on all ranks)."""
    state = session.state
    chief = world.rank == 0
    init_fn = session.scaffold.init_fn
    if not chief and not state.initialized and init_fn is not None:
        # The entries init_fn adds must exist here too; their values come from the chief.
        created = init_fn(state)
        if inspect.isawaitable(created):
            await created
    mine = describe(state)
    payload = b""
    if chief:
        manifest = {
            "arrays": mine,
            "global_step": state.global_step,
            "rng": state.rng_state,
            "plugins": await session.plugin_states(),
        }
        payload = json.dumps(manifest).encode()
    try:
        # The first exchange is where workers wait for the chief to create the state.
        payloads = exchange_bytes(payload, "sharing the chief's state", world, max_wait_secs)
    except CollectiveTimeoutError as exc:
        raise ChiefTimeoutError(
            f"rank {world.rank} waited {max_wait_secs:g}s (max_wait_secs) for the chief "
            "(rank 0) to create the state and share it; the chief is slow to restore or "
            "initialize, or does not run a session"
        ) from exc
    manifest = json.loads(payloads[0])
    report = [] if chief else _problems(manifest["arrays"], mine)
    reports = exchange_bytes(json.dumps(report).encode(), "checking the states", world)
    lines = [
        f"rank {rank}: {problem}" for rank, raw in enumerate(reports) for problem in json.loads(raw)
    ]
    if lines:
        raise StateMismatchError(
            "the ranks' states differ from the chief's (rank 0), so its state cannot be "
            "shared; every rank must build the same arrays:\n  " + "\n  ".join(lines)
        )
    for name in manifest["arrays"]:
        value = state[name]
        host = host_of(value).copy(order="C") if chief else np.empty_like(host_of(value))
        raw = host.reshape(-1).view(np.uint8)  # any dtype, bfloat16 included, as bytes
        world.wait(world.control.Ibcast(raw, root=0), f"broadcasting array {name!r}")
        if not chief:
            _assign(state, name, value, host)
    if not chief:
        state.global_step = int(manifest["global_step"])
        try:
            state.rng_state = manifest["rng"]
        except ValueError as exc:
            raise StateMismatchError(f"rank {world.rank}: {exc} (the chief's)") from None
        state.rng = jump_rng(state.rng, world.rank)
        state.initialized = True
        await session.load_plugin_states(manifest["plugins"])


def _assign(state: TrainState, name: str, old: Any, host: np.ndarray[Any, Any]) -> None:
    if is_device_array(old):
        old.set(host)
    elif isinstance(old, np.ndarray) and old.flags.writeable:
        np.copyto(old, host)
    else:
        state[name] = host


def jump_rng(rng: np.random.Generator, rank: int) -> np.random.Generator:
    """``rng`` advanced ``rank`` jumps: rank ``r``'s stream, derived from the chief's."""
    if rank == 0:
        return rng
    bit_generator = rng.bit_generator
    jumped = getattr(bit_generator, "jumped", None)
    if jumped is None:
        raise MPIError(
            f"state.rng uses bit generator {type(bit_generator).__name__}, which cannot jump; "
            "use PCG64 (NumPy's default), PCG64DXSM, Philox or MT19937 for per-rank streams"
        )
    return np.random.Generator(jumped(rank))
