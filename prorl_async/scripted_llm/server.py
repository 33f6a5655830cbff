"""The scripted LLM HTTP server: vLLM and SGLang token-id routes over aiohttp.

TEST DOUBLE: it speaks the engines' wire protocols but its replies come from a scripted
policy. Real training points the rollout server at vLLM or SGLang.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from pathlib import Path
from typing import Any

import msgspec
from aiohttp import web
from tokenizers import Tokenizer

from prorl_async.scripted_llm import _routes
from prorl_async.scripted_llm._tokenizer import load_tokenizer
from prorl_async.scripted_llm.faults import Faults
from prorl_async.scripted_llm.latency import Decoder, LatencyModel, Stats
from prorl_async.scripted_llm.policies import Policy, make_policy
from prorl_async.scripted_llm.records import LogEntry, Reply
from prorl_async.scripted_llm.weights import EngineWeights

__all__ = ["ScriptedLLM", "synthetic_logprob"]


def synthetic_logprob(prompt_len: int, position: int, token: int, weights: str = "") -> float:
    """A deterministic logprob in (-5, 0) from (prompt length, position, token) and the
    weights loaded (a path; none: the weights it started with)."""
    key = f"{prompt_len}:{position}:{token}{':' + weights if weights else ''}".encode()
    x = int.from_bytes(hashlib.blake2b(key, digest_size=4).digest(), "big")
    return -((x % 5000) + 1) / 1000.0


class ScriptedLLM:
    """An in-process scripted LLM server on loopback (async context manager).

    ``address`` is ``http://127.0.0.1:PORT/v1``. ``log`` lists every generation request,
    ``stats`` the live concurrency; ``faults`` and ``latency`` may be changed at run time
    (or through :meth:`set_faults`); :meth:`kill` / :meth:`revive` take the server off the
    network and back on the same port; :meth:`hold` / :meth:`release` hold requests back.
    """

    def __init__(
        self,
        *,
        policy: Policy | str = "finish",
        seed: int = 0,
        tokenizer: str | Path | Tokenizer | None = None,
        latency: LatencyModel | None = None,
        faults: Faults | None = None,
        model: str = "scripted-llm",
        host: str = "127.0.0.1",
        port: int = 0,
        legacy_vllm: bool = False,
        max_model_len: int = 32768,
        api: str = "vllm",
        load_s: float = 0.0,
    ) -> None:
        self.policy = make_policy(policy, seed=seed) if isinstance(policy, str) else policy
        self.tokenizer = load_tokenizer(tokenizer)
        im_end = self.tokenizer.token_to_id("<|im_end|>")
        assert im_end is not None  # load_tokenizer checked
        self.im_end: int = im_end
        self.faults = faults or Faults()
        self.model = model
        self.legacy_vllm = legacy_vllm
        """Ignore ``return_token_ids`` like vLLM < 0.10.2 (ids only as ``token_id:N``)."""
        self.max_model_len = max_model_len
        self.weights = EngineWeights(load_s)
        """Checkpoint, version and pause state (vLLM dev-mode and SGLang weight routes)."""
        # SGLang's /update_weight_version aborts in-flight requests unless told not to.
        self.sglang_version_aborts = api == "sglang"
        """Context window reported by ``/v1/models`` and enforced like vLLM (HTTP 400)."""
        self.host, self.port = host, port
        self.log: list[LogEntry] = []
        self.stats = Stats()
        self.rng = random.Random(seed)
        self.decoder = Decoder(latency or LatencyModel(), self.stats)
        self._arrivals = asyncio.Condition()
        self._open = asyncio.Event()
        self._open.set()
        self.killed = asyncio.Event()
        self.stopping = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._closed = False

    @property
    def latency(self) -> LatencyModel:
        """The latency model (assign a new one to change it at run time)."""
        return self.decoder.latency

    @latency.setter
    def latency(self, value: LatencyModel) -> None:
        self.decoder.latency = value

    @property
    def root(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def address(self) -> str:
        """The OpenAI-style base URL to register with the pool."""
        return f"{self.root}/v1"

    async def __aenter__(self) -> ScriptedLLM:
        await self._listen()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop serving (hung and held requests end at once). Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self.killed.set()
        self._open.set()
        await self._stop()

    async def kill(self) -> None:
        """Go down hard: close the socket and every open connection; in-flight requests die."""
        self.killed.set()
        await self._stop()

    def sigterm(self) -> None:
        """Stop like vLLM on SIGTERM: stop listening (``/health`` and new requests are
        refused), drop in-flight requests inside but never answer their connections (they
        end only at :meth:`kill` or :meth:`aclose`)."""
        self.stopping.set()
        server = getattr(self._site, "_server", None)  # aiohttp keeps the listener here
        if server is not None:
            server.close()

    async def revive(self) -> None:
        """Come back on the same port after :meth:`kill`."""
        if self._runner is not None or self._closed:
            raise RuntimeError("revive() needs a killed, not closed, ScriptedLLM")
        self.killed = asyncio.Event()
        self.stopping = asyncio.Event()
        await self._listen()

    def set_faults(self, **changes: Any) -> Faults:
        """Replace fault settings at run time, e.g. ``set_faults(error_rate=1.0)``."""
        self.faults = msgspec.structs.replace(self.faults, **changes)
        return self.faults

    def hold(self) -> None:
        """Make new and waiting generation requests wait (they are logged on arrival)."""
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    async def wait_requests(self, count: int) -> None:
        """Wait until ``count`` generation requests have arrived in total."""
        async with self._arrivals:
            await self._arrivals.wait_for(lambda: self.stats.arrived >= count)

    def respond(self, prompt_ids: list[int], max_tokens: int) -> Reply:
        """What the policy says to ``prompt_ids``, as ids, with logprobs and finish reason."""
        conversation = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        text = self.policy.reply(conversation)
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids + [self.im_end]
        finish = "stop"
        if len(ids) > max_tokens:
            ids, finish = ids[:max_tokens], "length"
        n = len(prompt_ids)
        salt = self.weights.salt
        lps = [
            self.faults.corrupt(self.rng, synthetic_logprob(n, i, t, salt))
            for i, t in enumerate(ids)
        ]
        return Reply(ids, lps, finish, self.tokenizer.decode(ids, skip_special_tokens=False))

    async def arrive(self, entry: LogEntry) -> None:
        self.log.append(entry)
        self.stats.arrived += 1
        async with self._arrivals:
            self._arrivals.notify_all()
        await self._open.wait()

    async def _listen(self) -> None:
        app = _routes.build_app(self)
        runner = web.AppRunner(
            app, access_log=None, shutdown_timeout=0.05, handler_cancellation=True
        )
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, reuse_address=True)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner, self._site = runner, site
        if self.port == 0:
            self.port = runner.addresses[0][1]

    async def _stop(self) -> None:
        runner, self._runner, self._site = self._runner, None, None
        if runner is None:
            return
        if runner.server is not None:
            # Like a crash: every open connection dies now, in-flight requests with them
            # (handler_cancellation cancels their handlers when the connection is lost).
            for conn in list(runner.server.connections):
                if conn.transport is not None:
                    conn.transport.abort()
        await runner.cleanup()
        for entry in self.log:
            if entry.outcome in ("pending", "hang", "stalled"):
                entry.outcome = "killed"
