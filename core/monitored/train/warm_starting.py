"""Warm starts: initialize some arrays of a state from another run's checkpoint.

TF1's ``tf.train.warm_start`` and ``tf.train.init_from_checkpoint``. The usual
place is a scaffold's or a ``Supervisor``'s ``init_fn``, which runs only when
the run has no checkpoint of its own (the "pre-trained model" scenario):

    init_fn=lambda state: warm_start(state, "runs/pretrained", "encoder/.*")

As TF1's, a regular expression considers only the trainable entries, so a
fine-tune starts with fresh optimizer slots and counters; name entries in a list
to copy those too.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from .._core._backend import is_device_array
from .._core._capabilities import provider
from .._core._errors import MonitoredError, UnsupportedArgumentError
from .._core._printable import printable
from .._core._state import TrainState
from .optimizers import trainable_variables

__all__ = ["WarmStartError", "warm_start"]

log = logging.getLogger("monitored")


class WarmStartError(MonitoredError, ValueError):
    """A warm start cannot be done as asked: names missing, shapes or dtypes differ.

    The message names the checkpoint and every entry at fault; the state is
    left exactly as it was.
    """


def warm_start(
    state: TrainState,
    ckpt_to_initialize_from: str | os.PathLike[str],
    vars_to_warm_start: str | Iterable[str] | None = ".*",
    *,
    name_map: Mapping[str, str] | None = None,
    var_name_to_vocab_info: None = None,
) -> dict[str, str]:
    """Copy arrays of a checkpoint of another run into ``state``; return what was copied.

    Here, in ``monitored.train``, because TF1 has it in ``tf.train`` (as
    ``warm_start`` and ``init_from_checkpoint``); it works on a
    :class:`~monitored.TrainState` instead of graph variables. The checkpoint
    format belongs to the ``monitored-checkpoint`` plugin, which reads it (a
    :class:`~monitored.MissingPluginError` names the package when it is not
    installed), with that plugin's protections against hostile directories.

    Args:
        state: the state to initialize; only the selected entries change (not its
            global step nor its RNG).
        ckpt_to_initialize_from: a checkpoint path (``runs/a/model.ckpt-100``) or
            a directory (its newest checkpoint).
        vars_to_warm_start: which entries of ``state`` to initialize:

            - a regular expression, matched at the start of the name of each
              *trainable* entry (:func:`~monitored.train.trainable_variables`),
              as TF1 matches it against ``TRAINABLE_VARIABLES``: ``"dense"``
              selects ``"dense/kernel"``; ``".*"``, the default, selects every
              trainable entry. Optimizer slots (``"w/Adam/m"``), optimizer
              counters (``"Adam/beta1_power"``), entries marked
              ``trainable=False`` (batch-norm statistics) and integer entries
              are not selected, so a fine-tune starts with fresh ones;
            - a list of exact names of any entries, trainable or not: the way to
              copy slots or statistics too. TF1 takes each string of a list as a
              regular expression over all its variables (a scope); here each is
              one name, so ``["dense/kernel"]`` does not also select
              ``"dense/kernel/Adam/m"``. For TF1's scopes, list
              ``[n for n in state if re.match(scope, n)]``;
            - ``None``: the trainable entries, as ``".*"``. (TF1's ``None``
              selects only the variables of ``var_name_to_vocab_info``, which is
              not supported here.)
        name_map: ``{name in the checkpoint: name in the state}`` for entries that
            were renamed (TF's ``assignment_map`` of ``init_from_checkpoint``);
            every target must be a selected entry. Unmapped entries keep their name.
        var_name_to_vocab_info: TF's vocabulary remapping; not supported.

    Returns ``{state entry: checkpoint entry}`` for every entry copied. Raises
    :class:`WarmStartError` when a selected entry is not in the checkpoint or
    differs in shape or dtype (listing every problem); nothing in ``state``
    changes then. Arrays are copied into the state's arrays in place (NumPy or
    CuPy), so references to them stay valid. The whole checkpoint is read (and
    verified) once, so memory briefly holds its arrays on the host.
    """
    if var_name_to_vocab_info is not None:
        raise UnsupportedArgumentError(
            "warm_start(var_name_to_vocab_info=...): vocabulary remapping is not supported; "
            "read the rows with monitored_checkpoint.read_checkpoint(...) and place them "
            "yourself in init_fn"
        )
    if not isinstance(state, TrainState):
        raise TypeError(f"warm_start: state must be a monitored.TrainState, got {type(state)}")
    selected = _select(state, vars_to_warm_start)
    sources = _sources(state, selected, name_map or {})
    path, arrays = provider("checkpoint", "warm_start reads checkpoints").call(
        "read_checkpoint", path=os.fspath(ckpt_to_initialize_from)
    )
    _check(state, sources, arrays, path)
    for name, source in sources.items():
        _assign(state, name, arrays[source])
    # The checkpoint found in a directory (its name, and the directory's, from disk).
    log.info("Warm-started %d entries of the state from %s", len(sources), printable(path))
    return dict(sources)


def _select(state: TrainState, wanted: str | Iterable[str] | None) -> list[str]:
    if wanted is None:
        names = trainable_variables(state)
        if not names:
            raise WarmStartError("warm_start: the state has no trainable entries to warm-start")
        return names
    if isinstance(wanted, str):
        try:
            pattern = re.compile(wanted)
        except re.error as exc:
            raise WarmStartError(
                f"warm_start: vars_to_warm_start {wanted!r} is not a regular expression: {exc}"
            ) from None
        trainable = trainable_variables(state)
        names = [name for name in trainable if pattern.match(name)]
        if not names:
            others = [name for name in state if pattern.match(name)]
            raise WarmStartError(
                f"warm_start: vars_to_warm_start {wanted!r} matches no trainable entry of the "
                + (
                    f"state; it matches {others}, which are not trainable: a regular "
                    "expression considers only the trainable entries (TF's rule), so list "
                    "these names to warm-start them"
                    if others
                    else f"state (its trainable entries: {trainable})"
                )
            )
        return names
    names = list(wanted)
    bad = [name for name in names if not isinstance(name, str)]
    if bad:
        raise TypeError(f"warm_start: vars_to_warm_start must hold names, got {bad[:3]}")
    unknown = [name for name in names if name not in state]
    if unknown:
        raise WarmStartError(
            f"warm_start: the state has no entries {unknown} (its entries: {sorted(state)})"
        )
    if len(set(names)) != len(names):
        raise WarmStartError(f"warm_start: vars_to_warm_start names an entry twice: {names}")
    if not names:
        raise WarmStartError("warm_start: vars_to_warm_start is empty")
    return names


def _sources(state: TrainState, selected: list[str], name_map: Mapping[str, str]) -> dict[str, str]:
    """``{state entry: checkpoint entry}`` for the selected entries."""
    if not isinstance(name_map, Mapping):
        raise TypeError(f"warm_start: name_map must be a mapping, got {type(name_map).__name__}")
    renamed: dict[str, str] = {}
    for old, new in name_map.items():
        if not isinstance(old, str) or not isinstance(new, str):
            raise TypeError(f"warm_start: name_map must map names to names, got {old!r}: {new!r}")
        if new in renamed:
            raise WarmStartError(
                f"warm_start: name_map maps both {renamed[new]!r} and {old!r} to {new!r}"
            )
        renamed[new] = old
    unknown = sorted(new for new in renamed if new not in state)
    if unknown:
        raise WarmStartError(
            f"warm_start: name_map targets {unknown}, which the state does not have "
            f"(its entries: {sorted(state)})"
        )
    unused = sorted(set(renamed) - set(selected))
    if unused:
        raise WarmStartError(
            f"warm_start: name_map targets {unused}, which vars_to_warm_start does not select"
        )
    return {name: renamed.get(name, name) for name in selected}


def _check(
    state: TrainState,
    sources: Mapping[str, str],
    arrays: Mapping[str, np.ndarray[Any, Any]],
    path: str,
) -> None:
    """Raise :class:`WarmStartError` naming every entry that cannot be copied."""
    problems: list[str] = []
    missing = sorted(source for source in sources.values() if source not in arrays)
    if missing:
        problems.append(f"it has no entries {missing} (it has {sorted(arrays)})")
    for name, source in sources.items():
        if source not in arrays:
            continue
        target, found = state[name], arrays[source]
        label = repr(name) if name == source else f"{name!r} (from {source!r})"
        if tuple(target.shape) != found.shape:
            problems.append(
                f"entry {label} has shape {found.shape} in the checkpoint and "
                f"{tuple(target.shape)} in the state"
            )
        if np.dtype(target.dtype) != found.dtype:
            problems.append(
                f"entry {label} has dtype {found.dtype} in the checkpoint and "
                f"{np.dtype(target.dtype)} in the state"
            )
    if problems:
        raise WarmStartError(
            f"cannot warm-start from checkpoint {printable(path)}: "
            + "; ".join(problems)
            + "; the state is unchanged"
        )


def _assign(state: TrainState, name: str, host: np.ndarray[Any, Any]) -> None:
    target = state[name]
    if is_device_array(target):
        import cupy

        with cupy.cuda.Device(target.device.id):
            target[...] = cupy.asarray(host)
    elif isinstance(target, np.ndarray) and target.flags.writeable:
        np.copyto(target, host)
    else:
        state[name] = host
