"""``monitored.supervisor``: TF1's ``tf.train.Supervisor`` on the core session.

:class:`Supervisor` gives a managed session (``async with sv.managed_session()``)
with TF1's standard services: checkpoints every ``save_model_secs`` and recovery
from the newest one (the ``monitored-checkpoint`` plugin), summaries and
``global_step/sec`` every ``save_summaries_secs`` (the ``monitored-summaries``
plugin), queue runners, ``loop`` and ``summary_computed``. See ``docs/supervisor.md``.
"""

from ._basic_loops import basic_train_loop
from ._errors import SummaryFunctionError, SupervisorError
from ._supervisor import ManagedSession, Supervisor

__all__ = [
    "ManagedSession",
    "SummaryFunctionError",
    "Supervisor",
    "SupervisorError",
    "basic_train_loop",
]

# Tracebacks name the public path of an error, as the core's do, not its private module.
for _name in __all__:
    _value = globals()[_name]
    if isinstance(_value, type) and issubclass(_value, BaseException):
        _value.__module__ = __name__
del _name, _value
