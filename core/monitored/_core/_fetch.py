"""Resolving hooks' fetch structures into host values, in one batched transfer.

Each hook names what it wants (step outputs or state entries, in any nesting of
lists, tuples and dicts). All requests of a step are merged into one list of
distinct names, looked up, moved to the host together, and rebuilt into each
hook's own structure.

The per-step cost is kept at its floor by **plans**, computed once and reused
while the requests stay the same (TF1 caches its fetch handlers the same way):

- a :class:`FetchPlan` is one hook's structure, flattened once: its distinct
  names, which are optional, and a tree to rebuild it. A hook asking for an equal
  structure at the next step (the same constant ``SessionRunArgs``, or a new but
  equal dict) reuses it;
- a :class:`StepPlan` merges the plans of one step: the distinct names, who
  requires each (for the error message), and one generated function that builds
  every hook's :class:`~monitored.SessionRunValues` from the flat list of host
  values in a single expression;
- for the steady state of a loop (the same hooks asking for the same structures,
  every value on the host), a step plan also generates its **fast path**: one
  straight-line function that checks the requests against the plans, looks up
  and copies each name and builds every answer, at about the cost of the same
  work written by hand (``benchmarks/overhead.py``, the hand-written row).

Host values are copies (a hook must not see an array change under it after the
step), made once per name per step, however many hooks ask for it. Values asked
for with ``lag=1`` are delivered one step late (:class:`Fetcher`); on CuPy their
transfer is started without waiting (:func:`~monitored._core._backend.start_device_copy`).
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import CodeType
from typing import TYPE_CHECKING, Any, Final, final

import numpy as np

from ._backend import DeviceCopy, copy_to_host, is_device_array, start_device_copy
from ._errors import FetchError
from ._run import SessionRunValues
from ._scalars import SCALAR_OUTPUTS, scalar_output_fetches
from ._state import TrainState

if TYPE_CHECKING:
    from ._calling import HookCall
    from ._run import SessionRunArgs

__all__ = [
    "GLOBAL_STEP",
    "FetchPlan",
    "Fetcher",
    "OptionalFetch",
    "StepPlan",
    "fetch_many",
    "leaves",
    "optional",
]

#: The fetch name of the global step (unless a step output or entry is so named).
GLOBAL_STEP = "global_step"


@final
class OptionalFetch(str):
    """A fetch name that may be missing: the hook then receives ``None`` for it."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"optional({str(self)!r})"


def optional(name: str) -> OptionalFetch:
    """Mark fetch ``name`` as optional: ``None`` when neither output nor state entry exists.

    For installed plugins, which cannot know every script's outputs:
    ``SessionRunArgs({"loss": monitored.optional("loss")})`` watches the loss where a
    step returns one and receives ``None`` elsewhere, instead of a ``FetchError``.
    """
    if not isinstance(name, str):
        raise TypeError(f"optional() takes a fetch name (a str), got {type(name).__name__}")
    return OptionalFetch(name)


def leaves(fetches: Any, describe: Callable[[], str]) -> Iterator[str]:
    """The names in a fetch structure, depth first; ``describe`` names the asker."""
    if isinstance(fetches, str):
        yield fetches
    elif isinstance(fetches, Mapping):
        for value in fetches.values():
            yield from leaves(value, describe)
    elif isinstance(fetches, list | tuple):
        for value in fetches:
            yield from leaves(value, describe)
    else:
        raise TypeError(
            f"{describe()} asked to fetch {fetches!r} ({type(fetches).__name__}); fetches "
            "are names of step outputs or state entries, in lists, tuples or dicts"
        )


def lookup(name: str, outputs: Mapping[str, Any], state: TrainState) -> Any:
    """The value called ``name``: a step output first, then a state entry."""
    if name in outputs:
        return outputs[name]
    if name in state:
        return state[name]
    if name == GLOBAL_STEP:
        return np.int64(state.global_step)
    raise KeyError(name)


