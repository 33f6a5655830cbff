from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import uvloop

from tests.proctree import cmdline, descendants


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, Any]:
    # The server runs on uvloop in production, so the tests do too.
    return {"uvloop": uvloop.new_event_loop}


@pytest.fixture(autouse=True)
def no_leftover_processes() -> Iterator[None]:
    """Fail a test that leaves a child process of its own behind."""
    before = descendants()
    yield
    left = descendants() - before
    if left:
        desc = ", ".join(f"{pid}: {cmdline(pid)}" for pid in sorted(left))
        pytest.fail(f"test left processes running: {desc}")


def require(tool_ok: bool, reason: str) -> None:
    """Skip when a system component is missing, unless CI demands it (PRORL_REQUIRE_SYSTEM=1)."""
    if tool_ok:
        return
    if os.environ.get("PRORL_REQUIRE_SYSTEM") == "1":
        pytest.fail(f"required system component missing: {reason}")
    pytest.skip(reason)


requires: Callable[[bool, str], None] = require


# Server fixtures (make_server, gate) for every test package.
from tests.serverutil import gate, make_server  # noqa: E402, F401
