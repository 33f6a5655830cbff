"""Setting up the optional app-wide services (backend pool, sandbox runtime, tokenizer)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from prorl_async.services import Services

__all__ = ["open_services"]


@asynccontextmanager
async def open_services(services: Services) -> AsyncIterator[Services]:
    """Open what the config asks for, close it in reverse order."""
    async with AsyncExitStack() as stack:
        _ = stack
        yield services
