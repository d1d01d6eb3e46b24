"""Sharing the chief's state: every rank starts from the arrays the chief has.

The chief describes its state (names, shapes, dtypes, trainable flags, global
step, RNG state, plugin states) in a JSON manifest; each rank compares the
manifest with its own state, and the problems of all ranks are exchanged so
that every rank raises the same :class:`StateMismatchError` naming the arrays
and the ranks. Then each array is broadcast from the chief. Each rank's RNG is
the chief's jumped ``rank`` times, so ranks draw different numbers, and a run
resumed from the chief's checkpoint gets the same per-rank streams again.

As TF1's workers, the other ranks never run ``Scaffold.init_fn``: it may read
files that only the chief's machine has (a ``warm_start`` from a pretrained
checkpoint). The entries it creates on the chief are created on the other
ranks from the manifest, with the chief's shapes, dtypes and trainable flags,
and filled by the broadcast.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from monitored import (
    TrainState,
    decode_rng_state,
    encode_rng_state,
    is_device_array,
    printable,
)

from ._collectives import exchange_bytes
from ._errors import (
    ChiefTimeoutError,
    CollectiveTimeoutError,
    MPIError,
    StateMismatchError,
    UnshareableStateError,
)
from ._host import host as host_of
from ._host import store
from ._world import World

if TYPE_CHECKING:
    from monitored import MonitoredSession

__all__ = ["describe", "encode_manifest", "jump_rng", "share_state"]


def describe(state: TrainState) -> dict[str, list[Any]]:
    """Name -> [shape, dtype, trainable] of every entry of ``state``."""
    return {
        name: [list(np.shape(value)), str(value.dtype), state.is_trainable(name)]
        for name, value in state.items()
    }


def encode_manifest(state: TrainState, plugin_states: Mapping[str, Any]) -> bytes:
    """The chief's manifest as JSON: arrays, array modules, global step, RNG, plugin states.

    A plugin state that JSON cannot hold is an :class:`UnshareableStateError`
    naming the plugin (as the checkpoint plugin refuses to save it).
    """
    for plugin, entry in plugin_states.items():
        try:
            json.dumps(entry)
        except (TypeError, ValueError) as exc:
            raise UnshareableStateError(
                f"the state of plugin {plugin!r} cannot be sent to the other ranks: it must "
                f"be JSON-serializable ({exc})"
            ) from exc
    manifest = {
        "arrays": describe(state),
        "modules": {name: "cupy" for name, value in state.items() if is_device_array(value)},
        "global_step": state.global_step,
        "rng": encode_rng_state(state.rng_state),
        "plugins": dict(plugin_states),
    }
    return json.dumps(manifest).encode()


def _create_entries(state: TrainState, manifest: Mapping[str, Any], rank: int) -> None:
    """Add the chief's entries that ``init_fn`` created there and this rank lacks."""
    modules = manifest.get("modules", {})
    for name, (shape, dtype_name, trainable) in manifest["arrays"].items():
        if name in state:
            continue
        try:
            dtype = np.dtype(dtype_name)
        except TypeError:
            raise StateMismatchError(
                f"rank {rank}: array {name!r}, which the chief's init_fn creates, has dtype "
                f"{printable(dtype_name)}, which NumPy cannot name here; create it before the "
                "session (in the TrainState or a hook's begin) on every rank"
            ) from None
        value: Any = np.empty(tuple(shape), dtype)
        if modules.get(name) == "cupy":
            import cupy

            value = cupy.empty(tuple(shape), dtype)
        state.add(name, value, trainable=bool(trainable))


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
    # Where the chief ran init_fn, it may have created entries that this rank has not.
    creates = not chief and not state.initialized and session.scaffold.init_fn is not None
    payload = encode_manifest(state, await session.plugin_states()) if chief else b""
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
    report: list[str] = []
    if not chief:
        if creates:
            _create_entries(state, manifest, world.rank)
        report = _problems(manifest["arrays"], describe(state))
    reports = exchange_bytes(json.dumps(report).encode(), "checking the states", world)
    lines = [
        f"rank {rank}: {printable(problem)}"  # each rank's words, one line each
        for rank, raw in enumerate(reports)
        for problem in json.loads(raw)
    ]
    if lines:
        raise StateMismatchError(
            "the ranks' states differ from the chief's (rank 0), so its state cannot be "
            "shared; every rank must build the same arrays:\n  " + "\n  ".join(lines)
        )
    for name in manifest["arrays"]:
        value = state[name]
        # C order on every rank, whatever the entry's: reshape(-1) below must be a view
        # of the buffer that is sent or received into, never a copy of it.
        host = host_of(value).copy(order="C") if chief else np.empty(np.shape(value), value.dtype)
        raw = host.reshape(-1).view(np.uint8)  # any dtype, bfloat16 included, as bytes
        world.wait(world.control.Ibcast(raw, root=0), f"broadcasting array {name!r}")
        if not chief:
            _assign(state, name, value, host)
    if not chief:
        state.global_step = int(manifest["global_step"])
        try:
            state.rng_state = decode_rng_state(manifest["rng"])
        except ValueError as exc:
            raise StateMismatchError(f"rank {world.rank}: {exc} (the chief's)") from None
        state.rng = jump_rng(state.rng, world.rank)
        state.initialized = True
        await session.load_plugin_states(manifest["plugins"])


def _assign(state: TrainState, name: str, old: Any, host: np.ndarray[Any, Any]) -> None:
    if is_device_array(old):
        store(old, host)
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