#: Deeper structures are rebuilt by a recursive function rather than one generated
#: expression (the parser limits nesting).
_MAX_GENERATED_DEPTH: Final = 32

#: A node of a plan's tree: a local slot (``int``) or ``(kind, children, extra)``.
_Tree = Any


@final
class FetchPlan:
    """One hook's fetch structure, resolved once: names, optionality, how to rebuild it.

    ``describe`` names the asker in error messages; ``index`` is its plugin index
    (the key of its answer), ``lag`` 0 or 1 (see :class:`Fetcher`).
    """

    __slots__ = (
        "constant",
        "depth",
        "describe",
        "index",
        "kind",
        "lag",
        "names",
        "required",
        "snapshot",
        "source",
        "tree",
    )

    def __init__(
        self, fetches: Any, describe: Callable[[], str], index: int = 0, lag: int = 0
    ) -> None:
        self.describe = describe
        self.index = index
        self.lag = lag
        #: The structure as the hook gave it, and a copy of its containers: an equal
        #: structure reuses the plan, even if the hook changed its own object in place.
        self.source = fetches
        self.kind = type(fetches)
        slots: dict[str, int] = {}
        required: list[bool] = []
        self.depth = 0
        self.tree, self.snapshot, self.constant = self._walk(fetches, slots, required, 0)
        #: Distinct plain names in first-seen order, and whether each is required
        #: (asked for at least once without :func:`optional`).
        self.names: tuple[str, ...] = tuple(slots)
        self.required: tuple[bool, ...] = tuple(required)

    def _walk(
        self, node: Any, slots: dict[str, int], required: list[bool], depth: int
    ) -> tuple[_Tree, Any, bool]:
        """``(tree, snapshot, constant)`` of ``node``; ``constant``: deeply immutable."""
        self.depth = max(self.depth, depth)
        if isinstance(node, str):
            name = str(node)
            slot = slots.setdefault(name, len(slots))
            if slot == len(required):
                required.append(False)
            if type(node) is not OptionalFetch:
                required[slot] = True
            return slot, node, True
        if isinstance(node, Mapping):
            keys = tuple(node)
            parts = [self._walk(node[key], slots, required, depth + 1) for key in keys]
            tree = ("dict", tuple(p[0] for p in parts), keys)
            return tree, dict(zip(keys, (p[1] for p in parts), strict=True)), False
        if isinstance(node, list | tuple):
            parts = [self._walk(value, slots, required, depth + 1) for value in node]
            children = tuple(p[0] for p in parts)
            snapshots = [p[1] for p in parts]
            if isinstance(node, tuple) and hasattr(node, "_make"):  # a namedtuple
                constant = all(p[2] for p in parts)
                return ("named", children, type(node)), node._make(snapshots), constant
            if isinstance(node, tuple):
                return ("tuple", children, None), tuple(snapshots), all(p[2] for p in parts)
            return ("list", children, None), snapshots, False
        raise TypeError(
            f"{self.describe()} asked to fetch {node!r} ({type(node).__name__}); fetches "
            "are names of step outputs or state entries, in lists, tuples or dicts"
        )

    def tree_kind(self) -> str:
        """``"leaf"`` for a single name, else the kind of the top container."""
        return "leaf" if isinstance(self.tree, int) else str(self.tree[0])

    def matches(self, fetches: Any, lag: int) -> bool:
        """Whether ``fetches`` (with ``lag``) is the structure this plan was made for.

        The same deeply immutable object (a name, a tuple of names) matches at once;
        anything else is compared with the snapshot, a C-level equality. Names
        compare as strings: a structure equal to the plan's in which a name only
        switched between ``optional`` and required reuses the plan.
        """
        if lag != self.lag:
            return False
        if fetches is self.source and self.constant:
            return True
        try:
            return type(fetches) is self.kind and bool(fetches == self.snapshot)
        except Exception:  # a leaf that is not a name and compares oddly: replan
            return False


