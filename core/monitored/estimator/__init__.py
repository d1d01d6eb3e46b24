"""TF's Estimator on arrays: ``model_fn``, ``EstimatorSpec``, ``train``/``evaluate``/``predict``.

``Estimator(model_fn, model_dir, config=RunConfig(...), params=...)`` trains,
evaluates and predicts through :func:`~monitored.MonitoredTrainingSession` and
the installed plugins; ``model_fn(features, labels, mode, params, config)``
runs on one batch of NumPy or CuPy arrays and returns an
:class:`EstimatorSpec`. :class:`Experiment` and :mod:`.learn_runner` are
``tf.contrib.learn``'s. See ``docs/estimator.md``.
"""

from . import learn_runner as learn_runner  # the module, as tf.contrib.learn.learn_runner
from ._config import RunConfig
from ._errors import EstimatorError, ModelFnError
from ._estimator import Estimator
from ._experiment import Experiment
from ._inputs import numpy_input_fn
from ._spec import EstimatorSpec, MetricSpec, ModeKeys
from ._variables import (
    current_state,
    get_global_step,
    get_variable,
    glorot_uniform_initializer,
    zeros_initializer,
)

__all__ = [
    "Estimator",
    "EstimatorError",
    "EstimatorSpec",
    "Experiment",
    "MetricSpec",
    "ModeKeys",
    "ModelFnError",
    "RunConfig",
    "current_state",
    "get_global_step",
    "get_variable",
    "glorot_uniform_initializer",
    "numpy_input_fn",
    "zeros_initializer",
]

# Tracebacks name the public path of an error, as the core's do, not its private module.
for _name in __all__:
    _value = globals()[_name]
    if isinstance(_value, type) and issubclass(_value, BaseException):
        _value.__module__ = __name__
del _name, _value
