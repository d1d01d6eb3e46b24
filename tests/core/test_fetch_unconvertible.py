"""A step output that is no array is named where it is first fetched, with the fix.

A coroutine (an ``await`` forgotten in the step) and a tensor that requires grad
(PyTorch: ``numpy()`` refuses it) are refused by name instead of reaching hooks
as ``<coroutine object ...>`` or as torch's own error naming no output.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import monitored


class FakeTensor:
    """PyTorch's tensor as ``numpy.array`` sees it: converts unless it requires grad."""

    def __init__(self, value: float, requires_grad: bool) -> None:
        self.value, self.requires_grad = value, requires_grad

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        if self.requires_grad:
            raise RuntimeError(
                "Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead."
            )
        return np.asarray(self.value, dtype=dtype)

    def detach(self) -> FakeTensor:
        return FakeTensor(self.value, requires_grad=False)


async def _run(outputs: list[dict[str, Any]]) -> None:
    hooks = [monitored.LoggingTensorHook(["loss"], every_n_iter=1)]
    async with monitored.MonitoredSession(hooks=hooks) as sess:
        for output in outputs:

            def step(state: monitored.TrainState, output: dict[str, Any] = output) -> Any:
                state.global_step += 1
                return output

            await sess.run(step)


async def compute_loss() -> float:
    return 1.0


async def test_a_coroutine_output_asks_whether_an_await_was_forgotten() -> None:
    with pytest.raises(monitored.FetchError) as caught:
        await _run([{"loss": compute_loss()}])
    message = str(caught.value)
    assert "step output 'loss' at step 1 is coroutine compute_loss" in message
    assert "did you forget `await`" in message


async def test_a_coroutine_after_plain_values_is_refused_too() -> None:
    with pytest.raises(monitored.FetchError, match="did you forget `await`"):
        await _run([{"loss": np.float32(1.0)}, {"loss": 2.0}, {"loss": compute_loss()}])


async def test_a_coroutine_output_nothing_fetches_is_warned_of_at_the_close() -> None:
    """Without a hook fetching it (no plugins), the forgotten ``await`` is still said."""

    async def step(state: monitored.TrainState) -> dict[str, Any]:
        state.global_step += 1
        return {"loss": compute_loss(), "lr": 0.1}

    with pytest.warns(RuntimeWarning) as caught:
        async with monitored.MonitoredSession() as sess:
            await sess.run(step)
    [warning] = caught
    assert str(warning.message) == (
        "the last step's output 'loss' is coroutine compute_loss, never awaited: did you "
        "forget `await` where the step computes it?"
    )


async def test_a_fetched_coroutine_is_said_once_not_again_at_the_close() -> None:
    with pytest.raises(monitored.FetchError):
        await _run([{"loss": compute_loss()}])  # warnings are errors: none at the close


async def test_a_tensor_that_requires_grad_names_the_output_and_detach() -> None:
    with pytest.raises(monitored.FetchError) as caught:
        await _run([{"loss": FakeTensor(1.0, requires_grad=True)}])
    message = str(caught.value)
    assert "step output 'loss' at step 1" in message
    assert "FakeTensor" in message
    assert "loss.detach()" in message
    assert "Can't call numpy()" in message  # the conversion's own reason
    assert isinstance(caught.value.__cause__, RuntimeError)


async def test_a_tensor_that_requires_grad_after_detached_ones_is_named_too() -> None:
    """The second and third steps take the fast path, the third falls back to name it."""
    plain = [{"loss": FakeTensor(1.0, requires_grad=False)} for _ in range(2)]
    with pytest.raises(monitored.FetchError, match=r"step output 'loss' at step 3 .*detach"):
        await _run([*plain, {"loss": FakeTensor(1.0, requires_grad=True)}])


async def test_a_real_torch_tensor_that_requires_grad() -> None:
    torch = pytest.importorskip("torch")
    weight = torch.ones(3, requires_grad=True)
    with pytest.raises(monitored.FetchError, match=r"'loss' .*torch.*detach"):
        await _run([{"loss": (weight * 2).sum()}])