def _source(
    tree: _Tree, slots: Sequence[int], namespace: dict[str, Any], ref: str = "v[{}]"
) -> str:
    """A Python expression rebuilding ``tree`` from ``v``, the step's host values.

    ``ref`` spells the value of a slot (``x{}``: one local variable per slot).
    """
    if isinstance(tree, int):
        return ref.format(slots[tree])
    kind, children, extra = tree
    parts = [_source(child, slots, namespace, ref) for child in children]
    if kind == "dict":
        items = []
        for key, part in zip(extra, parts, strict=True):
            if type(key) in (str, int):
                literal = repr(key)
            else:
                literal = f"_k{len(namespace)}"
                namespace[literal] = key
            items.append(f"{literal}: {part}")
        return "{" + ", ".join(items) + "}"
    if kind == "list":
        return "[" + ", ".join(parts) + "]"
    inner = "(" + "".join(f"{part}, " for part in parts) + ")"
    if kind == "tuple":
        return inner
    name = f"_t{len(namespace)}"
    namespace[name] = extra
    return f"{name}._make({inner})"


def _rebuild(tree: _Tree, slots: Sequence[int], v: Sequence[Any]) -> Any:
    """What :func:`_source`'s expression computes, for structures too deep for it."""
    if isinstance(tree, int):
        return v[slots[tree]]
    kind, children, extra = tree
    values = [_rebuild(child, slots, v) for child in children]
    if kind == "dict":
        return dict(zip(extra, values, strict=True))
    if kind == "list":
        return values
    return extra._make(values) if kind == "named" else tuple(values)


_Assemble = Callable[[list[Any]], dict[int, SessionRunValues]]
_Fast = Callable[
    [Sequence[tuple["HookCall", "SessionRunArgs"]], Mapping[str, Any], TrainState],
    dict[int, SessionRunValues] | None,
]


#: Generated code by its source: every session of a script makes the same plans, and
#: compiling one costs more than the rest of making it (the names it refers to are
#: in the namespace each plan executes it in).
_CODE: dict[str, CodeType] = {}
#: Sources beyond this many are compiled each time (structures that keep changing).
_MAX_CODE: Final = 256


def _compiled(source: str, filename: str) -> CodeType:
    code = _CODE.get(source)
    if code is None:
        code = compile(source, filename, "exec")
        if len(_CODE) < _MAX_CODE:
            _CODE[source] = code
    return code


def _assembler(plans: Sequence[tuple[FetchPlan, list[int]]]) -> _Assemble | None:
    """One generated function building every plan's answer from the host values ``v``.

    ``{index: SessionRunValues(<structure>), ...}`` in a single expression: no
    per-hook call, loop or intermediate list at each step.
    """
    if not plans:
        return None
    namespace: dict[str, Any] = {"_new": tuple.__new__, "_SRV": SessionRunValues}
    entries = []
    for plan, slots in plans:
        if plan.depth <= _MAX_GENERATED_DEPTH:
            expression = _source(plan.tree, slots, namespace)
        else:
            name = f"_deep{len(namespace)}"
            namespace[name] = lambda v, tree=plan.tree, slots=slots: _rebuild(tree, slots, v)
            expression = f"{name}(v)"
        entries.append(f"{plan.index}: _new(_SRV, ({expression}, None, None))")
    code = "def assemble(v):\n    return {" + ", ".join(entries) + "}\n"
    exec(_compiled(code, "<monitored fetch plan>"), namespace)
    assemble: _Assemble = namespace["assemble"]
    return assemble


_MISSING: Final = object()

#: How a value of each type reaches hooks: 0 an ndarray (copied), 1 a NumPy scalar
#: (immutable: handed over as it is), 2 a CuPy array (transferred), 3 anything else
#: (converted by ``numpy.array``, which copies).
_HOW: dict[type, int] = {np.ndarray: 0}
#: The types of kind 1 and 3, as sets (for the fast path).
_KEEP: set[type] = set()
_CONVERT: set[type] = set()


