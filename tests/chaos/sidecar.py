"""The manager chaos test's other processes, run from one of their own: the rollout
servers (real, each a process on its own state dir), a TEST DOUBLE network proxy in front
of each, and scripted vLLM-protocol engines (TEST DOUBLES). Driven by JSON lines on stdin,
one answer line on stdout per command.

``python -m tests.chaos.sidecar``; commands (``{"op": ..., **args}``), answered
``{"ok": result}`` or ``{"error": message}``:

- ``engines`` ``n, seed, ttft_s``: start ``n`` scripted engines; their addresses.
- ``servers`` ``specs, seed``: one proxy per ``[state_dir, [serve args]]``; their URLs.
- ``start`` / ``kill`` / ``stop`` / ``cont`` ``i``: start server ``i`` (its proxy follows
  it; answers its own URL), SIGKILL it (down until started again), SIGSTOP / SIGCONT it.
- ``proxy`` ``i, error_rate?, drop_rate?``: the faults of server ``i``'s proxy.
- ``engine_faults`` ``i, **faults``; ``engine_kill`` ``i``; ``engine_revive`` ``i``.
- ``injected``: what each proxy injected, by kind. ``pids``: every server process started.

End of input kills every server and closes everything, then the process exits. All this
runs here, not in the test's process: spawning a process blocks the spawning event loop
until the child runs ``exec`` (long on a starved machine), and the proxies' and engines'
work would share the manager's loop or its GIL, whose lag the test measures.
"""

from __future__ import annotations

import asyncio
import collections
import json
import random
import re
import signal
import sys
from contextlib import AsyncExitStack
from typing import Any

import aiohttp
import uvloop
from aiohttp import web

from prorl_async.scripted_llm import LatencyModel, ScriptedLLM

_HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}
_PASS = {"content-type", "retry-after", "cache-control"}


class ServerProxy:
    """The network between the manager and one rollout server.

    Answers a seeded fraction ``error_rate`` of requests 503 (``Retry-After: 0``) itself,
    and cuts the connection of another fraction ``drop_rate`` after the server answered.
    A server that is down or dies mid-answer cuts the manager's connection too (as a
    direct connection would). ``target`` follows the server across restarts. Answers are
    streamed through.
    """

    def __init__(self, seed: str) -> None:
        self.rng = random.Random(seed)
        self.target = ""
        self.error_rate = 0.0
        self.drop_rate = 0.0
        self.injected: collections.Counter[str] = collections.Counter()
        self.url = ""
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> ServerProxy:
        timeout = aiohttp.ClientTimeout(total=None)
        connector = aiohttp.TCPConnector(limit=0)
        self._session = aiohttp.ClientSession(connector=connector, timeout=timeout)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None and self._session is not None
        await self._runner.cleanup()
        await self._session.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        x = self.rng.random()
        if x < self.error_rate and request.path != "/healthz":
            self.injected["503"] += 1
            problem = {"type": "about:blank", "title": "injected", "status": 503, "detail": "chaos"}
            return web.json_response(problem, status=503, headers={"Retry-After": "0"})
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        assert self._session is not None
        try:
            async with self._session.request(
                request.method, self.target + request.path_qs, data=body, headers=headers
            ) as upstream:
                if x < self.error_rate + self.drop_rate:
                    await upstream.read()  # the server did the work; its answer is lost
                    self.injected["drop"] += 1
                    return _cut(request)
                out = web.StreamResponse(
                    status=upstream.status,
                    headers={k: v for k, v in upstream.headers.items() if k.lower() in _PASS},
                )
                await out.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await out.write(chunk)
                await out.write_eof()
                return out
        except aiohttp.ClientError:
            self.injected["server_gone"] += 1
            return _cut(request)


def _cut(request: web.Request) -> web.StreamResponse:
    if request.transport is not None:
        request.transport.abort()
    return web.Response(status=503)  # never reaches the client: its connection is gone


