"""Without ``mpiexec``: the plugin leaves the session as it is, and its errors."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

import numpy as np
import pytest
from _standin_device import StandinCupy, standin_cupy

import monitored
import monitored_mpi
import monitored_mpi._plugin
from monitored_mpi import _world

__all__ = ["standin_cupy"]  # the stand-in CuPy fixture


@pytest.fixture
def unprobed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget what this process found out about MPI, and clear launcher variables."""
    monkeypatch.setattr(_world, "_probed", False)
    monkeypatch.setattr(_world, "_world", None)
    for name in _world.LAUNCHER_ENV:
        monkeypatch.delenv(name, raising=False)


async def test_a_single_process_trains_as_without_the_plugin(unprobed: None) -> None:
    state = monitored.TrainState({"w": np.zeros(2)})

    def step(state: monitored.TrainState) -> None:
        state["w"] += 1
        state.global_step += 1

    async with monitored.MonitoredSession(
        state, hooks=[monitored.StopAtStepHook(last_step=3)]
    ) as sess:
        assert sess.is_chief
        assert "mpi" in [info.name for info in sess.plugins]
        while not sess.should_stop():
            await sess.run(step)
    assert state.global_step == 3
    assert monitored_mpi.world() is None
    assert (monitored_mpi.rank(), monitored_mpi.size()) == (0, 1)


def test_mpi4py_missing_under_a_launcher_names_the_package(
    unprobed: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PMI_RANK", "0")
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    with pytest.raises(
        monitored_mpi.MPIUnavailableError, match=r"PMI_RANK is set.*pip install mpi4py mpich"
    ):
        monitored_mpi.world()


@pytest.mark.parametrize("value", ["soon", "0", "-3"])
def test_a_bad_timeout_names_the_variable(
    unprobed: None, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(monitored_mpi.TIMEOUT_ENV, value)
    with pytest.raises(monitored_mpi.MPIError, match="MONITORED_MPI_TIMEOUT"):
        _world._timeout_from_env()


def test_the_helpers_alone_are_what_one_rank_of_one_gets(unprobed: None) -> None:
    x = np.array([1.0, 2.0])
    for out in (monitored_mpi.allreduce(x), monitored_mpi.broadcast(x)):
        assert out is not x
        np.testing.assert_array_equal(out, x)
    [gathered] = monitored_mpi.allgather(x)
    np.testing.assert_array_equal(gathered, x)
    with pytest.raises(ValueError, match="op must be mean, sum, min or max"):
        monitored_mpi.allreduce(x, "median")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="allreduce 'g': expected a NumPy or CuPy array, got list"):
        monitored_mpi.allreduce([1.0], name="g")


def test_the_distributed_optimizer_alone_passes_gradients_through(unprobed: None) -> None:
    inner = monitored.train.GradientDescentOptimizer(0.5)
    opt = monitored_mpi.DistributedOptimizer(inner)
    grads = {"w": np.ones(2)}
    assert opt.reduce_gradients(grads) is grads
    state = monitored.TrainState({"w": np.zeros(2)})
    opt.apply_gradients(state, grads)
    np.testing.assert_array_equal(state["w"], [-0.5, -0.5])
    assert state.global_step == 1
    assert opt.optimizer is inner
    assert opt.get_name() == inner.get_name()


def test_the_distributed_optimizer_refuses_what_it_cannot_wrap() -> None:
    with pytest.raises(TypeError, match="wraps a monitored.train optimizer, got str"):
        monitored_mpi.DistributedOptimizer("sgd")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="compression must be None or 'fp16'"):
        monitored_mpi.DistributedOptimizer(
            monitored.train.GradientDescentOptimizer(0.1),
            compression="int8",  # type: ignore[arg-type]
        )


class _NeverDone:
    def Test(self) -> bool:
        return False


def test_a_collective_that_never_completes_times_out_naming_it() -> None:
    world: Any = object.__new__(_world.World)
    world.rank, world.size, world.timeout, world.heartbeat, world.hint = 1, 3, 0.05, None, ""
    with pytest.raises(
        monitored_mpi.CollectiveTimeoutError, match="allreduce 'g': rank 1 of 3 waited 0.05s"
    ):
        world.wait(_NeverDone(), "allreduce 'g'")


def test_per_rank_streams_jump_from_the_chiefs() -> None:
    base = np.random.default_rng(7)
    assert monitored_mpi.jump_rng(base, 0) is base
    one = monitored_mpi.jump_rng(np.random.default_rng(7), 1)
    assert one.normal() != np.random.default_rng(7).normal()
    again = monitored_mpi.jump_rng(np.random.default_rng(7), 1)
    assert again.normal() == monitored_mpi.jump_rng(np.random.default_rng(7), 1).normal()
    with pytest.raises(monitored_mpi.MPIError, match="SFC64, which cannot jump"):
        monitored_mpi.jump_rng(np.random.Generator(np.random.SFC64(1)), 2)


