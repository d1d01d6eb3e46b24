"""One optimizer update of 10M float32 parameters: monitored vs the same rule inline.

For every optimizer (and the moving-average update) this times
``opt.apply_gradients(state, {"w": g})`` on a 10M-element float32 variable
against the shortest NumPy expression of the same update rule, written inline
below and run in the same process on arrays of the same size. Both are timed
alternately, after a warm-up call, and the medians are compared; the ratio is
monitored's time over the inline expression's (below 1: monitored is faster).

The inline expressions allocate a temporary per operation; monitored updates
in place, a cache-sized chunk at a time (see ``monitored/optimizers/_elementwise.py``).
With ``--cupy`` both run on the GPU (monitored as one fused kernel per update).

    python benchmarks/optimizers.py [--size 10000000] [--repeats 9] [--cupy]

Prints a markdown table and the command that produced it.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

import monitored
from monitored.train.moving_averages import ExponentialMovingAverage
from monitored.train.optimizers import (
    AdadeltaOptimizer,
    AdagradDAOptimizer,
    AdagradOptimizer,
    AdamOptimizer,
    AdamWOptimizer,
    FtrlOptimizer,
    GradientDescentOptimizer,
    MomentumOptimizer,
    ProximalAdagradOptimizer,
    ProximalGradientDescentOptimizer,
    RMSPropOptimizer,
)

LR, MU, RHO, EPS, B1, B2, WD, L1, L2 = 0.01, 0.9, 0.9, 1e-7, 0.9, 0.999, 1e-4, 1e-3, 1e-3

Arrays = dict[str, Any]


# -- the inline expressions: the shortest NumPy form of each rule ----------------------


def sgd(xp: ModuleType, a: Arrays) -> None:
    a["w"] -= LR * a["g"]


def momentum(xp: ModuleType, a: Arrays) -> None:
    w, g, acc = a["w"], a["g"], a["s0"]
    acc *= MU
    acc += g
    w -= LR * acc


def nesterov(xp: ModuleType, a: Arrays) -> None:
    w, g, acc = a["w"], a["g"], a["s0"]
    acc *= MU
    acc += g
    w -= LR * g + LR * MU * acc


def adagrad(xp: ModuleType, a: Arrays) -> None:
    w, g, acc = a["w"], a["g"], a["s0"]
    acc += g * g
    w -= LR * g / xp.sqrt(acc)


def adagrad_da(xp: ModuleType, a: Arrays) -> None:
    w, g, gacc, gsq = a["w"], a["g"], a["s0"], a["s1"]
    gacc += g
    gsq += g * g
    w[...] = -LR * gacc / (L2 * LR + xp.sqrt(gsq))


def adadelta(xp: ModuleType, a: Arrays) -> None:
    w, g, acc, acc_up = a["w"], a["g"], a["s0"], a["s1"]
    acc += (1 - RHO) * (g * g - acc)
    update = xp.sqrt(acc_up + EPS) / xp.sqrt(acc + EPS) * g
    w -= LR * update
    acc_up += (1 - RHO) * (update * update - acc_up)


def adam(xp: ModuleType, a: Arrays) -> None:
    w, g, m, v = a["w"], a["g"], a["s0"], a["s1"]
    m += (1 - B1) * (g - m)
    v += (1 - B2) * (g * g - v)
    w -= LR * m / (xp.sqrt(v) + EPS)


def adamw(xp: ModuleType, a: Arrays) -> None:
    a["w"] -= WD * a["w"]
    adam(xp, a)


def rmsprop(xp: ModuleType, a: Arrays) -> None:
    w, g, ms, mom = a["w"], a["g"], a["s0"], a["s1"]
    ms += (1 - RHO) * (g * g - ms)
    mom *= MU
    mom += LR * g / xp.sqrt(ms + EPS)
    w -= mom


def centered_rmsprop(xp: ModuleType, a: Arrays) -> None:
    w, g, ms, mom, mg = a["w"], a["g"], a["s0"], a["s1"], a["s2"]
    ms += (1 - RHO) * (g * g - ms)
    mg += (1 - RHO) * (g - mg)
    mom *= MU
    mom += LR * g / xp.sqrt(ms - mg * mg + EPS)
    w -= mom


def ftrl(xp: ModuleType, a: Arrays) -> None:
    w, g, acc, lin = a["w"], a["g"], a["s0"], a["s1"]
    new = acc + g * g
    lin += g - (xp.sqrt(new) - xp.sqrt(acc)) / LR * w
    quadratic = xp.sqrt(new) / LR + 2 * L2
    w[...] = xp.where(xp.abs(lin) > L1, (xp.sign(lin) * L1 - lin) / quadratic, 0)
    acc[...] = new


def proximal_gd(xp: ModuleType, a: Arrays) -> None:
    p = a["w"] - LR * a["g"]
    a["w"][...] = xp.sign(p) * xp.maximum(xp.abs(p) - LR * L1, 0) / (1 + LR * L2)


def proximal_adagrad(xp: ModuleType, a: Arrays) -> None:
    w, g, acc = a["w"], a["g"], a["s0"]
    acc += g * g
    rate = LR / xp.sqrt(acc)
    p = w - rate * g
    w[...] = xp.sign(p) * xp.maximum(xp.abs(p) - rate * L1, 0) / (1 + rate * L2)


def ema(xp: ModuleType, a: Arrays) -> None:
    a["s0"] -= (1 - 0.999) * (a["s0"] - a["w"])


#: (name, the library's update as a function of the state, its slot count, inline rule)
CASES: list[tuple[str, Callable[[], Any], int, Callable[[ModuleType, Arrays], None]]] = [
    ("GradientDescent", lambda: GradientDescentOptimizer(LR), 0, sgd),
    ("Momentum", lambda: MomentumOptimizer(LR, MU), 1, momentum),
    ("Momentum (Nesterov)", lambda: MomentumOptimizer(LR, MU, use_nesterov=True), 1, nesterov),
    ("Adagrad", lambda: AdagradOptimizer(LR), 1, adagrad),
    ("AdagradDA", lambda: AdagradDAOptimizer(LR, l2_regularization_strength=L2), 2, adagrad_da),
    ("Adadelta", lambda: AdadeltaOptimizer(LR, RHO, EPS), 2, adadelta),
    ("Adam", lambda: AdamOptimizer(LR, B1, B2, EPS), 2, adam),
    ("AdamW", lambda: AdamWOptimizer(WD, LR, B1, B2, EPS), 2, adamw),
    ("RMSProp (momentum)", lambda: RMSPropOptimizer(LR, RHO, MU, EPS), 2, rmsprop),
    (
        "RMSProp (centered)",
        lambda: RMSPropOptimizer(LR, RHO, MU, EPS, centered=True),
        3,
        centered_rmsprop,
    ),
    ("Ftrl", lambda: FtrlOptimizer(LR, -0.5, 0.1, L1, L2), 2, ftrl),
    (
        "ProximalGradientDescent",
        lambda: ProximalGradientDescentOptimizer(LR, L1, L2),
        0,
        proximal_gd,
    ),
    ("ProximalAdagrad", lambda: ProximalAdagradOptimizer(LR, 0.1, L1, L2), 1, proximal_adagrad),
    ("ExponentialMovingAverage", lambda: ExponentialMovingAverage(0.999), 1, ema),
]


def _sync(xp: ModuleType) -> None:
    if xp is not np:
        xp.cuda.Device().synchronize()


def _timed(xp: ModuleType, call: Callable[[], None]) -> float:
    _sync(xp)
    start = time.perf_counter()
    call()
    _sync(xp)
    return time.perf_counter() - start


def run_case(
    xp: ModuleType,
    make: Callable[[], Any],
    n_slots: int,
    inline: Callable[[ModuleType, Arrays], None],
    size: int,
    repeats: int,
) -> tuple[float, float]:
    """Median seconds of one update: (monitored, inline)."""
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal(size, dtype=np.float32)
    g = xp.asarray(rng.standard_normal(size, dtype=np.float32))
    state = monitored.TrainState({"w": xp.asarray(w0)})
    updater = make()
    if isinstance(updater, ExponentialMovingAverage):

        def library() -> None:
            updater.apply(state, ["w"])

    else:
        updater.create_slots(state)

        def library() -> None:
            updater.apply_gradients(state, {"w": g}, global_step=False)

    arrays: Arrays = {"w": xp.asarray(w0), "g": g}
    for i in range(n_slots):
        arrays[f"s{i}"] = xp.full(size, 0.1, dtype=np.float32)
    library()  # warm-up (creates the moving average; compiles CuPy kernels)
    inline(xp, arrays)
    ours, theirs = [], []
    for _ in range(repeats):
        ours.append(_timed(xp, library))
        theirs.append(_timed(xp, lambda: inline(xp, arrays)))
    return statistics.median(ours), statistics.median(theirs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=10_000_000)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--cupy", action="store_true", help="run on the GPU with CuPy")
    args = parser.parse_args(argv)
    if args.cupy:
        import cupy

        xp: ModuleType = cupy
        device = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    else:
        xp = np
        device = f"{platform.machine()}, {os.cpu_count()} CPUs"
    command = "python benchmarks/optimizers.py " + " ".join(argv or sys.argv[1:])
    print(f"`{command.strip()}`: {args.size:,} float32 parameters, median of {args.repeats}")
    print(f"({device}; Python {platform.python_version()}, NumPy {np.__version__})\n")
    print("| update | monitored (ms) | inline NumPy (ms) | ratio |")
    print("|---|---:|---:|---:|")
    ratios = []
    for name, make, n_slots, inline in CASES:
        ours, theirs = run_case(xp, make, n_slots, inline, args.size, args.repeats)
        ratios.append(ours / theirs)
        print(f"| {name} | {ours * 1e3:.1f} | {theirs * 1e3:.1f} | {ours / theirs:.2f} |")
    geomean = math.exp(statistics.fmean(math.log(r) for r in ratios))
    print(f"\nratio: worst {max(ratios):.2f}, geometric mean {geomean:.2f} (target <= 1.3)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
