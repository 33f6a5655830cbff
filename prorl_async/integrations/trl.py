"""TRL's ``GRPOTrainer`` with the service as its rollout backend.

Three pieces, given to the trainer::

    rollouts = ServiceRollouts(["http://node1:8000", "http://node2:8000"])
    trainer = GRPOTrainer(
        model=...,
        reward_funcs=service_reward,              # the task's grader stays on the service
        rollout_func=rollouts,                    # one job per prompt TRL hands it
        callbacks=[weight_sync_callback(rollouts, "ckpts")],   # /weights/load each step
        train_dataset=Dataset.from_list([dataset_row("math", {...}), ...]),
        args=GRPOConfig(...),
    )

**How a dataset row reaches a job.** TRL gives ``rollout_func`` only the rows' ``prompt``
column (each prompt ``num_generations`` times in a row). A row's ``prompt`` is therefore
the job itself, as JSON text: ``{"task": ..., "instance": {...}, "sampling_params":
{...}}`` (:func:`dataset_row` writes it). ``sampling_params`` a row leaves out come from
the trainer: ``temperature`` and ``max_tokens`` (``max_completion_length``).

**What TRL gets back**, one entry per prompt, from the job's result: ``prompt_ids``,
``completion_ids`` (every response token of the trajectory, tool observations included),
``logprobs`` (the engine's, per token), ``env_mask`` (``response_mask``: 0 for tool and
observation tokens, which TRL's loss leaves out), and the extra fields ``reward``,
``response_versions`` and ``job_id`` (TRL forwards extra fields to reward functions).
A job that did not finish ``done`` comes back as one pad token with ``env_mask`` 0 and
reward ``None`` (TRL leaves an unscored completion out of its group's baseline).

No torch or TRL is imported here until :func:`weight_sync_callback` is called: the rest
runs (and is tested) in the project's own install.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
from collections.abc import Coroutine, Sequence
from concurrent.futures import Future
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

from prorl_async.client import RolloutClient, RolloutError

__all__ = [
    "RolloutsError",
    "ServiceRollouts",
    "WeightSyncError",
    "completion_fields",
    "dataset_row",
    "parse_prompt",
    "service_reward",
    "weight_sync_callback",
]

T = TypeVar("T")

KEYS = ("prompt_ids", "completion_ids", "logprobs", "env_mask", "reward", "response_versions")


class RolloutsError(RuntimeError):
    """A batch of rollouts could not be produced (a server refused or did not answer)."""


class WeightSyncError(RuntimeError):
    """A weight load failed on a server: training stops rather than go on with stale
    weights."""


def dataset_row(
    task: str,
    instance: dict[str, Any],
    sampling_params: dict[str, Any] | None = None,
    **columns: Any,
) -> dict[str, Any]:
    """A dataset row whose ``prompt`` is the job (``columns`` are kept beside it)."""
    job: dict[str, Any] = {"task": task, "instance": instance}
    if sampling_params:
        job["sampling_params"] = sampling_params
    return {"prompt": json.dumps(job, sort_keys=True), **columns}


def parse_prompt(prompt: Any) -> dict[str, Any]:
    """The job a row's ``prompt`` holds; ``ValueError`` naming what is wrong otherwise."""
    if not isinstance(prompt, str):
        raise ValueError(
            f"prompt: expected the JSON text of a job (see dataset_row), got a "
            f"{type(prompt).__name__}"
        )
    try:
        job = json.loads(prompt)
    except json.JSONDecodeError as exc:
        raise ValueError(f"prompt: not JSON ({exc.msg}): {prompt[:80]!r}") from None
    if not isinstance(job, dict) or not isinstance(job.get("task"), str):
        raise ValueError(f"prompt: a JSON object with a 'task' string, got {prompt[:80]!r}")
    if not isinstance(job.get("instance"), dict):
        raise ValueError(f"prompt: 'instance' must be an object, got {prompt[:80]!r}")
    return job


def completion_fields(result: dict[str, Any], pad_id: int) -> dict[str, Any]:
    """One prompt's entry of TRL's rollout output, from the job's result document."""
    response = list(result.get("response_ids") or [])
    done = result.get("status") == "done" and bool(response)
    if not done:
        return {
            "prompt_ids": list(result.get("prompt_ids") or [pad_id]),
            "completion_ids": [pad_id],
            "logprobs": [None],
            "env_mask": [0],
            "reward": None,
            "response_versions": [None],
        }
    n = len(response)
    reward = result.get("reward")
    return {
        "prompt_ids": list(result["prompt_ids"]),
        "completion_ids": response,
        "logprobs": _fit(result.get("response_logprobs"), n, None),
        "env_mask": [int(m) for m in _fit(result.get("response_mask"), n, 1)],
        "reward": float(reward) if isinstance(reward, int | float) else None,
        "response_versions": _fit(result.get("response_versions"), n, None),
    }


