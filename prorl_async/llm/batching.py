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
    complete_vllm,
    parse_vllm,
    post_vllm_completions,
    vllm_body,
)
from prorl_async.llm.generation import Generation
from prorl_async.util.tasks import cancel_and_wait

__all__ = ["PromptBatcher"]

# Calls batch together when they share these: the model, max_tokens, the sampling (JSON).
_Key = tuple[str, int, str]
Outcome = Generation | Exception


class _Batch:
    __slots__ = ("futures", "max_tokens", "model", "prompts", "sampling")

    def __init__(self, model: str, max_tokens: int, sampling: dict[str, Any]) -> None:
        self.model, self.max_tokens, self.sampling = model, max_tokens, sampling
        self.prompts: list[list[int]] = []
        self.futures: list[asyncio.Future[Generation]] = []


class PromptBatcher:
    """Batches the completion calls of one vLLM backend (see the module doc), each request
    bounded by ``timeout_s``. It owns the tasks of the batch requests in flight; ``aclose``
    ends them."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        address: str,
        *,
        max_prompts: int,
        timeout_s: float | None,
    ) -> None:
        if max_prompts < 1:
            raise ValueError(f"max_prompts must be >= 1, got {max_prompts}")
        self.session, self.address, self.max_prompts = session, address, max_prompts
        self.timeout_s = timeout_s
        self._open: dict[_Key, _Batch] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self.requests = 0
        """``/v1/completions`` requests sent (a refused batch's retries included)."""
        self.prompts = 0
        """Prompts answered or failed through this batcher."""

    async def complete(
        self, model: str, prompt_ids: list[int], max_tokens: int, sampling: dict[str, Any]
    ) -> Generation:
        """What ``complete_vllm`` would answer for this prompt, from a batch's request."""
        if self._closed:
            raise RuntimeError("the prompt batcher is closed")
        loop = asyncio.get_running_loop()
        key = (model, max_tokens, json.dumps(sampling, sort_keys=True, default=str))
        batch = self._open.get(key)
        if batch is None:
            batch = self._open[key] = _Batch(model, max_tokens, sampling)
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
            outcomes = await self._outcomes(batch)
        except BaseException:  # cancelled: the batcher is closing
            _settle(batch.futures, [RuntimeError("the batcher closed")] * len(batch.futures))
            raise
        _settle(batch.futures, outcomes)

    async def _outcomes(self, batch: _Batch) -> list[Outcome]:
        if len(batch.prompts) > 1:
            try:
                return list(await self._many(batch))
            except EngineRejected:
                pass  # retried prompt by prompt: only the one at fault fails
            except Exception as exc:
                return [exc] * len(batch.prompts)
        return await self._each(batch)

    async def _many(self, batch: _Batch) -> list[Generation]:
        """One request for the whole batch; its choices in prompt order."""
        body = vllm_body(batch.model, batch.prompts, batch.max_tokens, batch.sampling)
        self.requests += 1
        payload = await post_vllm_completions(self.session, self.address, body, self.timeout_s)
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

    async def _each(self, batch: _Batch) -> list[Outcome]:
        """A request per prompt: a failure is then its own call's alone."""
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
                    timeout_s=self.timeout_s,
                )
                for prompt in batch.prompts
            ),
            return_exceptions=True,
        )
        for out in outs:
            if not isinstance(out, Generation | Exception):
                raise out  # a cancellation
        return outs  # type: ignore[return-value]

    async def aclose(self) -> None:
        """Fail the calls not sent yet and end the requests in flight."""
        self._closed = True
        for batch in self._open.values():
            _settle(batch.futures, [RuntimeError("the batcher closed")] * len(batch.futures))
        self._open.clear()
        for task in list(self._tasks):
            await cancel_and_wait(task)


def _settle(futures: list[asyncio.Future[Generation]], outcomes: list[Outcome]) -> None:
    """Answer each caller still waiting (a cancelled one's future is done already)."""
    for f, out in zip(futures, outcomes, strict=True):
        if f.done():
            continue
        if isinstance(out, Generation):
            f.set_result(out)
        else:
            f.set_exception(out)
