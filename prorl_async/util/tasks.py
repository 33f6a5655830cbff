"""Ending a task we own without losing a cancellation aimed at us."""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["cancel_and_wait"]


async def cancel_and_wait(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` and wait until it has ended.

    A cancellation of the caller that arrives during the wait propagates. One the caller
    is already unwinding (it is closing things because it was cancelled) does not cut
    the wait short: the cleanup after it still runs. An exception the task ended with
    (other than its cancellation) is raised.
    """
    task.cancel()
    current = asyncio.current_task()
    before = current.cancelling() if current is not None else 0
    try:
        await task
    except asyncio.CancelledError:
        if current is not None and current.cancelling() > before:
            raise
