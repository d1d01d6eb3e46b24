"""``monitored.data``: input pipelines that keep the step loop fed, and resume exactly.

* :func:`prefetch` makes batches ahead of the step in anyio tasks or worker
  threads, with a bounded buffer (backpressure), in index order whatever the
  number of workers; used in ``hooks=[...]`` its position is saved with every
  checkpoint, so a resumed run sees exactly the batches an uninterrupted one sees.
* :func:`batch` and :func:`shuffle_batch` are TF1's ``tf.train`` functions on it;
  :func:`shard` splits the input between the processes of a distributed job.
* :class:`QueueRunner`, :class:`FIFOQueue`, :func:`add_queue_runner` and
  :func:`start_queue_runners` are TF1's queue runners for ported code.

See ``docs/data.md``.
"""

from ._batching import batch, shuffle_batch
from ._errors import (
    BatchError,
    DataError,
    InputStateError,
    ProducerError,
    QueueClosedError,
    ResumeMismatchError,
)
from ._prefetch import FeedingPipeline, Pipeline, pipelines, prefetch
from ._queue_runner import FIFOQueue, QueueRunner, add_queue_runner, start_queue_runners
from ._sharding import shard

__all__ = [
    "BatchError",
    "DataError",
    "FIFOQueue",
    "FeedingPipeline",
    "InputStateError",
    "Pipeline",
    "ProducerError",
    "QueueClosedError",
    "QueueRunner",
    "ResumeMismatchError",
    "add_queue_runner",
    "batch",
    "pipelines",
    "prefetch",
    "shard",
    "shuffle_batch",
    "start_queue_runners",
]

# Tracebacks name the public path of an error, as the core's do, not its private module.
for _name in __all__:
    _value = globals()[_name]
    if isinstance(_value, type) and issubclass(_value, BaseException):
        _value.__module__ = __name__
del _name, _value
