"""cancel_and_wait: cleanup after a cancellation runs to the end; a new one propagates."""

from __future__ import annotations

import asyncio

import pytest

from prorl_async.util.tasks import cancel_and_wait


async def _forever() -> None:
    await asyncio.Event().wait()


async def test_cleanup_while_unwinding_a_cancellation_completes() -> None:
    closed: list[str] = []
    started = asyncio.Event()

    async def owner() -> None:
        child = asyncio.create_task(_forever())
        try:
            started.set()
            await asyncio.Event().wait()
        finally:
            await cancel_and_wait(child)  # the owner is being cancelled: must not stop here
            closed.append("after the child")

    task = asyncio.create_task(owner())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert closed == ["after the child"]


async def test_a_cancellation_during_the_wait_propagates() -> None:
    release = asyncio.Event()
    waiting = asyncio.Event()

    async def stubborn() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            waiting.set()
            await release.wait()  # takes its time to end

    async def owner(child: asyncio.Task[None]) -> str:
        await cancel_and_wait(child)
        return "returned"

    child = asyncio.create_task(stubborn())
    await asyncio.sleep(0)  # the child reaches its wait
    task = asyncio.create_task(owner(child))
    await waiting.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # Cancelling a task that awaits another cancels that one too (asyncio's rule).
    with pytest.raises(asyncio.CancelledError):
        await child


async def test_an_error_the_task_ended_with_is_raised() -> None:
    async def failing() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            raise RuntimeError("closing failed")

    child = asyncio.create_task(failing())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="closing failed"):
        await cancel_and_wait(child)
