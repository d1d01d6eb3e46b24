"""monitored: TensorFlow 1's monitored training session for async Python.

An async step loop over NumPy or CuPy arrays whose every hook is a pluggy
plugin; the big features (checkpoints, summaries, early stopping, NaN guards,
progress) are separately installed plugin packages.
"""

from importlib.metadata import PackageNotFoundError as _PackageNotFoundError
from importlib.metadata import version as _version

from ._backend import is_device_array, to_host
from ._basic_hooks import (
    FeedFnHook,
    FinalOpsHook,
    GlobalStepWaiterHook,
    LoggingTensorHook,
    StepCounterHook,
    StopAtStepHook,
)
from ._cluster import Cluster, LocalCluster
from ._config import TrainingConfig
from ._coordinator import Coordinator, LooperThread
from ._errors import (
    AbortedError,
    DeadlineExceededError,
    FetchError,
    MissingPluginError,
    MonitoredError,
    NanLossDuringTrainingError,
    OutOfRangeError,
    PluginError,
    PluginLoadError,
    PluginOptionError,
    PluginValidationError,
    UnavailableError,
    UnsupportedArgumentError,
)
from ._fetch import OptionalFetch, optional
from ._markers import hookimpl, hookspec
from ._options import Option
from ._plugins import PluginInfo, installed_plugins
from ._profiler import ProfilerHook, StepTrace
from ._run import RunOptions, SessionRunArgs, SessionRunContext, SessionRunValues
from ._scaffold import Scaffold, SessionManager
from ._session import MonitoredSession, RawSession, SingularMonitoredSession, StepContext
from ._session_run_hook import SessionRunHook
from ._state import TrainState
from ._timer import SecondOrStepTimer
from ._training_session import USE_DEFAULT, MonitoredTrainingSession
from .clipping import (
    clip_by_average_norm,
    clip_by_global_norm,
    clip_by_norm,
    clip_by_value,
    global_norm,
)
from .data import (
    FIFOQueue,
    QueueRunner,
    add_queue_runner,
    prefetch,
    shuffle_batch,
    start_queue_runners,
)
from .evaluation import evaluate_once, evaluate_repeatedly
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

try:
    __version__ = _version("monitored")
except _PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0+unknown"

__all__ = [
    "USE_DEFAULT",
    "AbortedError",
    "AdadeltaOptimizer",
    "AdagradDAOptimizer",
    "AdagradOptimizer",
    "AdamOptimizer",
    "AdamWOptimizer",
    "Cluster",
    "Coordinator",
    "DeadlineExceededError",
    "ExponentialMovingAverage",
    "FIFOQueue",
    "FeedFnHook",
    "FetchError",
    "FinalOpsHook",
    "FtrlOptimizer",
    "GlobalStepWaiterHook",
    "GradientDescentOptimizer",
    "IndexedSlices",
    "LazyAdamOptimizer",
    "LearningRateSchedule",
    "LocalCluster",
    "LoggingTensorHook",
    "LooperThread",
    "MissingPluginError",
    "MomentumOptimizer",
    "MonitoredError",
    "MonitoredSession",
    "MonitoredTrainingSession",
    "NanLossDuringTrainingError",
    "Optimizer",
    "Option",
    "OptionalFetch",
    "OutOfRangeError",
    "PluginError",
    "PluginInfo",
    "PluginLoadError",
    "PluginOptionError",
    "PluginValidationError",
    "ProfilerHook",
    "ProximalAdagradOptimizer",
    "ProximalGradientDescentOptimizer",
    "QueueRunner",
    "RMSPropOptimizer",
    "RawSession",
    "RunOptions",
    "Scaffold",
    "SecondOrStepTimer",
    "SessionManager",
    "SessionRunArgs",
    "SessionRunContext",
    "SessionRunHook",
    "SessionRunValues",
    "SingularMonitoredSession",
    "StepContext",
    "StepCounterHook",
    "StepTrace",
    "StopAtStepHook",
    "TrainState",
    "TrainingConfig",
    "UnavailableError",
    "UnsupportedArgumentError",
    "__version__",
    "add_queue_runner",
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
    "evaluate_once",
    "evaluate_repeatedly",
    "exponential_decay",
    "global_norm",
    "hookimpl",
    "hookspec",
    "installed_plugins",
    "inverse_time_decay",
    "is_device_array",
    "linear_warmup",
    "natural_exp_decay",
    "optional",
    "piecewise_constant",
    "polynomial_decay",
    "prefetch",
    "shuffle_batch",
    "start_queue_runners",
    "to_host",
    "trainable_variables",
]
