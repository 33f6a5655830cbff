"""A Server-Sent Events reader for tests: ``GET /events`` on a real server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aiohttp
import msgspec


@dataclass
class Event:
    """One event (``kind`` "job"), or a comment line (``kind`` "comment", text in ``data``)."""

    kind: str
    id: int | None
    data: dict[str, object]


class Stream:
    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self.resp = resp

    async def next(self) -> Event:
        """The next event or comment; raises ``EOFError`` when the server ends the stream."""
        fields: dict[str, str] = {}
        while True:
            line = await self.resp.content.readline()
            if not line:
                raise EOFError("event stream ended")
            text = line.decode().rstrip("\n")
            if text.startswith(":"):
                return Event("comment", None, {"text": text[1:].strip()})
            if text:
                name, _, value = text.partition(":")
                fields[name] = value.removeprefix(" ")
                continue
            if "event" in fields:
                data = msgspec.json.decode(fields.get("data", "{}"))
                return Event(fields["event"], int(fields["id"]), data)
            fields = {}  # a retry: line alone

    async def jobs(self, count: int) -> list[Event]:
        """The next ``count`` job events (comments skipped)."""
        out: list[Event] = []
        while len(out) < count:
            event = await self.next()
            if event.kind == "job":
                out.append(event)
        return out


@asynccontextmanager
async def open_events(
    session: aiohttp.ClientSession,
    url: str,
    *,
    token: str | None = None,
    last_event_id: int | None = None,
    after: int | None = None,
) -> AsyncIterator[Stream]:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = str(last_event_id)
    query = "" if after is None else f"?after={after}"
    timeout = aiohttp.ClientTimeout(total=None, sock_read=60)
    async with session.get(f"{url}/events{query}", headers=headers, timeout=timeout) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        yield Stream(resp)