def _fast_path(
    plans: Sequence[tuple[FetchPlan, list[int]]], names: Sequence[str], required: Sequence[bool]
) -> _Fast | None:
    """A generated function answering a step whose requests are those of ``plans``.

    It checks that each request (plugin index, lag, structure) is the one its plan
    was made for, resolves every name as :meth:`StepPlan.collect` does (one lookup,
    one copy per name), and builds every answer, without a loop or a call per hook
    or per name. It returns ``None`` as soon as anything differs (another request,
    a missing required name, a device value or a type not seen yet): the general
    path then answers the step. ``None`` here: too deep a structure to generate.
    """
    if any(plan.depth > _MAX_GENERATED_DEPTH for plan, _ in plans):
        return None
    namespace: dict[str, Any] = {
        "_new": tuple.__new__,
        "_SRV": SessionRunValues,
        "_M": _MISSING,
        "_KEEP": _KEEP,
        "_CONVERT": _CONVERT,
        "_ndarray": np.ndarray,
        "_array": np.array,
        "_int64": np.int64,
    }
    pairs = ", ".join(f"(c{i}, a{i})" for i in range(len(plans)))
    lines = [
        "def fast(requests, outputs, state):",
        f"    if len(requests) != {len(plans)}:",
        "        return None",
        "    try:",
        f"        {pairs}, = requests",
    ]
    for i, (plan, _) in enumerate(plans):
        namespace[f"_K{i}"], namespace[f"_S{i}"] = plan.kind, plan.snapshot
        # Equal lists and dicts rebuild alike whatever their type; a tuple may be a
        # namedtuple, which compares equal to a plain one but is rebuilt as itself.
        same = f"f == _S{i}" if plan.tree_kind() != "tuple" else f"type(f) is _K{i} and f == _S{i}"
        if plan.constant:
            namespace[f"_R{i}"] = plan.source
            same = f"f is _R{i} or ({same})"
        lines += [
            f"        if c{i}.plugin_index != {plan.index} or a{i}.lag != {plan.lag}:",
            "            return None",
            f"        f = a{i}.fetches",
            f"        if not ({same}):",
            "            return None",
        ]
    lines += [
        "    except Exception:  # a structure changed into one that compares oddly",
        "        return None",
        "    get = outputs.get",
        "    arrays = state._arrays",
    ]
    for j, (name, is_required) in enumerate(zip(names, required, strict=True)):
        if name == GLOBAL_STEP:
            absent = "x = _int64(state.global_step)"
        else:
            absent = "return None" if is_required else "x = None"
        lines += [
            f"    x{j} = get({name!r}, _M)",
            f"    if x{j} is _M:",
            f"        x{j} = arrays.get({name!r}, _M)",
            f"    t = type(x{j})",
            "    if t in _KEEP:",
            "        pass",
            "    elif t is _ndarray:",
            f"        x{j} = x{j}.copy()",
            f"    elif x{j} is _M:",
            f"        {absent.replace('x =', f'x{j} =')}",
            "    elif t in _CONVERT:",
            "        try:",
            f"            x{j} = _array(x{j})",
            "        except Exception:",
            "            return None  # the general path names the value",
            "    else:",
            "        return None",
        ]
    entries = [
        f"{plan.index}: _new(_SRV, ({_source(plan.tree, slots, namespace, 'x{}')}, None, None))"
        for plan, slots in plans
    ]
    lines.append("    return {" + ", ".join(entries) + "}")
    exec(_compiled("\n".join(lines) + "\n", "<monitored fetch fast path>"), namespace)
    fast: _Fast = namespace["fast"]
    return fast


