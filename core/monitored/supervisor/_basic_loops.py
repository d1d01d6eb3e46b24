"""``basic_train_loop``: TF1's ``tf.train.basic_train_loop`` on a :class:`Supervisor`."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .._core._errors import AbortedError
from ._supervisor import Supervisor

__all__ = ["basic_train_loop"]

log = logging.getLogger("monitored")


async def basic_train_loop(
    supervisor: Supervisor,
    train_step_fn: Callable[..., Any],
    args: Iterable[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    master: str = "",
) -> None:
    """Call ``train_step_fn(sess, *args, **kwargs)`` in a managed session until a stop.

    TF1's loop: ``train_step_fn`` (plain or ``async``) gets the managed session,
    runs a step (``await sess.run(...)``) and may ask for a stop
    (``supervisor.request_stop()``). An :class:`~monitored.AbortedError` (a lost
    peer) ends that session and the loop starts again in a fresh one, restored
    from the newest checkpoint; any other exception is raised once the session
    is closed.
    """
    args, kwargs = tuple(args or ()), dict(kwargs or {})
    while True:
        try:
            async with supervisor.managed_session(master) as sess:
                while not supervisor.should_stop():
                    result = train_step_fn(sess, *args, **kwargs)
                    if inspect.isawaitable(result):
                        await result
        except AbortedError as exc:
            log.warning("basic_train_loop: %r; starting a new session", exc)
            continue
        return