class ServerProc:
    """One rollout server process on a fixed state dir: started, SIGKILLed, SIGSTOPped
    and SIGCONTed, started again. :meth:`kill` ends it (the sidecar calls it at exit)."""

    def __init__(self, state_dir: str, args: list[str]) -> None:
        self.state_dir = state_dir
        self.args = args
        self.proc: asyncio.subprocess.Process | None = None
        self.pids: list[int] = []
        self.log: collections.deque[str] = collections.deque(maxlen=50)
        self._reader: asyncio.Task[None] | None = None

    @property
    def up(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def start(self) -> str:
        assert not self.up
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "prorl_async.cli",
            "serve",
            "--port",
            "0",
            "--state-dir",
            self.state_dir,
            *self.args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        self.proc = proc
        self.pids.append(proc.pid)
        listening: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._reader = asyncio.create_task(self._read(proc, listening))
        try:
            async with asyncio.timeout(60):
                return await listening
        except BaseException:
            await self.kill()
            raise

    async def _read(self, proc: asyncio.subprocess.Process, listening: asyncio.Future[str]) -> None:
        """Drain stderr (a full pipe would block the server) and find the listening line."""
        assert proc.stderr is not None
        while line := await proc.stderr.readline():
            text = line.decode(errors="replace").rstrip()
            self.log.append(text)
            found = re.search(r"listening on (http://\S+)", text)
            if found and not listening.done():
                listening.set_result(found.group(1))
        if not listening.done():
            listening.set_exception(RuntimeError(f"server exited: {list(self.log)[-5:]}"))

    def signal(self, sig: signal.Signals) -> None:
        if self.proc is not None and self.up:
            self.proc.send_signal(sig)

    async def kill(self) -> None:
        proc, reader = self.proc, self._reader
        if proc is not None and proc.returncode is None:
            proc.kill()  # also ends a stopped process
            await proc.wait()
        if reader is not None:
            await reader


class Sidecar:
    def __init__(self, stack: AsyncExitStack) -> None:
        self.stack = stack
        self.engines: list[ScriptedLLM] = []
        self.proxies: list[ServerProxy] = []
        self.servers: list[ServerProc] = []

    async def do(self, op: str, args: dict[str, Any]) -> Any:
        if op == "engines":
            latency = LatencyModel(ttft_s=args["ttft_s"], per_token_s=0.0005)
            for k in range(args["n"]):
                engine = ScriptedLLM(policy="finish", seed=args["seed"] + k, latency=latency)
                self.engines.append(await self.stack.enter_async_context(engine))
            return [e.address for e in self.engines]
        if op == "servers":
            for k, (state_dir, serve_args) in enumerate(args["specs"]):
                proxy = ServerProxy(f"{args['seed']}-net-{k}")
                self.proxies.append(await self.stack.enter_async_context(proxy))
                server = ServerProc(state_dir, serve_args)
                self.stack.push_async_callback(server.kill)
                self.servers.append(server)
            return [p.url for p in self.proxies]
        if op == "start":
            url = await self.servers[args["i"]].start()
            self.proxies[args["i"]].target = url
            return url
        if op == "kill":
            await self.servers[args["i"]].kill()
            return None
        if op in ("stop", "cont"):
            sig = signal.SIGSTOP if op == "stop" else signal.SIGCONT
            self.servers[args["i"]].signal(sig)
            return None
        if op == "proxy":
            proxy = self.proxies[args.pop("i")]
            for name, value in args.items():
                assert name in ("error_rate", "drop_rate"), name
                setattr(proxy, name, value)
            return None
        if op == "engine_faults":
            self.engines[args.pop("i")].set_faults(**args)
            return None
        if op == "engine_kill":
            await self.engines[args["i"]].kill()
            return None
        if op == "engine_revive":
            await self.engines[args["i"]].revive()
            return None
        if op == "injected":
            return [dict(p.injected) for p in self.proxies]
        if op == "pids":
            return [pid for server in self.servers for pid in server.pids]
        raise ValueError(f"unknown op {op!r}")


async def main() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    async with AsyncExitStack() as stack:
        sidecar = Sidecar(stack)
        while line := await reader.readline():
            command = json.loads(line)
            op = command.pop("op")
            try:
                answer = {"ok": await sidecar.do(op, command)}
            except Exception as exc:
                answer = {"error": f"{op}: {exc!r}"}
            sys.stdout.write(json.dumps(answer) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    uvloop.run(main())
