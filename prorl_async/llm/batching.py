"""Prompt batching: one vLLM backend's completion calls made together, sent as one
``/v1/completions`` request with a list of token-id prompts (``pool.batch_prompts``).

vLLM's API server spends its CPU per HTTP request (parsing, validation, the response
model, JSON), while its engine schedules each prompt of a list on its own, as it would
separate requests: a list costs the API server less than as many requests, and each
prompt's tokens, logprobs and finish reason are what its own request would give.

A batch gathers the calls with the same model, ``max_tokens`` and sampling parameters
made before the event loop's next turn, up to ``max_prompts``. Its request answers when
its last prompt ends, so each call of a batch waits for the longest: worth it where turns
end together (one-turn tasks with one ``max_tokens``), a cost for multi-turn agents whose
turns differ. A batch the engine refuses (4xx) is retried prompt by prompt, so only the
prompt at fault fails. A caller cancelled (its job cancelled, its stall timer expired)
stops waiting at once; the request goes on for the others and its answer is dropped.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from prorl_async.llm.engines import (
    EngineRejected,
    MalformedResponse,
    _post_json,
    complete_vllm,
    parse_vllm,
    vllm_body,
)
from prorl_async.llm.generation import Generation
from prorl_async.util.tasks import cancel_and_wait

__all__ = ["PromptBatcher"]

_Key = tuple[str, int, str, float | None]


class _Batch:
    __slots__ = ("futures", "max_tokens", "model", "prompts", "sampling", "timeout_s")

    def __init__(
        self, model: str, max_tokens: int, sampling: dict[str, Any], timeout_s: float | None
    ) -> None:
        self.model, self.max_tokens, self.sampling = model, max_tokens, sampling
        self.timeout_s = timeout_s
        self.prompts: list[list[int]] = []
        self.futures: list[asyncio.Future[Generation]] = []


class PromptBatcher:
    """Batches the completion calls of one vLLM backend (see the module doc). It owns the
    tasks of the batch requests in flight; ``aclose`` ends them."""

    def __init__(self, session: aiohttp.ClientSession, address: str, *, max_prompts: int) -> None:
        if max_prompts < 1:
            raise ValueError(f"max_prompts must be >= 1, got {max_prompts}")
        self.session, self.address, self.max_prompts = session, address, max_prompts
        self._open: dict[_Key, _Batch] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self.requests = 0
        """``/v1/completions`` requests sent (a refused batch's retries included)."""
        self.prompts = 0
        """Prompts answered or failed through this batcher."""

    async def complete(
        self,
        model: str,
        prompt_ids: list[int],
        max_tokens: int,
        sampling: dict[str, Any],
        timeout_s: float | None,
    ) -> Generation:
        """What ``complete_vllm`` would answer for this prompt, from a batch's request."""
        if self._closed:
            raise RuntimeError("the prompt batcher is closed")
        loop = asyncio.get_running_loop()
        key = (model, max_tokens, json.dumps(sampling, sort_keys=True, default=str), timeout_s)
        batch = self._open.get(key)
        if batch is None:
            batch = self._open[key] = _Batch(model, max_tokens, sampling, timeout_s)
            loop.call_soon(self._send, key, batch)
        future: asyncio.Future[Generation] = loop.create_future()
        batch.prompts.append(prompt_ids)
        batch.futures.append(future)
        if len(batch.prompts) >= self.max_prompts:
            self._send(key, batch)
        return await asyncio.shield(future)

    def _send(self, key: _Key, batch: _Batch) -> None:
        if self._open.get(key) is not batch:
            return  # sent already (it filled up)
        del self._open[key]
        task = asyncio.get_running_loop().create_task(self._run(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: _Batch) -> None:
        self.prompts += len(batch.prompts)
        try:
            gens = await (self._many(batch) if len(batch.prompts) > 1 else self._each(batch))
        except BaseException as exc:
            error = exc if isinstance(exc, Exception) else RuntimeError("the batcher closed")
            for f in batch.futures:
                if not f.done():
                    f.set_exception(error)
            if not isinstance(exc, Exception):
                raise
            return
        for f, gen in zip(batch.futures, gens, strict=True):
            if not f.done():
                f.set_result(gen)

    async def _many(self, batch: _Batch) -> list[Generation]:
        url = f"{self.address.rstrip('/')}/completions"
        body = vllm_body(batch.model, [], batch.max_tokens, batch.sampling)
        body["prompt"] = batch.prompts
        self.requests += 1
        try:
            payload = await _post_json(self.session, self.address, url, body, batch.timeout_s)
        except EngineRejected:
            return await self._each(batch)
        choices = payload.get("choices") if isinstance(payload, dict) else None
        n = len(batch.prompts)
        if not isinstance(choices, list) or len(choices) != n:
            got = len(choices) if isinstance(choices, list) else choices
            raise MalformedResponse(self.address, f"{n} prompts answered by {got!r:.80} choices")
        by_index: dict[int, Any] = {}
        for c in choices:
            index = c.get("index") if isinstance(c, dict) else None
            if not isinstance(index, int) or not 0 <= index < n or index in by_index:
                raise MalformedResponse(self.address, f"a choice's index {index!r:.40} of {n}")
            by_index[index] = c
        return [parse_vllm(self.address, {"choices": [by_index[i]]}) for i in range(n)]

    async def _each(self, batch: _Batch) -> list[Generation]:
        """Prompt by prompt: a refusal then fails only its own call."""
        self.requests += len(batch.prompts)
        outs = await asyncio.gather(
            *(
                complete_vllm(
                    self.session,
                    self.address,
                    batch.model,
                    prompt,
                    batch.max_tokens,
                    batch.sampling,
                    timeout_s=batch.timeout_s,
                )
                for prompt in batch.prompts
            ),
            return_exceptions=True,
        )
        if len(outs) == 1 and isinstance(outs[0], BaseException):
            raise outs[0]
        gens: list[Generation] = []
        for f, out in zip(batch.futures, outs, strict=True):
            if isinstance(out, Generation):
                gens.append(out)
                continue
            if not f.done():
                f.set_exception(out)
            gens.append(Generation([], [], "abort", self.address))  # dropped: f is done
        return gens

    async def aclose(self) -> None:
        """Fail the calls not sent yet and end the requests in flight."""
        self._closed = True
        for batch in self._open.values():
            for f in batch.futures:
                if not f.done():
                    f.set_exception(RuntimeError("the batcher closed"))
        self._open.clear()
        for task in list(self._tasks):
            await cancel_and_wait(task)
