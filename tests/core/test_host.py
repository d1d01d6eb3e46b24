"""``TaskHost``: a task group hosted by a task of its own, started and stopped from any task."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from monitored._core._host import TaskHost

BACKENDS = ["asyncio", "trio"]


class Boom(BaseException):
    pass


@pytest.mark.parametrize("backend", BACKENDS)
def test_started_in_one_task_used_from_a_second_stopped_from_a_third(backend: str) -> None:
    async def main() -> None:
        errors: list[BaseException] = []
        host = TaskHost(errors.append)
        cancelled = anyio.Event()
        running = anyio.Event()

        async def hosted() -> None:
            running.set()
            try:
                await anyio.sleep_forever()
            finally:
                cancelled.set()

        async with anyio.create_task_group() as first:
            first.start_soon(host.start)
        assert host.task_group is not None

        async def start_hosted() -> None:
            assert host.task_group is not None
            host.task_group.start_soon(hosted)

        async with anyio.create_task_group() as second:
            second.start_soon(start_hosted)
        with anyio.fail_after(30):
            await running.wait()
        async with anyio.create_task_group() as third:
            third.start_soon(host.stop)
        assert cancelled.is_set()
        assert host.task_group is None
        assert errors == []
        await host.stop()  # again: nothing to do

    anyio.run(main, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_what_escapes_the_task_group_is_reported_at_once_and_raised_by_stop(backend: str) -> None:
    async def main() -> None:
        errors: list[BaseException] = []
        host = TaskHost(errors.append)
        task_group = await host.start()

        async def fail() -> None:
            raise Boom("hosted")

        task_group.start_soon(fail)
        with anyio.fail_after(30):
            while not errors:
                await anyio.lowlevel.checkpoint()
        assert isinstance(errors[0], BaseExceptionGroup)
        assert errors[0].subgroup(Boom) is not None
        with pytest.raises(BaseExceptionGroup) as raised:
            await host.stop()
        assert raised.value is errors[0]

    anyio.run(main, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_host_starts_once_and_a_host_never_started_stops_as_a_no_op(backend: str) -> None:
    async def main() -> None:
        never = TaskHost(lambda exc: None)
        await never.stop()
        host = TaskHost(lambda exc: None)
        await host.start()
        with pytest.raises(RuntimeError, match="started only once"):
            await host.start()
        await host.stop()

    anyio.run(main, backend=backend)
