"""The learner process: a Qwen3 policy in fp32 with AdamW, driven one request a line.

Run only with the engine venv's Python (torch and transformers are there; the project's
own install never imports torch)::

    PYTHONPATH=CHECKOUT python -m prorl_async.train_demo.learner

Requests arrive on stdin and answers leave on stdout, one JSON object a line each
(:mod:`.learner_protocol`): ``init``, ``threads``, ``sft``, ``grpo``, ``logprobs``,
``save``, ``exit``. A request that cannot be read or carried out is answered with
``"ok": false`` and an error naming what was wrong; the process goes on. EOF on stdin ends
it. Logs go to stderr; file descriptor 1 is pointed at stderr too, so a stray print from a
library cannot corrupt the protocol stream.
"""

from __future__ import annotations

import logging
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import msgspec

from prorl_async.train_demo import learner_math as lm
from prorl_async.train_demo.learner_checkpoint import (
    TOKENIZER_FILES,
    build_model,
    load_model,
    save_checkpoint,
)
from prorl_async.train_demo.learner_protocol import (
    OPS,
    Envelope,
    Example,
    Exit,
    Grpo,
    GrpoSample,
    Init,
    Logprobs,
    Request,
    Save,
    Sft,
    Threads,
)

__all__ = ["LearnerSession", "main"]

log = logging.getLogger("prorl_async.learner")
_envelope = msgspec.json.Decoder(Envelope)
_request = msgspec.json.Decoder(Request)
_encode = msgspec.json.Encoder().encode


TIED_WARNING = (
    "tie_word_embeddings is true: vLLM CPU 0.32's in-place reload_weights keeps the lm_head's "
    "packed weights from start-up, so after a weight load the engine's logprobs drift from "
    "this policy's (~1e-2); untie the embeddings for a policy that is loaded in place"
)


class RequestError(ValueError):
    """A request that is well-formed JSON but cannot be carried out as asked."""


