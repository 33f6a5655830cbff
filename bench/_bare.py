"""The physical limit of our stack: a bare aiohttp + uvloop server, same wire answers.

``POST /process`` reads the body and answers the same 202; ``POST /process/batch`` reads
the body, counts the jobs and answers their ids; ``POST /poll`` answers every id done
with a small result document at once (as if each job took zero time and nothing was
stored). No validation, no store, no pipeline: what is left is aiohttp, uvloop and
the JSON codec, the floor under every figure of ``bench/pipeline_overhead.py``.

    python -m bench._bare [--port 0]     # prints "listening on http://127.0.0.1:PORT"
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import signal
import sys
from typing import Any

import msgspec
import uvloop
from aiohttp import web

_encoder = msgspec.json.Encoder()
_ids = itertools.count()
_TIMING = {
    "queued_s": 0.0,
    "init_s": 0.0,
    "run_s": 0.0,
    "eval_s": 0.0,
    "active_s": 0.0,
    "backend_wait_s": 0.0,
    "total_s": 0.0,
}


class _Jobs(msgspec.Struct):
    jobs: list[msgspec.Raw]


class _Poll(msgspec.Struct):
    job_ids: list[str]
    wait: float = 0.0


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=_encoder.encode(obj), status=status, content_type="application/json")


async def process(request: web.Request) -> web.Response:
    await request.read()
    return _json({"job_id": f"j-{next(_ids):032x}", "status": "queued"}, 202)


async def process_batch(request: web.Request) -> web.Response:
    req = msgspec.json.decode(await request.read(), type=_Jobs)
    return _json({"job_ids": [f"j-{next(_ids):032x}" for _ in req.jobs]}, 202)


async def poll(request: web.Request) -> web.Response:
    req = msgspec.json.decode(await request.read(), type=_Poll)
    done = [
        {"job_id": i, "task": "sleep", "status": "done", "reward": 1.0, "timing": _TIMING}
        for i in req.job_ids
    ]
    return _json({"done": done, "pending": [], "unknown": []})


async def status(request: web.Request) -> web.Response:
    return _json({"records": 0, "queues": {}, "active": {}})


async def serve(port: int) -> None:
    app = web.Application()
    app.router.add_post("/process", process)
    app.router.add_post("/process/batch", process_batch)
    app.router.add_post("/poll", poll)
    app.router.add_get("/status", status)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, backlog=1024)
    await site.start()
    sys.stderr.write(f"bare aiohttp listening on http://127.0.0.1:{runner.addresses[0][1]}\n")
    sys.stderr.flush()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    uvloop.run(serve(ap.parse_args().port))


if __name__ == "__main__":
    main()