def _fit(values: Any, n: int, fill: Any) -> list[Any]:
    got: list[Any] = list(values or [])[:n]
    return got + [fill] * (n - len(got))


def service_reward(
    prompts: Sequence[Any], completions: Sequence[Any], reward: Sequence[float | None], **_: Any
) -> list[float | None]:
    """TRL reward function: the service's reward of each completion (``None``: unscored)."""
    return list(reward)


class ServiceRollouts:
    """TRL's ``rollout_func`` over one or many servers: ``rollouts(prompts, trainer)``.

    Each group of identical consecutive prompts goes to one server (round robin); every
    job is long-polled until done, bounded by ``timeout_s`` for the whole batch. It owns an
    event loop on a thread of its own (TRL calls it synchronously); ``close`` ends it.

    ``max_version_lag``: after :meth:`load_weights` has loaded version V, a batch whose
    model tokens came from a version below ``V - max_version_lag`` raises
    :class:`RolloutsError` (stale weights never reach the loss unnoticed).
    """

    def __init__(
        self,
        servers: Sequence[str],
        *,
        token: str | None = None,
        sampling_params: dict[str, Any] | None = None,
        timeout_s: float = 900.0,
        poll_wait_s: float = 10.0,
        load_timeout_s: float = 900.0,
        max_version_lag: int = 0,
    ) -> None:
        if not servers:
            raise ValueError("servers: at least one server URL")
        self.servers = [s.rstrip("/") for s in servers]
        self.sampling_params = dict(sampling_params or {})
        self.timeout_s, self.poll_wait_s = timeout_s, poll_wait_s
        self.load_timeout_s, self.max_version_lag = load_timeout_s, max_version_lag
        self.loaded_version: int | None = None
        self.last_results: list[dict[str, Any]] = []
        self._token = token
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._clients: list[RolloutClient] = self._run(self._open(), 30.0)

    # -- TRL's side ------------------------------------------------------------------------

    def __call__(self, prompts: Sequence[Any], trainer: Any = None) -> dict[str, list[Any]]:
        jobs = [parse_prompt(p) for p in prompts]
        defaults = self._defaults(trainer)
        for job in jobs:
            job["sampling_params"] = {**defaults, **(job.get("sampling_params") or {})}
        results = self._run(self._rollouts(jobs), self.timeout_s + 30.0)
        self._check_versions(results)
        self.last_results = results
        out: dict[str, list[Any]] = {key: [] for key in KEYS}
        out["job_id"] = []
        pad = _pad_id(trainer)
        for result in results:
            fields = completion_fields(result, pad)
            for key in KEYS:
                out[key].append(fields[key])
            out["job_id"].append(result.get("job_id"))
        return out

    def _defaults(self, trainer: Any) -> dict[str, Any]:
        params = dict(self.sampling_params)
        args = getattr(trainer, "args", None)
        if args is not None:
            params.setdefault("temperature", getattr(args, "temperature", 1.0))
            if getattr(args, "max_completion_length", None):
                params.setdefault("max_tokens", int(args.max_completion_length))
        return params

    def _check_versions(self, results: list[dict[str, Any]]) -> None:
        if self.loaded_version is None:
            return
        floor = self.loaded_version - self.max_version_lag
        for result in results:
            mask = result.get("response_mask") or []
            for version, m in zip(result.get("response_versions") or [], mask, strict=False):
                if m and isinstance(version, int) and version < floor:
                    raise RolloutsError(
                        f"job {result.get('job_id')}: a token of weight version {version}, "
                        f"but version {self.loaded_version} was loaded (lag allowed "
                        f"{self.max_version_lag}): the engines did not take the new weights"
                    )

    def load_weights(self, version: int, path: str | Path) -> list[dict[str, Any]]:
        """``POST /weights/load`` on every server (in place, abort mode); each answer.
        Raises :class:`WeightSyncError` naming the server that failed."""
        answers = self._run(self._load(version, str(path)), self.load_timeout_s + 30.0)
        self.loaded_version = version
        return answers

    # -- the loop's side ------------------------------------------------------------------

    async def _open(self) -> list[RolloutClient]:
        clients = [RolloutClient(url, token=self._token) for url in self.servers]
        for client in clients:
            await client.__aenter__()
        return clients

    async def _rollouts(self, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        groups: list[list[int]] = []
        for i, job in enumerate(jobs):
            if groups and jobs[groups[-1][0]] == job:
                groups[-1].append(i)
            else:
                groups.append([i])
        per_server: list[list[int]] = [[] for _ in self._clients]
        for g, members in enumerate(groups):
            per_server[g % len(self._clients)].extend(members)
        found: dict[int, dict[str, Any]] = {}
        async with asyncio.timeout(self.timeout_s):
            async with asyncio.TaskGroup() as tg:
                for client, index in zip(self._clients, per_server, strict=True):
                    if index:
                        batch = [jobs[i] for i in index]
                        tg.create_task(self._on_server(client, batch, index, found))
        return [found[i] for i in range(len(jobs))]

    async def _on_server(
        self,
        client: RolloutClient,
        jobs: list[dict[str, Any]],
        index: list[int],
        found: dict[int, dict[str, Any]],
    ) -> None:
        try:
            ids = await client.submit_batch(jobs)
        except RolloutError as exc:
            raise RolloutsError(f"{client.base_url} refused the batch: {exc}") from exc
        where = dict(zip(ids, index, strict=True))
        pending = list(ids)
        while pending:
            answer = await client.poll(pending, wait=self.poll_wait_s)
            for doc in answer.get("done", []):
                found[where[doc["job_id"]]] = doc
            if answer.get("unknown"):
                raise RolloutsError(f"{client.base_url} forgot jobs {answer['unknown'][:3]}")
            pending = [i for i in pending if where[i] not in found]

    async def _load(self, version: int, path: str) -> list[dict[str, Any]]:
        async def one(client: RolloutClient) -> dict[str, Any]:
            try:
                answer = await client.load_weights(version, path, wait=self.load_timeout_s)
            except (RolloutError, OSError, TimeoutError) as exc:
                raise WeightSyncError(
                    f"{client.base_url}: loading version {version} from {path} failed: "
                    f"{exc or type(exc).__name__}"
                ) from exc
            backends = answer.get("backends") or {}
            failed = [(a, b) for a, b in backends.items() if not b.get("ok", True)]
            if failed:
                address, doc = failed[0]
                raise WeightSyncError(
                    f"{client.base_url}: loading version {version} failed on {address}: "
                    f"{doc.get('error')}"
                )
            return answer

        try:
            return list(await asyncio.gather(*(one(c) for c in self._clients)))
        except TimeoutError as exc:
            raise WeightSyncError(f"loading version {version}: no answer in time") from exc

    def _run(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        if not self._thread.is_alive():
            coro.close()
            raise RolloutsError("the rollouts' event loop is closed")
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout_s)
        except TimeoutError:
            future.cancel()
            raise RolloutsError(f"no answer within {timeout_s:.0f} s") from None

    # -- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        """Close the clients and end the loop's thread (bounded)."""
        if not self._thread.is_alive():
            return

        async def shut() -> None:
            for client in self._clients:
                await client.aclose()

        try:
            self._run(shut(), 10.0)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10.0)
            if not self._thread.is_alive():
                self._loop.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _pad_id(trainer: Any) -> int:
    tokenizer = getattr(trainer, "processing_class", None)
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor wraps one
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, int):
            return value
    return 0