class LearnerSession:
    """The policy, its optimiser and the op handlers."""

    def __init__(self) -> None:
        self.model: Any = None
        self.optimizer: Any = None
        self.exiting = False
        self._ops: dict[type[Any], Callable[[Any], dict[str, Any]]] = {
            Init: self.init,
            Threads: self.threads,
            Sft: self.sft,
            Grpo: self.grpo,
            Logprobs: self.logprobs,
            Save: self.save,
            Exit: self.exit,
        }

    def handle(self, line: bytes) -> bytes:
        """The answer to one request line (never raises for a bad request)."""
        try:
            head = _envelope.decode(line)
        except msgspec.DecodeError as exc:
            return _encode({"id": None, "ok": False, "error": f"unreadable request: {exc}"})
        started = time.perf_counter()
        try:
            answer = self._dispatch(head, line)
        except (msgspec.DecodeError, RequestError) as exc:
            return _encode({"id": head.id, "ok": False, "error": f"{head.op}: {exc}"})
        except Exception as exc:  # a failed op leaves the process serving
            log.exception("op %s failed", head.op)
            error = f"{head.op}: {type(exc).__name__}: {exc}"
            return _encode({"id": head.id, "ok": False, "error": error})
        log.info("op %s id %s: %.3f s", head.op, head.id, time.perf_counter() - started)
        return _encode({"id": head.id, "ok": True, **answer})

    def _dispatch(self, head: Envelope, line: bytes) -> dict[str, Any]:
        if head.op not in OPS:
            raise RequestError(f"unknown op {head.op!r}; known: {', '.join(OPS)}")
        if head.id is None:
            raise RequestError("a request needs an integer 'id'")
        request = _request.decode(line)
        if self.model is None and not isinstance(request, Init | Threads | Exit):
            raise RequestError("no policy yet: send 'init' first")
        return self._ops[type(request)](request)

    # -- ops ---------------------------------------------------------------------------------

    def init(self, req: Init) -> dict[str, Any]:
        import torch

        if (req.config is None) == (req.model_dir is None):
            raise RequestError("give exactly one of 'config' (a new policy) and 'model_dir'")
        if req.threads is not None or req.cpus is not None:
            threads = req.threads if req.threads is not None else torch.get_num_threads()
            self.threads(Threads(id=req.id, threads=threads, cpus=req.cpus))
        torch.manual_seed(req.seed)
        try:
            if req.model_dir is not None:
                model = load_model(req.model_dir)
            else:
                model = build_model(req.config or {}, req.seed)
        except TypeError as exc:  # a config Qwen3Config cannot take
            raise RequestError(f"config: {exc}") from exc
        if model.config.tie_word_embeddings:
            log.warning(TIED_WARNING)
        self.model = model
        self.optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=req.lr,
            betas=req.betas,
            weight_decay=req.weight_decay,
            eps=req.eps,
        )
        return {"params": sum(p.numel() for p in model.parameters())}

    def threads(self, req: Threads) -> dict[str, Any]:
        import torch

        if req.threads < 1:
            raise RequestError("threads must be >= 1")
        if req.cpus is not None:
            _pin(req.cpus)
        torch.set_num_threads(req.threads)
        return {"threads": torch.get_num_threads(), "cpus": sorted(os.sched_getaffinity(0))}

    def sft(self, req: Sft) -> dict[str, Any]:
        if not req.examples or req.steps < 0 or req.batch_size < 1:
            raise RequestError("needs examples, steps >= 0 and batch_size >= 1")
        for k, ex in enumerate(req.examples):
            self._check_tokens(f"examples[{k}]", ex.prompt_ids, ex.target_ids)
            if not ex.target_ids:
                raise RequestError(f"examples[{k}]: target_ids is empty")
        if req.check_every < 1:
            raise RequestError("check_every: must be >= 1")
        self._set_lr(req.lr)
        rng, started, losses = random.Random(req.seed), time.perf_counter(), []
        checks: list[tuple[int, float]] = []
        for step in range(1, req.steps + 1):
            batch = _draw(rng, req.examples, req.batch_size)
            scored = lm.token_logprobs(
                self.model, [e.prompt_ids for e in batch], [e.target_ids for e in batch]
            )
            losses.append(self._step(-scored.logprobs.mean(), None)[0])
            if req.check and req.stop_at is not None and step % req.check_every == 0:
                checks.append((step, self._pass_rate(req.check)))
                if checks[-1][1] >= req.stop_at:
                    break
        return {
            "loss_first": losses[0] if losses else None,
            "loss_last": losses[-1] if losses else None,
            "steps": len(losses),
            "checks": checks,
            "train_s": time.perf_counter() - started,
        }

    def _pass_rate(self, check: list[Example]) -> float:
        hits = lm.greedy_match(
            self.model, [e.prompt_ids for e in check], [e.target_ids for e in check]
        )
        return sum(hits) / len(hits)

    def grpo(self, req: Grpo) -> dict[str, Any]:
        clip_low, clip_high = self._check_grpo(req)
        self._set_lr(req.lr)
        started = time.perf_counter()
        chunks = _split(req.samples, req.minibatches)
        # Later minibatches run after a step: with several, measure the fidelity first.
        fidelity = self._fidelity(req) if len(chunks) > 1 else None
        tally = _Tally()
        for chunk in chunks:
            new = self._scored(chunk, req.temperature).logprobs
            if fidelity is None:  # one minibatch: its forward is the policy at `version`
                fidelity = lm.fidelity(new, *_engine_tokens(chunk, req.version))
            terms = lm.grpo_terms(new, *_flat_terms(chunk), clip_low, clip_high)
            if terms.tokens:  # none: no step (Adam's momentum alone would move the policy)
                tally.add(terms, *self._step(terms.loss, req.max_grad_norm))
        assert fidelity is not None
        return {
            **tally.summary(),
            "logprob_diff_mean": fidelity.mean,
            "logprob_diff_max": fidelity.max,
            "fidelity_tokens": fidelity.tokens,
            "train_s": time.perf_counter() - started,
        }

    def logprobs(self, req: Logprobs) -> dict[str, Any]:
        import torch

        _check_temperature(req.temperature)
        for k, s in enumerate(req.samples):
            self._check_tokens(f"samples[{k}]", s.prompt_ids, s.response_ids)
        if not req.samples:
            return {"logprobs": []}
        with torch.no_grad():
            scored = self._scored(req.samples, req.temperature)
        flat: list[float] = scored.logprobs.tolist()
        out, at = [], 0
        for n in scored.lengths:
            out.append(flat[at : at + n])
            at += n
        return {"logprobs": out}

    def save(self, req: Save) -> dict[str, Any]:
        started = time.perf_counter()
        if req.tokenizer_dir is not None:
            missing = [n for n in TOKENIZER_FILES if not (Path(req.tokenizer_dir) / n).is_file()]
            if missing:
                raise RequestError(f"tokenizer_dir {req.tokenizer_dir} has no {missing}")
        save_checkpoint(self.model, Path(req.dir), req.tokenizer_dir)
        return {"dir": req.dir, "save_s": time.perf_counter() - started}

    def exit(self, req: Exit) -> dict[str, Any]:
        self.exiting = True
        return {}

    # -- helpers -----------------------------------------------------------------------------

    def _scored(self, samples: list[Any], temperature: float) -> lm.Scored:
        prompts = [s.prompt_ids for s in samples]
        return lm.token_logprobs(
            self.model, prompts, [s.response_ids for s in samples], temperature
        )

    def _fidelity(self, req: Grpo) -> lm.Fidelity:
        import torch

        with torch.no_grad():
            new = self._scored(req.samples, req.temperature).logprobs
        return lm.fidelity(new, *_engine_tokens(req.samples, req.version))

    def _step(self, loss: Any, max_grad_norm: float | None) -> tuple[float, float]:
        import torch

        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        bound = float("inf") if max_grad_norm is None else max_grad_norm
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), bound)
        self.optimizer.step()
        return float(loss.detach()), float(norm)

    def _set_lr(self, lr: float | None) -> None:
        if lr is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = lr

    def _check_tokens(self, where: str, prompt: list[int], response: list[int]) -> None:
        config = self.model.config
        if not prompt:
            raise RequestError(f"{where}: prompt_ids is empty")
        if len(prompt) + len(response) > config.max_position_embeddings:
            raise RequestError(
                f"{where}: {len(prompt) + len(response)} tokens is more than "
                f"max_position_embeddings {config.max_position_embeddings}"
            )
        bad = [t for t in (*prompt, *response) if not 0 <= t < config.vocab_size]
        if bad:
            raise RequestError(f"{where}: token ids outside 0..{config.vocab_size - 1}: {bad[:5]}")

    def _check_grpo(self, req: Grpo) -> tuple[float, float]:
        clip_low = req.clip if req.clip_low is None else req.clip_low
        clip_high = req.clip if req.clip_high is None else req.clip_high
        if not req.samples or req.minibatches < 1 or min(clip_low, clip_high) < 0:
            raise RequestError("needs samples, minibatches >= 1 and clip ranges >= 0")
        _check_temperature(req.temperature)
        for k, s in enumerate(req.samples):
            self._check_sample(k, s)
        return clip_low, clip_high

    def _check_sample(self, k: int, s: GrpoSample) -> None:
        self._check_tokens(f"samples[{k}]", s.prompt_ids, s.response_ids)
        n = len(s.response_ids)
        for name in ("response_mask", "logprobs", "versions"):
            value = getattr(s, name)
            if value is not None and len(value) != n:
                raise RequestError(
                    f"samples[{k}].{name} has {len(value)} entries for {n} response tokens"
                )