def _how(kind: type, value: Any) -> int:
    if inspect.isawaitable(value):
        return _AWAITABLE  # not remembered: refused each time, by name
    how = 1 if isinstance(value, np.generic) else 2 if is_device_array(value) else 3
    _HOW[kind] = how
    if how == 1:
        _KEEP.add(kind)
    elif how == 3:
        _CONVERT.add(kind)
    return how


@final
class StepPlan:
    """The merged plans of one step: distinct names, and how to answer every hook.

    Reused for as long as the same hooks bring the same plans, in the same order.
    """

    __slots__ = (
        "_required_by",
        "fast",
        "late",
        "late_only",
        "names",
        "now",
        "plans",
        "required",
    )

    def __init__(self, plans: Sequence[FetchPlan]) -> None:
        self.plans = list(plans)
        merged: dict[str, int] = {}
        required_by: list[list[FetchPlan]] = []
        wanted_now: list[bool] = []
        now: list[tuple[FetchPlan, list[int]]] = []
        late: list[tuple[FetchPlan, list[int]]] = []
        for plan in plans:
            slots = []
            for name, is_required in zip(plan.names, plan.required, strict=True):
                slot = merged.setdefault(name, len(merged))
                if slot == len(required_by):
                    required_by.append([])
                    wanted_now.append(False)
                if is_required:
                    required_by[slot].append(plan)
                if not plan.lag:
                    wanted_now[slot] = True
                slots.append(slot)
            (late if plan.lag else now).append((plan, slots))
        #: Distinct names of the step, and whether any hook requires each.
        self.names: tuple[str, ...] = tuple(merged)
        self.required: tuple[bool, ...] = tuple(bool(r) for r in required_by)
        self._required_by = required_by
        #: Per name: asked for by late hooks only (a CuPy value is then copied late).
        self.late_only: tuple[bool, ...] = tuple(not w for w in wanted_now)
        self.now = _assembler(now)
        self.late = _assembler(late)
        #: The step answered in one generated function (no late hooks): see _fast_path.
        self.fast: _Fast | None = (
            _fast_path(now, self.names, self.required) if now and not late else None
        )

    def collect(
        self, outputs: Mapping[str, Any], state: TrainState
    ) -> tuple[list[Any], DeviceCopy | None]:
        """Every name's host value, by slot; CuPy values wanted late only are started.

        NumPy arrays are copied (once, however many hooks asked), NumPy scalars are
        immutable and handed over as they are, CuPy arrays are transferred in one
        batch per device: at once, or, when only ``lag=1`` hooks want them, started
        without waiting (the returned copy fills their slots when finished).
        """
        v: list[Any] = []
        append = v.append
        device: list[int] | None = None
        get = outputs.get
        arrays = state._arrays
        how_of = _HOW
        for name in self.names:
            value = get(name, _MISSING)
            if value is _MISSING:
                value = arrays.get(name, _MISSING)
                if value is _MISSING:
                    if name == GLOBAL_STEP:
                        append(np.int64(state.global_step))
                    elif self.required[len(v)]:
                        raise self._missing(name, outputs, state)
                    else:
                        append(None)
                    continue
            kind = type(value)
            how = how_of.get(kind)
            if how is None:
                how = _how(kind, value)
            if how == 0:
                append(value.copy())
            elif how == 1:
                append(value)
            elif how == 3:
                try:
                    append(np.array(value))
                except Exception as exc:  # torch's tensor that requires grad, ...
                    raise _unconvertible(name, value, state, exc) from exc
            elif how == _AWAITABLE:
                raise _unconvertible(name, value, state, None)
            else:
                if device is None:
                    device = []
                device.append(len(v))
                append(value)
        if device is None:
            return v, None
        self.fast = None  # it leaves device values to this path: no more attempts
        now = [i for i in device if not self.late_only[i]]
        late = [i for i in device if self.late_only[i]]
        if now:
            copy_to_host(v, now, v)
        return v, start_device_copy(v, late) if late else None

    def _missing(self, name: str, outputs: Mapping[str, Any], state: TrainState) -> FetchError:
        askers = dict.fromkeys(
            plan.describe() for plan in self._required_by[self.names.index(name)]
        )
        known = {str(key).lower(): key for key in [*outputs, *state]}
        close = [known[k] for k in difflib.get_close_matches(name.lower(), known, n=1)]
        return FetchError(
            f"{', '.join(askers)} asked to fetch {name!r} at step {state.global_step}, but the "
            f"step returned outputs {sorted(outputs)} and the state has entries {sorted(state)}"
            + (f"; did you mean {close[0]!r}?" if close else "")
            + f" (monitored.optional({name!r}) accepts a missing value as None)"
        )