def test_state_problems_name_each_array() -> None:
    from monitored_mpi._share import _problems

    chief = {"w": [[3], "float32", True], "b": [[], "float32", True]}
    mine = {"w": [[4], "float64", False], "c": [[], "float32", True]}
    assert _problems(chief, mine) == [
        "array 'b' is missing here",
        "array 'c' is not on the chief",
        "array 'w' has shape (4,) here, (3,) on the chief",
        "array 'w' has dtype float64 here, float32 on the chief",
        "array 'w' is not trainable here, trainable on the chief",
    ]


def test_a_plugin_state_json_cannot_hold_is_refused_naming_the_plugin() -> None:
    from monitored_mpi._share import encode_manifest

    state = monitored.TrainState(rng=np.random.Generator(np.random.Philox(3)))
    good = json.loads(encode_manifest(state, {"early": {"version": 1, "state": {"best": 1.0}}}))
    assert monitored.decode_rng_state(good["rng"])["bit_generator"] == "Philox"
    with pytest.raises(
        monitored_mpi.UnshareableStateError,
        match="the state of plugin 'early' cannot be sent to the other ranks: it must be JSON",
    ):
        encode_manifest(state, {"early": {"version": 1, "state": {"when": object()}}})


def test_entries_of_the_chiefs_init_fn_are_created_here() -> None:
    from monitored_mpi._share import _create_entries

    state = monitored.TrainState({"w": np.ones(2)})
    manifest = {"arrays": {"w": [[2], "float64", True], "p": [[2, 3], "float32", False]}}
    _create_entries(state, manifest, 1)
    assert (state["p"].shape, state["p"].dtype, state.is_trainable("p")) == (
        (2, 3),
        np.float32,
        False,
    )
    assert state["w"].tolist() == [1.0, 1.0]
    with pytest.raises(
        monitored_mpi.StateMismatchError,
        match="rank 1: array 'q', which the chief's init_fn creates, has dtype float99",
    ):
        _create_entries(state, {"arrays": {"q": [[1], "float99", True]}}, 1)


def test_gradient_layouts_are_compared_naming_the_variables() -> None:
    from monitored_mpi._optimizer import _layout_problems

    chief = "compression None\nw\tfloat32 (3,)\nb\tfloat32 ()"
    assert _layout_problems(chief, chief) == []
    assert _layout_problems(chief, "compression None\nb\tfloat32 ()\nw\tfloat32 (3,)") == [
        "the variables in the order ['b', 'w'], rank 0 in the order ['w', 'b']"
    ]
    assert _layout_problems(chief, "compression fp16\nw\tfloat32 (3,)") == [
        "compression fp16 here, compression None on rank 0",
        "no gradient for 'b' here (rank 0 passes one)",
    ]


# -- issue 22: Horovod's names ------------------------------------------------------------------
def test_local_rank_and_local_size_alone_are_0_and_1(unprobed: None) -> None:
    assert (monitored_mpi.local_rank(), monitored_mpi.local_size()) == (0, 1)


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("init", "not needed: MPI is initialized when it is first needed"),
        ("shutdown", "not needed: MPI is finalized when the process exits"),
        (
            "BroadcastGlobalVariablesHook",
            "the chief's state (arrays, global step, RNG, plugin states) is broadcast to every "
            "rank when the session is created: drop the hook",
        ),
        ("broadcast_global_variables", "monitored_mpi.broadcast(x, root=0)"),
        ("broadcast_variables", "is broadcast to every rank when the session is created"),
        ("Adasum", "not supported: DistributedOptimizer averages (op=Average) or sums"),
        ("DistributedGradientTape", "not needed: there is no gradient tape"),
    ],
)
def test_horovod_names_with_no_meaning_here_say_why(name: str, says: str) -> None:
    with pytest.raises(AttributeError, match=f"monitored_mpi.{name}: ") as info:
        getattr(monitored_mpi, name)
    assert says in str(info.value)
    assert "From Horovod" in str(info.value)


def test_an_unknown_name_is_a_plain_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'nothing_like_this'"):
        monitored_mpi.nothing_like_this  # noqa: B018
    assert not hasattr(monitored_mpi, "init")


def test_horovods_constants_are_what_the_functions_take() -> None:
    assert (monitored_mpi.Average, monitored_mpi.Sum) == ("mean", "sum")
    assert (monitored_mpi.Compression.none, monitored_mpi.Compression.fp16) == (None, "fp16")
    sgd = monitored.train.GradientDescentOptimizer(0.1)
    opt = monitored_mpi.DistributedOptimizer(
        sgd, op=monitored_mpi.Sum, compression=monitored_mpi.Compression.fp16
    )
    assert "op='sum'" in repr(opt)
    x = np.arange(3.0)
    np.testing.assert_array_equal(monitored_mpi.allreduce(x, monitored_mpi.Sum), x)


