"""``numpy_input_fn``: TF's ``tf.estimator.inputs.numpy_input_fn`` as a generator of batches."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from ._errors import EstimatorError

__all__ = ["numpy_input_fn"]


def numpy_input_fn(
    x: Mapping[str, Any] | Any,
    y: Any = None,
    batch_size: int = 128,
    num_epochs: int | None = 1,
    shuffle: bool | None = None,
    *,
    seed: int = 0,
) -> Callable[[], Iterator[Any]]:
    """An input function yielding ``(features, labels)`` batches of in-memory arrays.

    ``x`` is a dict of arrays (features by name) or one array, ``y`` the labels
    (or ``None``: batches are features alone); all share their first dimension.
    ``num_epochs=None`` repeats forever; ``shuffle`` must be said, as in TF
    (``True`` draws a new order each epoch from ``seed``, so every call of the
    input function yields the same batches: what resuming exactly needs). The
    last batch of an epoch may be smaller, as TF's (no ``drop_remainder``).
    """
    if shuffle is None:
        raise EstimatorError("numpy_input_fn: shuffle must be given (True or False), as in TF")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise EstimatorError(f"numpy_input_fn(batch_size={batch_size!r}): a whole number > 0")
    if num_epochs is not None and (
        isinstance(num_epochs, bool) or not isinstance(num_epochs, int) or num_epochs <= 0
    ):
        raise EstimatorError(f"numpy_input_fn(num_epochs={num_epochs!r}): > 0 or None (forever)")
    features = {k: np.asarray(v) for k, v in x.items()} if isinstance(x, Mapping) else np.asarray(x)
    columns = list(features.values()) if isinstance(features, dict) else [features]
    labels = None if y is None else np.asarray(y)
    lengths = {len(column) for column in [*columns, *([labels] if labels is not None else [])]}
    if len(lengths) != 1:
        raise EstimatorError(
            f"numpy_input_fn: x and y must have the same number of rows, got {sorted(lengths)}"
        )
    rows = lengths.pop()

    def input_fn() -> Iterator[Any]:
        rng = np.random.default_rng(seed)
        epoch = 0
        while num_epochs is None or epoch < num_epochs:
            order = rng.permutation(rows) if shuffle else np.arange(rows)
            for start in range(0, rows, batch_size):
                index = order[start : start + batch_size]
                batch = (
                    {k: v[index] for k, v in features.items()}
                    if isinstance(features, dict)
                    else features[index]
                )
                yield batch if labels is None else (batch, labels[index])
            epoch += 1

    return input_fn
