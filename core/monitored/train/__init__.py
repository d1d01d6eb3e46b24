"""TF1's ``tf.train`` toolkit over the arrays of a :class:`~monitored.TrainState`.

Optimizers (:mod:`monitored.train.optimizers`), learning-rate schedules
(:mod:`monitored.train.schedules`), gradient clipping (:mod:`monitored.train.clipping`),
moving averages (:mod:`monitored.train.moving_averages`), gradient checking
(:mod:`monitored.train.gradient_checker`) and warm starts from another run's
checkpoint (:mod:`monitored.train.warm_starting`), for NumPy and CuPy arrays alike. Every
name is also exported from ``monitored`` itself.
"""

from .clipping import (
    clip_by_average_norm,
    clip_by_global_norm,
    clip_by_norm,
    clip_by_value,
    global_norm,
)
from .gradient_checker import compute_gradient, compute_gradient_error
from .moving_averages import ExponentialMovingAverage, assign_moving_average, ensure_zero_debias
from .optimizers import (
    AdadeltaOptimizer,
    AdagradDAOptimizer,
    AdagradOptimizer,
    AdamOptimizer,
    AdamWOptimizer,
    FtrlOptimizer,
    GradientDescentOptimizer,
    IndexedSlices,
    LazyAdamOptimizer,
    MomentumOptimizer,
    Optimizer,
    ProximalAdagradOptimizer,
    ProximalGradientDescentOptimizer,
    RMSPropOptimizer,
    trainable_variables,
)
from .schedules import (
    LearningRateSchedule,
    cosine_decay,
    cosine_decay_restarts,
    exponential_decay,
    inverse_time_decay,
    linear_warmup,
    natural_exp_decay,
    piecewise_constant,
    polynomial_decay,
)
from .warm_starting import WarmStartError, warm_start

__all__ = [
    "AdadeltaOptimizer",
    "AdagradDAOptimizer",
    "AdagradOptimizer",
    "AdamOptimizer",
    "AdamWOptimizer",
    "ExponentialMovingAverage",
    "FtrlOptimizer",
    "GradientDescentOptimizer",
    "IndexedSlices",
    "LazyAdamOptimizer",
    "LearningRateSchedule",
    "MomentumOptimizer",
    "Optimizer",
    "ProximalAdagradOptimizer",
    "ProximalGradientDescentOptimizer",
    "RMSPropOptimizer",
    "WarmStartError",
    "assign_moving_average",
    "clip_by_average_norm",
    "clip_by_global_norm",
    "clip_by_norm",
    "clip_by_value",
    "compute_gradient",
    "compute_gradient_error",
    "cosine_decay",
    "cosine_decay_restarts",
    "ensure_zero_debias",
    "exponential_decay",
    "global_norm",
    "inverse_time_decay",
    "linear_warmup",
    "natural_exp_decay",
    "piecewise_constant",
    "polynomial_decay",
    "trainable_variables",
    "warm_start",
]