def weight_sync_callback(
    rollouts: ServiceRollouts,
    save_dir: str | Path,
    *,
    tokenizer_files: Sequence[str | Path] = (),
    keep: int = 2,
) -> Any:
    """A ``transformers.TrainerCallback``: after each optimiser step, save the policy to
    ``save_dir/step-NNNN`` (with ``tokenizer_files`` copied in) and load it on every
    server at version ``global_step``; the ``keep`` newest checkpoints stay on disk. A
    failed load raises :class:`WeightSyncError` out of ``trainer.train()``."""
    from transformers import TrainerCallback

    root = Path(save_dir)

    class WeightSync(TrainerCallback):  # type: ignore[misc]
        """Saves and loads the policy on the engines after every optimiser step."""

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            step = int(state.global_step)
            path = root / f"step-{step:04d}"
            save_policy(kw["model"], path, tokenizer_files)
            rollouts.load_weights(step, path)
            old = root / f"step-{step - keep:04d}"
            if step > keep and old.is_dir():
                shutil.rmtree(old)

    return WeightSync()


def save_policy(model: Any, path: Path, tokenizer_files: Sequence[str | Path] = ()) -> None:
    """``model.save_pretrained`` to ``PATH.tmp`` (with ``tokenizer_files`` copied in), then
    renamed over ``path`` (an old one moved aside first): an engine loading it sees a
    whole checkpoint or none."""
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(tmp))  # safetensors (transformers 5 writes nothing else)
    for name in tokenizer_files:
        shutil.copyfile(name, tmp / Path(name).name)
    if path.exists():
        old = path.with_name(path.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        path.rename(old)
        tmp.rename(path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(path)