#: ``_how``'s answer for a coroutine or other awaitable: never a value to fetch.
_AWAITABLE: Final = 4


def _unconvertible(name: str, value: Any, state: TrainState, error: Exception | None) -> FetchError:
    """The error naming a fetched value that is no array: what it is and the fix.

    A coroutine is a step that forgot an ``await`` (``return {"loss": compute()}``
    with ``async def compute``); a tensor that requires grad (PyTorch) converts only
    once detached. Said where the value is first fetched, not as a hook's odd result.
    """
    at = f"step output {name!r} at step {state.global_step}"
    if error is None:
        if inspect.iscoroutine(value):
            value.close()  # never awaited: closed, so Python adds no second warning
        return FetchError(
            f"{at} is {type(value).__name__} {getattr(value, '__qualname__', '')!s}, not a "
            "value: did you forget `await` where the step computes it?".replace("  ", " ")
        )
    hint = ""
    if getattr(value, "requires_grad", False) and callable(getattr(value, "detach", None)):
        hint = (
            f"; it requires grad: return {name!r} detached (`loss.detach()`, or "
            "`loss.item()` for a number) so no autograd graph is kept"
        )
    return FetchError(
        f"{at} ({type(value).__module__}.{type(value).__qualname__}) cannot be fetched as a "
        f"NumPy array: {type(error).__name__}: {error}{hint}"
    )


_NO_ANSWERS: Final[dict[int, SessionRunValues]] = {}

#: How many step plans a :class:`Fetcher` keeps for reuse (the oldest is dropped).
_STEP_PLANS_KEPT: Final = 8


