"""TF1's optimizers over a ``TrainState``, for NumPy and CuPy arrays.

Variables are entries of the state; gradients come from your own code, as a
mapping ``name -> gradient`` or TF1's list of ``(gradient, name)`` pairs, each
an array of the variable's shape and dtype or a row-sparse :class:`IndexedSlices`.
Updates happen in place; slots are state entries named
``"<variable>/<optimizer name>/<slot>"`` so checkpoints hold them.

>>> import numpy as np
>>> from monitored import TrainState
>>> from monitored.train.optimizers import AdamOptimizer
>>> state = TrainState({"w": np.ones(3, dtype=np.float32)})
>>> opt = AdamOptimizer(learning_rate=0.1)
>>> opt.apply_gradients(state, {"w": np.ones(3, dtype=np.float32)})
>>> state.global_step, sorted(state)
(1, ['Adam/beta1_power', 'Adam/beta2_power', 'w', 'w/Adam/m', 'w/Adam/v'])

See ``docs/training.md`` for the update rules, sparse semantics and slot names.
"""

from __future__ import annotations

from ._adadelta import AdadeltaOptimizer
from ._adagrad import AdagradOptimizer
from ._adagrad_da import AdagradDAOptimizer
from ._adam import AdamOptimizer, AdamWOptimizer, LazyAdamOptimizer
from ._base import GradsAndVars, Optimizer
from ._ftrl import FtrlOptimizer
from ._gradient_descent import GradientDescentOptimizer
from ._indexed_slices import IndexedSlices
from ._momentum import MomentumOptimizer
from ._proximal import ProximalAdagradOptimizer, ProximalGradientDescentOptimizer
from ._rmsprop import RMSPropOptimizer
from ._types import Array, LearningRate
from ._variables import trainable_variables

#: Shorter names (Keras/PyTorch style) for the same classes.
SGD = GradientDescentOptimizer
Momentum = MomentumOptimizer
Adagrad = AdagradOptimizer
AdagradDA = AdagradDAOptimizer
Adadelta = AdadeltaOptimizer
Adam = AdamOptimizer
AdamW = AdamWOptimizer
LazyAdam = LazyAdamOptimizer
RMSProp = RMSPropOptimizer
Ftrl = FtrlOptimizer
ProximalGradientDescent = ProximalGradientDescentOptimizer
ProximalAdagrad = ProximalAdagradOptimizer

__all__ = [
    "SGD",
    "Adadelta",
    "AdadeltaOptimizer",
    "Adagrad",
    "AdagradDA",
    "AdagradDAOptimizer",
    "AdagradOptimizer",
    "Adam",
    "AdamOptimizer",
    "AdamW",
    "AdamWOptimizer",
    "Array",
    "Ftrl",
    "FtrlOptimizer",
    "GradientDescentOptimizer",
    "GradsAndVars",
    "IndexedSlices",
    "LazyAdam",
    "LazyAdamOptimizer",
    "LearningRate",
    "Momentum",
    "MomentumOptimizer",
    "Optimizer",
    "ProximalAdagrad",
    "ProximalAdagradOptimizer",
    "ProximalGradientDescent",
    "ProximalGradientDescentOptimizer",
    "RMSProp",
    "RMSPropOptimizer",
    "trainable_variables",
]
