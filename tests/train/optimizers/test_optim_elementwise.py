"""The update-rule engine: chunking, layouts, row updates, and the CUDA bodies.

The CUDA bodies (what CuPy compiles into one fused kernel per update) are
checked without a GPU: each is compiled with the host C++ compiler inside a loop
that binds the variables the way ``cupy.ElementwiseKernel`` does (inputs by value,
outputs by reference, the row kernel's prefix from the library itself), and its
results must match the NumPy form of the same rule.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from monitored._core._state import TrainState
from monitored.train import moving_averages
from monitored.train.optimizers import AdamOptimizer, RMSPropOptimizer
from monitored.train.optimizers import _elementwise as engine
from monitored.train.optimizers._adadelta import ADADELTA
from monitored.train.optimizers._adagrad import ADAGRAD
from monitored.train.optimizers._adagrad_da import ADAGRAD_DA
from monitored.train.optimizers._adam import (
    ADAM,
    ADAM_STEP,
    ADAMW,
    ADD_MOMENTS,
    DECAY_MOMENTS,
    WEIGHT_DECAY,
)
from monitored.train.optimizers._ftrl import FTRL_POW, FTRL_SQRT
from monitored.train.optimizers._gradient_descent import SGD
from monitored.train.optimizers._momentum import MOMENTUM, NESTEROV
from monitored.train.optimizers._proximal import PROXIMAL_ADAGRAD, PROXIMAL_GD
from monitored.train.optimizers._rmsprop import CENTERED_RMSPROP, RMSPROP

RULES = [
    SGD,
    MOMENTUM,
    NESTEROV,
    ADAGRAD,
    ADAGRAD_DA,
    ADADELTA,
    ADAM,
    ADAMW,
    DECAY_MOMENTS,
    ADD_MOMENTS,
    ADAM_STEP,
    WEIGHT_DECAY,
    RMSPROP,
    CENTERED_RMSPROP,
    FTRL_SQRT,
    FTRL_POW,
    PROXIMAL_GD,
    PROXIMAL_ADAGRAD,
    moving_averages.EMA,
]

SCALARS: dict[str, tuple[float, ...]] = {
    "sgd": (0.1,),
    "momentum": (0.1, 0.9),
    "nesterov": (0.1, 0.9),
    "adagrad": (0.1,),
    "adagrad_da": (0.1, 0.05, 0.02),
    "adadelta": (0.5, 0.1, 1e-6),
    "adam": (0.01, 0.1, 0.001, 1e-8),
    "adamw": (0.01, 0.1, 0.001, 1e-8, 0.01),
    "adam_decay_moments": (0.9, 0.999),
    "adam_add_moments": (0.1, 0.001),
    "adam_step": (0.01, 1e-8),
    "weight_decay": (0.01,),
    "rmsprop": (0.01, 0.1, 0.5, 1e-6),
    "centered_rmsprop": (0.01, 0.1, 0.5, 1e-6),
    "ftrl_sqrt": (0.3, 0.05, 0.2, 0.04, 0.5),
    "ftrl_pow": (0.3, 0.05, 0.2, 0.04, 0.3),
    "proximal_gd": (0.1, 0.005, 1.02),
    "proximal_adagrad": (0.1, 0.05, 0.2),
    "ema": (0.1,),
}

#: Arrays that must be positive for the rule to be defined (square roots, powers).
POSITIVE = {"accum", "accum_update", "ms", "v", "gsq"}


def _arrays(names: tuple[str, ...], shape: tuple[int, ...], dtype: Any, seed: int) -> list[Any]:
    rng = np.random.default_rng(seed)
    arrays = []
    for name in names:
        if name in POSITIVE:
            arrays.append(rng.uniform(0.5, 2.0, shape).astype(dtype))
        elif name == "mg":
            arrays.append((0.1 * rng.standard_normal(shape)).astype(dtype))
        else:
            arrays.append(rng.standard_normal(shape).astype(dtype))
    return arrays


def test_every_rule_has_test_scalars() -> None:
    assert sorted(SCALARS) == sorted(rule.name for rule in RULES)
    for rule in RULES:
        assert len(SCALARS[rule.name]) == len(rule.scalars), rule.name


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.name)
def test_chunked_update_is_bit_identical_to_one_pass(
    rule: engine.UpdateRule, monkeypatch: pytest.MonkeyPatch
) -> None:
    chunk = engine.CHUNK_BYTES // 4
    shape = (3 * chunk + 17,)
    inputs = _arrays(rule.inputs, shape, np.float32, 1)
    chunked = _arrays(rule.outputs, shape, np.float32, 2)
    whole = [a.copy() for a in chunked]
    engine.run_dense(rule, inputs, chunked, SCALARS[rule.name])
    monkeypatch.setattr(engine, "CHUNK_BYTES", 1 << 40)
    engine.run_dense(rule, inputs, whole, SCALARS[rule.name])
    for a, b in zip(chunked, whole, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(chunked[0], _arrays(rule.outputs, shape, np.float32, 2)[0])


def test_non_contiguous_variable_is_updated_in_place() -> None:
    rng = np.random.default_rng(0)
    transposed = rng.standard_normal((70_000, 2)).astype(np.float32).T  # not C-contiguous
    initial = transposed.copy()
    state = TrainState({"w": transposed})
    contiguous = TrainState({"w": np.ascontiguousarray(transposed)})
    grad = np.ones((2, 70_000), np.float32)
    AdamOptimizer(0.1).apply_gradients(state, {"w": grad})
    AdamOptimizer(0.1).apply_gradients(contiguous, {"w": grad})
    assert state["w"] is transposed
    np.testing.assert_array_equal(transposed, contiguous["w"])
    assert np.all(transposed < initial)


def test_non_contiguous_gradient_with_chunking() -> None:
    n = 100_000
    grad = np.random.default_rng(0).standard_normal((2, n)).astype(np.float32)
    a = TrainState({"w": np.zeros(n, np.float32)})
    b = TrainState({"w": np.zeros(n, np.float32)})
    RMSPropOptimizer(0.1).apply_gradients(a, {"w": grad[1::-1][0]})  # a strided view
    RMSPropOptimizer(0.1).apply_gradients(b, {"w": grad[1].copy()})
    np.testing.assert_array_equal(a["w"], b["w"])


@pytest.mark.parametrize("shape", [(), (0,), (0, 3)])
def test_scalar_and_empty_variables(shape: tuple[int, ...]) -> None:
    state = TrainState({"w": np.ones(shape, np.float32)})
    AdamOptimizer(0.5).apply_gradients(state, {"w": np.ones(shape, np.float32)})
    assert state["w"].shape == shape
    if shape == ():
        assert state["w"] < 1


def test_run_rows_updates_only_those_rows() -> None:
    outputs = _arrays(ADAM.outputs, (5, 2), np.float64, 3)
    expected = [a.copy() for a in outputs]
    rows = np.array([1, 4], dtype=np.int64)
    values = np.ones((2, 2))
    engine.run_rows(ADAM, rows, (values,), outputs, SCALARS["adam"])
    parts = [a[rows] for a in expected]
    engine.run_dense(ADAM, (values,), parts, SCALARS["adam"])
    for full, part in zip(expected, parts, strict=True):
        full[rows] = part
    for a, b in zip(outputs, expected, strict=True):
        np.testing.assert_array_equal(a, b)


# -- the CUDA bodies, compiled for the host ------------------------------------------

_CXX = shutil.which("c++") or shutil.which("g++")


def _harness(rule: engine.UpdateRule) -> str:
    name = rule.name
    scalars = "".join(f", T {s}" for s in rule.scalars)
    dense_params = "".join(f", const T* {n}_in" for n in rule.inputs) + "".join(
        f", T* {n}_out" for n in rule.outputs
    )
    rows_params = "".join(f", const T* {n}_in" for n in rule.inputs) + "".join(
        f", T* {n}_arr" for n in rule.outputs
    )
    bind_in = "".join(f"    const T {n} = {n}_in[i];\n" for n in rule.inputs)
    bind_out = "".join(f"    T &{n} = {n}_out[i];\n" for n in rule.outputs)
    dense = (
        f"template <typename T>\nvoid dense_{name}(ptrdiff_t n{dense_params}{scalars}) {{\n"
        f"  for (ptrdiff_t i = 0; i < n; ++i) {{\n{bind_in}{bind_out}    {{\n{rule.cuda}\n    }}\n"
        "  }\n}\n"
    )
    rows = (
        f"template <typename T>\nvoid rows_{name}(ptrdiff_t n, const long long* rows_, "
        f"long long row_size_{rows_params}{scalars}) {{\n"
        f"  for (ptrdiff_t i = 0; i < n; ++i) {{\n{bind_in}    {{\n"
        f"{engine.cuda_rows_body(rule)}\n    }}\n  }}\n}}\n"
    )
    exports = ""
    for suffix, ctype in (("f32", "float"), ("f64", "double")):
        d_args = "".join(f", const {ctype}* a{i}" for i in range(len(rule.inputs)))
        d_args += "".join(f", {ctype}* b{i}" for i in range(len(rule.outputs)))
        s_args = "".join(f", {ctype} s{i}" for i in range(len(rule.scalars)))
        names = "".join(f", a{i}" for i in range(len(rule.inputs)))
        names += "".join(f", b{i}" for i in range(len(rule.outputs)))
        names += "".join(f", s{i}" for i in range(len(rule.scalars)))
        exports += (
            f'extern "C" void dense_{name}_{suffix}(ptrdiff_t n{d_args}{s_args}) '
            f"{{ dense_{name}<{ctype}>(n{names}); }}\n"
            f'extern "C" void rows_{name}_{suffix}(ptrdiff_t n, const long long* r, long long k'
            f"{d_args}{s_args}) {{ rows_{name}<{ctype}>(n, r, k{names}); }}\n"
        )
    return dense + rows + exports


@pytest.fixture(scope="module")
def host_kernels(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    if _CXX is None:
        pytest.skip("no C++ compiler to check the CUDA bodies with")
    source = (
        "#include <cmath>\n#include <cstddef>\n"
        "using std::copysign; using std::fabs; using std::fmax; using std::fmin;\n"
        "using std::pow; using std::sqrt;\n" + "".join(_harness(rule) for rule in RULES)
    )
    folder = tmp_path_factory.mktemp("cuda_bodies")
    (folder / "bodies.cpp").write_text(source)
    library = Path(folder / "bodies.so")
    subprocess.run(
        [_CXX, "-O1", "-shared", "-fPIC", "-o", str(library), str(folder / "bodies.cpp")],
        check=True,
        capture_output=True,
    )
    return ctypes.CDLL(str(library))


def _pointer(array: np.ndarray) -> ctypes.c_void_p:
    return ctypes.c_void_p(array.ctypes.data)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.name)
def test_cuda_body_matches_the_numpy_rule(
    rule: engine.UpdateRule, dtype: Any, host_kernels: ctypes.CDLL
) -> None:
    suffix, scalar = ("f32", ctypes.c_float) if dtype == np.float32 else ("f64", ctypes.c_double)
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    scalars = SCALARS[rule.name]
    shape = (7, 3)
    inputs = _arrays(rule.inputs, shape, dtype, 4)
    outputs = _arrays(rule.outputs, shape, dtype, 5)

    expected = [a.copy() for a in outputs]
    engine.run_dense(rule, inputs, expected, scalars)
    fused = [a.copy() for a in outputs]
    getattr(host_kernels, f"dense_{rule.name}_{suffix}")(
        ctypes.c_ssize_t(inputs[0].size if inputs else outputs[0].size),
        *map(_pointer, inputs),
        *map(_pointer, fused),
        *map(scalar, scalars),
    )
    for a, b in zip(fused, expected, strict=True):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol)

    rows = np.array([0, 2, 6], dtype=np.int64)
    row_inputs = _arrays(rule.inputs, (3, 3), dtype, 6)
    expected = [a.copy() for a in outputs]
    engine.run_rows(rule, rows, row_inputs, expected, scalars)
    fused = [a.copy() for a in outputs]
    getattr(host_kernels, f"rows_{rule.name}_{suffix}")(
        ctypes.c_ssize_t(rows.size * 3),
        _pointer(rows),
        ctypes.c_longlong(3),
        *map(_pointer, row_inputs),
        *map(_pointer, fused),
        *map(scalar, scalars),
    )
    for a, b, original in zip(fused, expected, outputs, strict=True):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol)
        np.testing.assert_array_equal(a[[1, 3, 4, 5]], original[[1, 3, 4, 5]])
