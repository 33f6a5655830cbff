"""The ``sandbox`` task's ``network`` option against a real server: refused (422) unless the
operator allows it; when allowed, the sandbox cannot reach the server's own API port."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from prorl_async.client import UnprocessableError
from prorl_async.sandbox.network import find_slirp4netns
from tests.conftest import require
from tests.handlers.policies import assert_nothing_live, finished, serve
from tests.handlers.test_sandbox_task import Script
from tests.helpers import ServerFactory


async def test_network_is_refused_unless_the_operator_allows_it(
    make_server: ServerFactory,
) -> None:
    async with make_server() as srv:
        with pytest.raises(UnprocessableError, match=r"instance\.network.*allow_network"):
            await srv.client.submit("sandbox", {"prompt": "x", "network": True})
        status = await srv.client.status()
        assert status["sandbox_enforcement"]["runtime"] in ("bwrap", "local")
        assert "sandbox_memory_bytes" in status["sandbox_enforcement"]


async def test_allowed_network_cannot_reach_the_server_api(make_server: ServerFactory) -> None:
    require(find_slirp4netns() is not None, "slirp4netns is not installed")
    async with serve(make_server, Script([]), sandbox={"allow_network": True}) as srv:
        port = urlsplit(srv.url).port
        probe = (
            "python3 -c \"import socket; socket.create_connection(('127.0.0.1', "
            f'{port}), timeout=5)"'
        )
        job = {"prompt": "x", "network": True, "reward_command": probe}
        doc = await finished(srv, await srv.client.submit("sandbox", job))
        assert doc["status"] == "done", doc["error"]
        assert doc["eval"]["exit_code"] != 0 and "ConnectionRefusedError" in doc["eval"]["output"]
        assert_nothing_live(srv)