@pytest.mark.parametrize(
    ("argument", "says"),
    [
        ("name", "there is no graph"),
        ("device_dense", "arrays stay where they are"),
        ("sparse_as_dense", "IndexedSlices gradients are gathered"),
        ("backward_passes_per_step", "add up the gradients of several batches"),
        ("groups", "already fused into one reduction per step"),
        ("process_set", "every rank of the job takes part"),
    ],
)
def test_horovods_optimizer_arguments_with_no_meaning_here_say_why(
    argument: str, says: str
) -> None:
    sgd = monitored.train.GradientDescentOptimizer(0.1)
    with pytest.raises(
        monitored.UnsupportedArgumentError, match=rf"DistributedOptimizer\({argument}=...\): "
    ) as info:
        monitored_mpi.DistributedOptimizer(sgd, **{argument: 1})
    assert says in str(info.value)


def test_gradient_predivide_factor_other_than_1_says_it_is_not_needed() -> None:
    sgd = monitored.train.GradientDescentOptimizer(0.1)
    monitored_mpi.DistributedOptimizer(sgd, gradient_predivide_factor=1.0)  # Horovod's default
    with pytest.raises(monitored.UnsupportedArgumentError, match="summed in float32"):
        monitored_mpi.DistributedOptimizer(sgd, gradient_predivide_factor=2.0)


def test_the_distributed_optimizer_refuses_an_unknown_op_or_argument() -> None:
    sgd = monitored.train.GradientDescentOptimizer(0.1)
    with pytest.raises(ValueError, match="Adasum is not supported"):
        monitored_mpi.DistributedOptimizer(sgd, op="adasum")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="unexpected keyword argument 'learning_rat'"):
        monitored_mpi.DistributedOptimizer(sgd, learning_rat=0.1)


async def test_monitored_mpi_says_it_is_inactive_in_a_single_process(
    unprobed: None, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    monkeypatch.delenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    caplog.set_level(logging.INFO, "monitored")
    async with monitored.MonitoredSession(monitored.TrainState()):
        pass
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Loaded")]
    assert "mpi (monitored-mpi " in line
    assert "; inactive: it supplied no cluster, this process trains alone)" in line


async def test_the_cluster_argument_takes_the_cluster_over_from_monitored_mpi(
    unprobed: None, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    monkeypatch.delenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    asked: list[object] = []
    monkeypatch.setattr(monitored_mpi._plugin, "world", lambda: asked.append(1))
    caplog.set_level(logging.DEBUG, "monitored")
    cluster = monitored.LocalCluster(is_chief=True)
    async with monitored.MonitoredSession(monitored.TrainState(), cluster=cluster) as sess:
        assert sess.cluster is cluster
        assert "mpi" not in [info.name for info in sess.plugins]
    assert asked == [], "the plugin was not asked for a cluster"
    [line] = [r.getMessage() for r in caplog.records if "steps aside" in r.getMessage()]
    assert "plugin 'mpi' (monitored-mpi " in line
    assert "the cluster= argument provides 'cluster'" in line


def test_a_worker_takes_the_chiefs_arrays_into_its_cupy_entries_in_place(
    standin_cupy: StandinCupy,
) -> None:
    """Contiguous, Fortran-ordered and strided CuPy entries (``set`` refuses the last)."""
    from monitored_mpi._share import _assign, _create_entries

    cupy = standin_cupy.module
    state = monitored.TrainState(
        {
            "c": cupy.zeros((2, 3), dtype=cupy.float32),
            "f": cupy.zeros((3, 2), dtype=cupy.float32).T,
            "s": cupy.zeros(8, dtype=cupy.float64)[::2],
            "z": cupy.zeros((), dtype=cupy.int64),
        }
    )
    _create_entries(
        state, {"arrays": {"new": [[2], "float32", True]}, "modules": {"new": "cupy"}}, 1
    )
    assert isinstance(state["new"], cupy.ndarray)
    rng = np.random.default_rng(0)
    for name in ("c", "f", "s", "z", "new"):
        held = state[name]
        chief = np.asarray(rng.standard_normal(held.shape) * 10).astype(held.dtype)
        _assign(state, name, held, chief.copy(order="C"))
        assert state[name] is held
        np.testing.assert_array_equal(held.get(), chief)


def test_the_chiefs_dtype_name_is_printed_escaped() -> None:
    """Issue 34 §2: what the chief sends (another process's words) is named escaped."""
    from _hostile import HOSTILE, assert_safe_line

    from monitored_mpi._share import StateMismatchError, _create_entries

    manifest = {"arrays": {"w": [[2], HOSTILE, True]}}
    with pytest.raises(StateMismatchError) as info:
        _create_entries(monitored.TrainState(), manifest, rank=1)
    assert_safe_line(str(info.value))
