"""monitored: TensorFlow 1's monitored training session for async Python.

An async step loop over NumPy or CuPy arrays whose every hook is a pluggy
plugin; the big features (checkpoints, summaries, early stopping, NaN guards,
progress) are separately installed plugin packages.

Names are imported at first use (``from monitored import X`` or ``monitored.X``;
PEP 562): a process that needs a few of them, such as the ``monitored`` command
or a plugin's import, does not import every module of the package.
"""

import importlib as _importlib
from importlib.metadata import PackageNotFoundError as _PackageNotFoundError
from importlib.metadata import version as _version
from types import FunctionType as _FunctionType
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from ._core._errors import (
    AbortedError,
    DamagedCheckpointError,
    DeadlineExceededError,
    EventLoopEndedError,
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
from ._core._files import UnsafeFileError, is_plain_name, open_regular_file, read_regular_file

# At import, not with the first session: a second Ctrl-C during start-up (an import
# a sweep's trial makes) must not leave anyio's worker threads holding up the exit.
_importlib.import_module(f"{__name__}._core._exit").install()

if _TYPE_CHECKING:
    from ._core._backend import is_device_array, to_host, to_scalar
    from ._core._basic_hooks import (
        FeedFnHook,
        FinalOpsHook,
        GlobalStepWaiterHook,
        LoggingTensorHook,
        StepCounterHook,
        StopAtStepHook,
    )
    from ._core._capabilities import Provider, provider
    from ._core._cluster import Cluster, ClusterSpec, LocalCluster
    from ._core._commands import Commands
    from ._core._config import TrainingConfig
    from ._core._coordinator import Coordinator, LooperThread
    from ._core._fetch import OptionalFetch, optional
    from ._core._launcher import UnconnectedTasksError
    from ._core._markers import hookimpl, hookspec
    from ._core._options import Option
    from ._core._ownership import (
        RunOwnedError,
        RunOwnershipLostError,
        RunOwnershipWarning,
        RunTakenOverWarning,
        check_run_owner,
        claim_run,
    )
    from ._core._plugins import PluginInfo, installed_plugins
    from ._core._printable import PrintableFilter, printable
    from ._core._profiler import BackgroundSpan, ProfilerHook, StepTrace
    from ._core._run import RunOptions, SessionRunArgs, SessionRunContext, SessionRunValues
    from ._core._scaffold import Scaffold, SessionManager
    from ._core._scalars import SCALAR_OUTPUTS, scalar_outputs
    from ._core._session import MonitoredSession, RawSession, SingularMonitoredSession, StepContext
    from ._core._session_run_hook import SessionRunHook
    from ._core._state import TrainState, decode_rng_state, encode_rng_state
    from ._core._timer import SecondOrStepTimer
    from ._core._training_session import USE_DEFAULT, MonitoredTrainingSession
    from .data import (
        FIFOQueue,
        QueueRunner,
        add_queue_runner,
        prefetch,
        shuffle_batch,
        start_queue_runners,
    )
    from .evaluation import (
        EvalSpec,
        Experiment,
        TrainSpec,
        evaluate_once,
        evaluate_repeatedly,
        train_and_evaluate,
    )
    from .supervisor import Supervisor, basic_train_loop
    from .train import (
        AdadeltaOptimizer,
        AdagradDAOptimizer,
        AdagradOptimizer,
        AdamOptimizer,
        AdamWOptimizer,
        ExponentialMovingAverage,
        FtrlOptimizer,
        GradientDescentOptimizer,
        IndexedSlices,
        LazyAdamOptimizer,
        LearningRateSchedule,
        MomentumOptimizer,
        Optimizer,
        ProximalAdagradOptimizer,
        ProximalGradientDescentOptimizer,
        RMSPropOptimizer,
        WarmStartError,
        assign_moving_average,
        clip_by_average_norm,
        clip_by_global_norm,
        clip_by_norm,
        clip_by_value,
        compute_gradient,
        compute_gradient_error,
        cosine_decay,
        cosine_decay_restarts,
        ensure_zero_debias,
        exponential_decay,
        global_norm,
        inverse_time_decay,
        linear_warmup,
        natural_exp_decay,
        piecewise_constant,
        polynomial_decay,
        trainable_variables,
        warm_start,
    )

#: The public names not imported above, by the module that holds each (relative to
#: this package): imported by ``__getattr__`` at first use. A test checks that this
#: table and the ``TYPE_CHECKING`` imports above (what type checkers read) agree.
_LAZY_MODULES: dict[str, tuple[str, ...]] = {
    "._core._backend": ("is_device_array", "to_host", "to_scalar"),
    "._core._basic_hooks": (
        "FeedFnHook",
        "FinalOpsHook",
        "GlobalStepWaiterHook",
        "LoggingTensorHook",
        "StepCounterHook",
        "StopAtStepHook",
    ),
    "._core._capabilities": ("Provider", "provider"),
    "._core._cluster": ("Cluster", "ClusterSpec", "LocalCluster"),
    "._core._commands": ("Commands",),
    "._core._config": ("TrainingConfig",),
    "._core._scalars": ("SCALAR_OUTPUTS", "scalar_outputs"),
    "._core._coordinator": ("Coordinator", "LooperThread"),
    "._core._fetch": ("OptionalFetch", "optional"),
    "._core._launcher": ("UnconnectedTasksError",),
    "._core._markers": ("hookimpl", "hookspec"),
    "._core._options": ("Option",),
    "._core._ownership": (
        "RunOwnedError",
        "RunOwnershipLostError",
        "RunOwnershipWarning",
        "RunTakenOverWarning",
        "check_run_owner",
        "claim_run",
    ),
    "._core._plugins": ("PluginInfo", "installed_plugins"),
    "._core._printable": ("PrintableFilter", "printable"),
    "._core._profiler": ("BackgroundSpan", "ProfilerHook", "StepTrace"),
    "._core._run": ("RunOptions", "SessionRunArgs", "SessionRunContext", "SessionRunValues"),
    "._core._scaffold": ("Scaffold", "SessionManager"),
    "._core._session": (
        "MonitoredSession",
        "RawSession",
        "SingularMonitoredSession",
        "StepContext",
    ),
    "._core._session_run_hook": ("SessionRunHook",),
    "._core._state": ("TrainState", "decode_rng_state", "encode_rng_state"),
    "._core._timer": ("SecondOrStepTimer",),
    "._core._training_session": ("USE_DEFAULT", "MonitoredTrainingSession"),
    ".data": (
        "FIFOQueue",
        "QueueRunner",
        "add_queue_runner",
        "prefetch",
        "shuffle_batch",
        "start_queue_runners",
    ),
    ".evaluation": (
        "EvalSpec",
        "Experiment",
        "TrainSpec",
        "evaluate_once",
        "evaluate_repeatedly",
        "train_and_evaluate",
    ),
    ".supervisor": ("Supervisor", "basic_train_loop"),
    ".train": (
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
    ),
}
_LAZY: dict[str, str] = {name: module for module, names in _LAZY_MODULES.items() for name in names}
#: Subpackages that ``import monitored`` made attributes when it imported them all.
_SUBMODULES = frozenset(
    {"data", "estimator", "evaluation", "hookspecs", "metrics", "supervisor", "train"}
)

_PRIVATE = "monitored._core."


def _name_public_module(value: object) -> None:
    """Give a function or exception of the private runtime ``monitored`` as its module.

    Tracebacks name the public path (monitored.PluginError), not the private module
    an error happens to live in (anyio does the same). Only exceptions and
    functions: other classes keep their module, where typing.get_type_hints
    resolves their string annotations.
    """
    public = isinstance(value, _FunctionType) or (
        isinstance(value, type) and issubclass(value, BaseException)
    )
    if public and getattr(value, "__module__", "").startswith(_PRIVATE):
        value.__module__ = __name__


for _value in list(locals().values()):
    _name_public_module(_value)
del _value


def __getattr__(name: str) -> _Any:
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(_importlib.import_module(module, __name__), name)
        _name_public_module(value)
    elif name in _SUBMODULES:
        value = _importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # the next lookup finds it without this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, *_SUBMODULES})


try:
    __version__ = _version("monitored")
except _PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0+unknown"

__all__ = [
    "SCALAR_OUTPUTS",
    "USE_DEFAULT",
    "AbortedError",
    "AdadeltaOptimizer",
    "AdagradDAOptimizer",
    "AdagradOptimizer",
    "AdamOptimizer",
    "AdamWOptimizer",
    "BackgroundSpan",
    "Cluster",
    "ClusterSpec",
    "Commands",
    "Coordinator",
    "DamagedCheckpointError",
    "DeadlineExceededError",
    "EvalSpec",
    "EventLoopEndedError",
    "Experiment",
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
    "PrintableFilter",
    "ProfilerHook",
    "Provider",
    "ProximalAdagradOptimizer",
    "ProximalGradientDescentOptimizer",
    "QueueRunner",
    "RMSPropOptimizer",
    "RawSession",
    "RunOptions",
    "RunOwnedError",
    "RunOwnershipLostError",
    "RunOwnershipWarning",
    "RunTakenOverWarning",
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
    "Supervisor",
    "TrainSpec",
    "TrainState",
    "TrainingConfig",
    "UnavailableError",
    "UnconnectedTasksError",
    "UnsafeFileError",
    "UnsupportedArgumentError",
    "WarmStartError",
    "__version__",
    "add_queue_runner",
    "assign_moving_average",
    "basic_train_loop",
    "check_run_owner",
    "claim_run",
    "clip_by_average_norm",
    "clip_by_global_norm",
    "clip_by_norm",
    "clip_by_value",
    "compute_gradient",
    "compute_gradient_error",
    "cosine_decay",
    "cosine_decay_restarts",
    "decode_rng_state",
    "encode_rng_state",
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
    "is_plain_name",
    "linear_warmup",
    "natural_exp_decay",
    "open_regular_file",
    "optional",
    "piecewise_constant",
    "polynomial_decay",
    "prefetch",
    "printable",
    "provider",
    "read_regular_file",
    "scalar_outputs",
    "shuffle_batch",
    "start_queue_runners",
    "to_host",
    "to_scalar",
    "train_and_evaluate",
    "trainable_variables",
    "warm_start",
]