class _Tally:
    """Sums over a GRPO update's optimiser steps, token-weighted."""

    def __init__(self) -> None:
        self.loss = self.clipped = 0.0
        self.tokens = self.steps = 0
        self.grad_norm = 0.0

    def add(self, terms: lm.GrpoTerms, loss: float, grad_norm: float) -> None:
        self.loss += loss * terms.tokens
        self.clipped += terms.clip_frac * terms.tokens
        self.tokens += terms.tokens
        self.steps += 1
        self.grad_norm = max(self.grad_norm, grad_norm)

    def summary(self) -> dict[str, Any]:
        n = max(self.tokens, 1)
        return {
            "loss": self.loss / n,
            "tokens": self.tokens,
            "clip_frac": self.clipped / n,
            "grad_norm": self.grad_norm,
            "steps": self.steps,
        }


def _pin(cpus: list[int]) -> None:
    """Pin every thread of this process to ``cpus`` (threads made later inherit it)."""
    allowed = os.sched_getaffinity(0) | set(range(os.cpu_count() or 1))
    if not cpus or not set(cpus) <= allowed:
        raise RequestError(f"cpus {cpus} is not a non-empty subset of {sorted(allowed)}")
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:
            pass  # that thread has ended


def _check_temperature(temperature: float) -> None:
    if not temperature > 0:
        raise RequestError(f"temperature must be > 0, not {temperature}")


def _draw(rng: random.Random, examples: list[Example], size: int) -> list[Example]:
    if size >= len(examples):
        return rng.choices(examples, k=size)
    return rng.sample(examples, size)


def _split(samples: list[GrpoSample], parts: int) -> list[list[GrpoSample]]:
    parts = min(parts, len(samples))
    size, extra = divmod(len(samples), parts)
    out, at = [], 0
    for k in range(parts):
        n = size + (k < extra)
        out.append(samples[at : at + n])
        at += n
    return out


def _mask(s: GrpoSample) -> list[int]:
    return s.response_mask if s.response_mask is not None else [1] * len(s.response_ids)


def _flat_terms(samples: list[GrpoSample]) -> tuple[list[float | None], list[float], list[int]]:
    """Engine logprobs, advantages and masks, one entry per response token."""
    engine: list[float | None] = []
    advantages: list[float] = []
    mask: list[int] = []
    for s in samples:
        n = len(s.response_ids)
        engine += s.logprobs if s.logprobs is not None else [None] * n
        advantages += [s.advantage] * n
        mask += _mask(s)
    return engine, advantages, mask


def _engine_tokens(
    samples: list[GrpoSample], version: int
) -> tuple[list[float | None], list[bool]]:
    """Engine logprobs and which tokens the fidelity check takes: model tokens the engine
    made at ``version`` (the policy the learner holds now), with a logprob."""
    engine, _, mask = _flat_terms(samples)
    versions: list[int | None] = []
    for s in samples:
        versions += s.versions if s.versions is not None else [None] * len(s.response_ids)
    chosen = [
        m == 1 and v == version and x is not None
        for m, v, x in zip(mask, versions, engine, strict=True)
    ]
    return engine, chosen


def _protocol_stream() -> BinaryIO:
    """The answer stream: a private copy of fd 1; fd 1 itself then goes to stderr."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def main() -> int:
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(asctime)s learner %(message)s"
    )
    out = _protocol_stream()
    session = LearnerSession()
    log.info("ready (pid %d)", os.getpid())
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        out.write(session.handle(line) + b"\n")
        out.flush()
        if session.exiting:
            break
    log.info("exiting")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