@final
class Fetcher:
    """A session's fetching: plans cached per hook, answers one step late on request.

    A hook whose ``SessionRunArgs`` has ``lag=1`` receives, in ``after_run`` of
    step *k*, its values of step *k - 1*; :attr:`pending` holds them in between
    (on CuPy, as a transfer still running). :meth:`flush` delivers what is pending
    when the session stops, so nothing asked for is dropped.
    """

    __slots__ = ("_last", "_plans", "_step_plan", "_step_plans", "pending")

    def __init__(self) -> None:
        #: The last plan of each hook, by plugin index.
        self._plans: dict[int, FetchPlan] = {}
        self._last: list[FetchPlan] = []
        self._step_plan: StepPlan | None = None
        #: The step plans made lately, by their hooks' plans: a hook that asks every
        #: N steps (a summary writer) switches between two step plans, each made once.
        self._step_plans: dict[tuple[FetchPlan, ...], StepPlan] = {}
        #: Late answers still to be delivered: (plan, host values, running copy).
        self.pending: tuple[StepPlan, list[Any], DeviceCopy | None] | None = None

    def answers(
        self,
        requests: Sequence[tuple[HookCall, SessionRunArgs]],
        outputs: Mapping[str, Any],
        state: TrainState,
    ) -> dict[int, SessionRunValues]:
        """Every asking hook's answer of this step, by plugin index.

        Hooks that asked with ``lag=1`` at the previous step get those values now;
        hooks asking with ``lag=1`` now get theirs at the next step.
        """
        answers = _NO_ANSWERS
        pending = None
        if requests:
            step_plan = self._step_plan
            if step_plan is not None and step_plan.fast is not None and self.pending is None:
                fast = step_plan.fast(requests, outputs, state)
                if fast is not None:
                    return fast
            cache = self._plans
            plans = []
            for call, asked in requests:
                plan = cache.get(call.plugin_index)
                fetches = asked.fetches
                if fetches is SCALAR_OUTPUTS:  # named now that the step has returned
                    fetches = scalar_output_fetches(outputs)
                if plan is None or not (
                    (fetches is plan.source and plan.constant and asked.lag == plan.lag)
                    or plan.matches(fetches, asked.lag)
                ):
                    plan = cache[call.plugin_index] = FetchPlan(
                        fetches, call.info.describe, call.plugin_index, asked.lag
                    )
                plans.append(plan)
            if step_plan is None or plans != self._last:
                step_plan = self._step_plan = self._step_plan_of(plans)
                self._last = plans
            values, copy = step_plan.collect(outputs, state)
            if step_plan.now is not None:
                answers = step_plan.now(values)
            if step_plan.late is not None:
                pending = (step_plan, values, copy)
        if self.pending is not None:
            late = self.flush()
            if answers:
                if not answers.keys().isdisjoint(late):
                    raise self._overlap(answers.keys() & late.keys(), state)
                answers.update(late)
            else:
                answers = late
        self.pending = pending
        return answers

    def _step_plan_of(self, plans: list[FetchPlan]) -> StepPlan:
        """The step plan of ``plans``: one made lately for the same plans, or a new one."""
        kept = self._step_plans
        key = tuple(plans)
        step_plan = kept.get(key)
        if step_plan is None:
            if len(kept) >= _STEP_PLANS_KEPT:
                del kept[next(iter(kept))]  # the oldest
            step_plan = kept[key] = StepPlan(plans)
        return step_plan

    def pending_for(self) -> set[int]:
        """The plugin indices of the hooks whose lagged values are still to be delivered."""
        if self.pending is None:
            return set()
        return {plan.index for plan in self.pending[0].plans if plan.lag}

    def flush(self) -> dict[int, SessionRunValues]:
        """The answers still pending (from the previous step), now; ``{}`` if none."""
        pending, self.pending = self.pending, None
        if pending is None:
            return {}
        step_plan, values, copy = pending
        if copy is not None:
            copy.finish(values)
        assert step_plan.late is not None
        return step_plan.late(values)

    def _overlap(self, indices: set[int], state: TrainState) -> FetchError:
        who = ", ".join(self._plans[i].describe() for i in sorted(indices))
        return FetchError(
            f"{who} asked for values without lag at step {state.global_step} while its values "
            "of the step before, asked for with lag=1, are still to be delivered; a hook gets "
            "one answer per step: keep lag=1 on consecutive steps (or skip a step between)"
        )

    def drop(self) -> None:
        """Forget pending answers (the session failed: no hook runs any more).

        A device-to-host copy still running is waited for first
        (:meth:`~monitored._core._backend.DeviceCopy.discard`): its buffers must not
        be released while the copy reads and writes them.
        """
        pending, self.pending = self.pending, None
        if pending is not None and pending[2] is not None:
            pending[2].discard()


def fetch_many(
    requests: Sequence[tuple[Any, Callable[[], str]]],
    outputs: Mapping[str, Any],
    state: TrainState,
) -> list[Any]:
    """Resolve each ``(fetches, describe)`` request now; one host transfer for all.

    Plans are made for this call only (``session.fetch`` and one-off users).
    """
    step_plan = StepPlan(
        [
            FetchPlan(scalar_output_fetches(outputs) if f is SCALAR_OUTPUTS else f, d, i)
            for i, (f, d) in enumerate(requests)
        ]
    )
    values, _ = step_plan.collect(outputs, state)
    answers = step_plan.now(values) if step_plan.now is not None else {}
    return [answers[i].results for i in range(len(requests))]
