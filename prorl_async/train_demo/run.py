"""``prorl-async train-demo``: a GRPO run on CPU that learns through the service.

One run owns four processes: the learner (torch, in the engine's venv), a vLLM engine
(CPU) serving the policy, a rollout server (durable store) and this one, which drives
them: warm start, then for each mode, steps of

    batch = RolloutManager.next_batch()      # rollouts of the math handler, via the server
    learner.grpo(batch)                      # one optimiser step; trainer/engine logprob check
    learner.save(checkpoint)                 # an HF checkpoint directory
    manager.set_weights(version=step, path=checkpoint)   # in place on the same engine

``async`` keeps the engine generating (``max_version_lag`` 1, unfinished groups carried)
while the learner trains; ``sync`` generates nothing while it trains (lag 0, unfinished
groups cancelled). Each mode's learner has its fastest measured placement
(``LEARNER_CORES``): sync's trains on both cores while the engine idles.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import random
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, Literal

from tokenizers import Tokenizer

from prorl_async.client import RolloutClient
from prorl_async.llm.tokenizer import load_tokenizer
from prorl_async.train_demo import prompt, task, vocab
from prorl_async.train_demo.grpo import learner_samples, step_figures
from prorl_async.train_demo.learner_client import Learner
from prorl_async.train_demo.procs import RunError, engine, run_in_engine_venv, server
from prorl_async.train_demo.settings import Mode, Settings, model_config
from prorl_async.trainer import RolloutManager
from prorl_async.vllm_cpu import EngineEnv, VllmProcess

__all__ = ["Run", "train_demo"]

log = logging.getLogger(__name__)

Say = Callable[[str], None]
# The engine decodes on core 0 (tiny-model decoding is overhead-bound: one core is nearly
# as fast as two); its API server, the rollout server and this process float.
ENGINE_CORES = "0"
# The demo server's RUN workers: one per sample of a batch in flight and more, so vLLM
# batches as many requests as the manager holds (64, the server's default, capped its
# batches at 64: sync's rollouts took twice as long, 73 s against 35 s for 20 steps).
RUN_WORKERS = 192
# Prompts one vLLM request may carry (the server's pool.batch_prompts): the demo's turns
# are one-turn with one max_tokens, and vLLM's API server, whose CPU is per request,
# shares the cores with everything else (a batch held ~20 prompts; the API server's CPU
# a step halved).
BATCH_PROMPTS = 64
# The policy's window (its max_position_embeddings), the engine's and the server's.
MAX_MODEL_LEN = 1024
# Training problems the warm start holds out to decide when to stop (the first of the
# shuffled training set: a uniform sample of it).
VALIDATION = 200
# The learner's placement in each mode, (torch threads, cores), each mode's fastest in
# paired 20-step runs (steps/min, the idle spin bounded and prompts batched): sync
# trains while nothing generates, so two threads on both cores (35.4-38.1; without
# batching 25.96, and one thread on core 1 20.27); async shares the cores with the
# rollouts, so one thread on core 1 (43.0; allowed on either core 40.0).
LEARNER_CORES: dict[Mode, tuple[int, list[int]]] = {"async": (1, [1]), "sync": (2, [0, 1])}
# The warm start runs before the engine starts: both cores are the learner's.
WARM_START_CORES = (2, [0, 1])


class Run:
    """The parts of one run, opened by ``train_demo`` and shared by its modes."""

    def __init__(self, s: Settings, say: Say, env: EngineEnv) -> None:
        self.s = s
        self.env = env
        self.say = say
        self.out = s.out
        self.tokenizer_dir = self.out / "tokenizer"
        self.step0 = self.out / "checkpoints" / "step-0000"
        self.metrics_path = self.out / "metrics.jsonl"
        self.learner: Learner
        self.engine: VllmProcess
        self.url = ""
        self.heldout = task.held_out_problems()[: s.eval_problems]
        self.warm: dict[str, Any] = {}

    # -- the warm start ---------------------------------------------------------------------

    async def warm_start(self, config: dict[str, Any]) -> None:
        """A seeded random policy, ``sft_steps`` supervised steps on the task, saved as
        ``checkpoints/step-0000``."""
        s = self.s
        threads, cpus = WARM_START_CORES
        await self._call(
            "init",
            config=config,
            model_dir=None,
            seed=s.seed,
            threads=threads,
            cpus=cpus,
            lr=s.sft_lr,
        )
        self.warm = {"sft_steps": 0, "validation_pass": None}
        if s.sft_steps:
            examples = await asyncio.to_thread(self._sft_examples)  # ~9k prompts: off the loop
            check, train = examples[:VALIDATION], examples[VALIDATION:]
            until = "" if s.sft_stop_at is None else f" (until {s.sft_stop_at} on validation)"
            self.say(
                f"warm start: <= {s.sft_steps} supervised steps on {len(train)} problems{until}"
            )
            done = await self._call(
                "sft",
                examples=train,
                steps=s.sft_steps,
                batch_size=s.sft_batch,
                lr=s.sft_lr,
                seed=s.seed,
                check=check if s.sft_stop_at is not None else None,
                check_every=s.sft_check_every,
                stop_at=s.sft_stop_at,
            )
            passed = done["checks"][-1][1] if done["checks"] else None
            self.warm = {"sft_steps": done["steps"], "validation_pass": passed}
            shown = "" if passed is None else f", validation greedy pass {passed:.3f}"
            self.say(
                f"  {done['steps']} steps, loss {done['loss_first']:.3f} -> "
                f"{done['loss_last']:.3f} in {done['train_s']:.1f} s{shown}"
            )
        await self._call("save", dir=str(self.step0), tokenizer_dir=str(self.tokenizer_dir))

    def _sft_examples(self) -> list[dict[str, list[int]]]:
        """Every training problem: the handler's exact prompt, then the answer and the end
        of the turn (what the engine must generate)."""
        tok = load_tokenizer(self.tokenizer_dir)
        end = self.special["<|im_end|>"]
        return [
            {
                "prompt_ids": prompt.prompt_ids(tok, a, b),
                "target_ids": [*tok.encode(task.answer_text(a, b)), end],
            }
            for a, b in task.training_problems()
        ]

    # -- one mode ----------------------------------------------------------------------------

    async def mode(self, mode: Mode) -> dict[str, Any]:
        """Train ``steps`` steps in ``mode`` from the warm start; returns its summary."""
        s = self.s
        threads, cpus = LEARNER_CORES[mode]
        await self._call(
            "init",
            model_dir=str(self.step0),
            seed=s.seed,
            threads=threads,
            cpus=cpus,
            lr=s.lr,
        )
        lag = 1 if mode == "async" else 0
        on_full: Literal["carry", "cancel"] = "carry" if mode == "async" else "cancel"
        manager = RolloutManager(
            servers=[self.url],
            prompts=self._prompts(mode),
            group_size=s.group_size,
            batch_groups=s.prompts_per_step,
            max_version_lag=lag,
            on_batch_full=on_full,
            run_id=f"{mode}-{s.seed}",
            group_filter=s.group_filter,
            progress=False,
            stall_timeout_s=s.step_timeout_s,
        )
        async with RolloutClient(self.url) as client:
            # The engine holds the warm start before this mode's first rollout (an earlier
            # mode left its final weights there): nothing generates until the manager opens.
            await client.add_llm_server(self.engine.address, weight_version=0)
            await client.load_weights(0, str(self.step0))
        async with manager as m:
            # Evaluations hold the manager: no training rollout is generated while one runs
            # (it would queue behind them, and they would be made outside the timed steps).
            async with m.hold():
                await m.set_weights(version=0, backends=[self.engine.address])
                self.say(f"{mode}: held-out pass@1 of the warm start ...")
                initial, eval_s = await self.evaluate()
            return await self._steps(mode, m, initial, eval_s)

    async def _steps(
        self, mode: Mode, m: RolloutManager, initial: float, eval_s: float
    ) -> dict[str, Any]:
        s = self.s
        self.say(f"{mode}: warm start {initial:.3f}; {s.steps} steps")
        start = time.monotonic()
        totals = {"rollout_s": 0.0, "train_s": 0.0, "eval_s": eval_s}
        final, evaluated = initial, 0.0
        for step in range(1, s.steps + 1):
            line = await self._step(mode, m, step, start, totals)
            if step % max(s.eval_every, 1) == 0 or step == s.steps:
                # Waiting for the groups running is training (the next batch's rollouts);
                # the evaluation itself is not.
                async with m.hold():
                    final, took = await self.evaluate()
                totals["eval_s"] += took
                evaluated += took if step < s.steps else 0.0
                line["eval_pass_at_1"] = final
            self._record(line)
            self._progress(mode, line)
        wall = time.monotonic() - start
        # The rate: from the first step to the end of the last, less the evaluations held
        # between steps (the warm start's came before ``start``, the last after the end).
        training = line["wall_s"] - evaluated
        return {
            "steps": s.steps,
            "wall_s": wall,
            "steps_per_min": 60.0 * s.steps / max(training, 1e-9),
            "initial_pass_at_1": initial,
            "final_pass_at_1": final,
            **totals,
        }

    async def _step(
        self, mode: Mode, m: RolloutManager, step: int, start: float, totals: dict[str, float]
    ) -> dict[str, Any]:
        t0 = time.monotonic()
        batch = await m.next_batch()
        t1 = time.monotonic()
        stats = await self._call(
            "grpo",
            samples=learner_samples(batch),
            version=step - 1,
            clip=self.s.clip,
            lr=self.s.lr,
            minibatches=self.s.minibatches,
        )
        checkpoint = self._checkpoint(mode, step)
        await self._call("save", dir=str(checkpoint), tokenizer_dir=str(self.tokenizer_dir))
        t2 = time.monotonic()
        await m.set_weights(version=step, path=str(checkpoint))
        t3 = time.monotonic()
        await asyncio.to_thread(self._prune, mode, step)
        totals["rollout_s"] += t1 - t0
        totals["train_s"] += t3 - t1
        return {
            "mode": mode,
            "trainer": "builtin",
            "step": step,
            "wall_s": round(t3 - start, 3),
            **step_figures(batch),
            "logprob_diff_mean": stats["logprob_diff_mean"],
            "logprob_diff_max": stats["logprob_diff_max"],
            "fidelity_tokens": stats["fidelity_tokens"],
            "loss": stats["loss"],
            "groups_filtered": m.metrics()["groups"]["filtered"],
            "rollout_wait_s": round(t1 - t0, 3),
            "train_s": round(t3 - t1, 3),
            "weight_sync_s": round(t3 - t2, 3),
        }

    # -- TRL as the learner --------------------------------------------------------------------

    async def trl(self) -> dict[str, Any]:
        """``steps`` steps of TRL's GRPOTrainer from the warm start, its rollouts through the
        server (``train_demo.trl_learner``, in the engine's venv); returns its summary."""
        s = self.s
        await asyncio.to_thread(self.env.add_trl, self.say)
        async with RolloutClient(self.url) as client:
            await client.add_llm_server(self.engine.address, weight_version=0)
            await client.load_weights(0, str(self.step0))
        problems = self._problems()
        summary_path = self.out / "logs" / "trl-summary.json"
        spec: dict[str, Any] = {
            "url": self.url,
            "model_dir": str(self.step0),
            "tokenizer_dir": str(self.tokenizer_dir),
            "checkpoints": str(self.out / "checkpoints" / "trl"),
            "metrics": str(self.metrics_path),
            "summary": str(summary_path),
            "steps": s.steps,
            "prompts_per_step": s.prompts_per_step,
            "group_size": s.group_size,
            "max_tokens": s.max_tokens,
            "temperature": s.temperature,
            "lr": s.lr,
            "clip": s.clip,
            "seed": s.seed,
            "eval_every": s.eval_every,
            "heldout": self.heldout,
            "prompts": [next(problems) for _ in range(s.steps * s.prompts_per_step)],
            "timeout_s": s.step_timeout_s,
            "generation": s.trl_generation,
        }
        if s.trl_generation == "trl":
            texts = [prompt.prompt_text(a, b) for a, b in spec["prompts"]]
            spec["prompt_texts"] = texts
        spec_path = self.out / "logs" / "trl-spec.json"
        await asyncio.to_thread(spec_path.write_text, json.dumps(spec))
        bound = s.step_timeout_s * (s.steps + 2)
        module = "prorl_async.train_demo.trl_learner"
        log = self.out / "logs" / "trl.log"
        await run_in_engine_venv(self.env, module, [str(spec_path)], log, bound, self.say)
        text = await asyncio.to_thread(summary_path.read_text)
        summary: dict[str, Any] = json.loads(text)
        return summary

    # -- checkpoints, prompts, evaluation -----------------------------------------------------

    def _checkpoint(self, mode: Mode, step: int) -> Path:
        return self.out / "checkpoints" / f"{mode}-step-{step:04d}"

    def _prune(self, mode: Mode, step: int) -> None:
        """Keep the last two checkpoints of the mode (the engine has loaded the latest)."""
        old = self._checkpoint(mode, step - 2)
        if step > 2 and old.is_dir():
            shutil.rmtree(old)

    def final_checkpoint(self, mode: Mode, name: str) -> Path:
        """Copy the mode's last checkpoint to ``checkpoints/NAME``."""
        target = self.out / "checkpoints" / name
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(self._checkpoint(mode, self.s.steps), target)
        return target

    def _prompts(self, mode: Mode) -> Iterator[dict[str, Any]]:
        """Training problems drawn with replacement, seeded (the same order in both modes)."""
        sampling = {"temperature": self.s.temperature, "max_tokens": self.s.max_tokens}
        for a, b in self._problems():
            yield {"task": "math", "instance": task.instance(a, b), "sampling_params": sampling}

    def _problems(self) -> Iterator[tuple[int, int]]:
        rng = random.Random(self.s.seed)
        pool = task.training_problems()
        while True:
            yield rng.choice(pool)

    async def warm_engine(self) -> float:
        """Run the training problems' kind of work once before any mode, untimed: a fresh
        vLLM CPU engine is slow on its first batches of each size (the first held-out pass
        took 17 s against 1-2 s later), and the first mode would pay for it. Returns the
        seconds it took."""
        t0 = time.monotonic()
        async with RolloutClient(self.url) as client:
            await client.add_llm_server(self.engine.address, weight_version=0)
        problems = self._problems()
        sampled = [next(problems) for _ in range(self.s.prompts_per_step)]
        for temperature, pairs in ((0.0, self.heldout), (self.s.temperature, sampled)):
            sampling = {"temperature": temperature, "max_tokens": self.s.max_tokens}
            jobs = [
                {"task": "math", "instance": task.instance(a, b), "sampling_params": sampling}
                for a, b in pairs
                for _ in range(1 if temperature == 0.0 else self.s.group_size)
            ]
            async with RolloutClient(self.url) as client:
                ids = await client.submit_batch(jobs)
                await _rewards(client, ids, self.s.step_timeout_s)
        return time.monotonic() - t0

    async def evaluate(self) -> tuple[float, float]:
        """Greedy pass@1 on the held-out problems with the engine's current weights, and
        the seconds it took."""
        t0 = time.monotonic()
        sampling = {"temperature": 0.0, "max_tokens": self.s.max_tokens}
        jobs = [
            {"task": "math", "instance": task.instance(a, b), "sampling_params": sampling}
            for a, b in self.heldout
        ]
        async with RolloutClient(self.url) as client:
            ids = await client.submit_batch(jobs)
            rewards = await _rewards(client, ids, self.s.step_timeout_s)
        return sum(rewards) / len(rewards), time.monotonic() - t0

    # -- plumbing ------------------------------------------------------------------------------

    @functools.cached_property
    def special(self) -> dict[str, int]:
        """The ids of the task tokenizer's end-of-text and end-of-turn tokens."""
        tokenizer = Tokenizer.from_file(str(self.tokenizer_dir / "tokenizer.json"))
        ids: dict[str, int] = {}
        for token in ("<|endoftext|>", "<|im_end|>"):
            found = tokenizer.token_to_id(token)
            if found is None:
                raise RunError(f"the task tokenizer has no {token}")
            ids[token] = found
        return ids

    async def _call(self, op: str, **fields: Any) -> dict[str, Any]:
        return await self.learner.call(op, timeout_s=self.s.learner_timeout_s, **fields)

    def _record(self, line: dict[str, Any]) -> None:
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(line) + "\n")

    def _progress(self, mode: Mode, line: dict[str, Any]) -> None:
        shown = f" eval {line['eval_pass_at_1']:.3f}" if "eval_pass_at_1" in line else ""
        self.say(
            f"{mode} step {line['step']:>3}/{self.s.steps}  reward {line['reward_mean']:.3f}  "
            f"versions {line['weight_version_min']}-{line['weight_version_max']}  "
            f"|dlogp| max {_sci(line['logprob_diff_max'])}  "
            f"rollout {line['rollout_wait_s']:.1f} s  train {line['train_s']:.1f} s{shown}"
        )


def _sci(value: float | None) -> str:
    """``1.2e-06``, or ``-`` for a step with no token of the current version."""
    return "-" if value is None else f"{value:.1e}"


async def _rewards(client: RolloutClient, ids: list[str], timeout_s: float) -> list[float]:
    """Each job's reward (0 for a job that did not finish ``done``), waiting at most
    ``timeout_s`` for all of them."""
    rewards: dict[str, float] = {}
    async with asyncio.timeout(timeout_s):
        while len(rewards) < len(ids):
            pending = [i for i in ids if i not in rewards]
            answer = await client.poll(pending, wait=5.0)
            for doc in answer.get("done", []):
                ok = doc.get("status") == "done" and doc.get("reward") is not None
                rewards[doc["job_id"]] = float(doc["reward"]) if ok else 0.0
            for job_id in answer.get("unknown", []):
                raise RunError(f"the server forgot evaluation job {job_id}")
    return [rewards[i] for i in ids]


async def train_demo(s: Settings, say: Say) -> dict[str, Any]:
    """Run ``s``; returns the summary (also written to ``OUT/summary.json``)."""
    s.check()
    env = EngineEnv()
    if not env.ready:
        say("the engine venv is missing: setting it up (once: ~3.4 GB, ~6 min) ...")
        await asyncio.to_thread(env.setup, say)
    run = Run(s, say, env)
    s.out.mkdir(parents=True, exist_ok=True)
    run.metrics_path.unlink(missing_ok=True)
    await asyncio.to_thread(vocab.build_task_tokenizer, run.tokenizer_dir)
    config = model_config(s, vocab.model_vocab_size(run.tokenizer_dir), run.special, MAX_MODEL_LEN)
    logs = s.out / "logs"
    summary: dict[str, Any] = {"modes": {}}
    async with AsyncExitStack() as stack:
        run.learner = await stack.enter_async_context(
            Learner(log_path=logs / "learner.log", env=env)
        )
        await run.warm_start(config)
        summary["warm_start"] = run.warm
        run.engine = await stack.enter_async_context(
            engine(env, run.step0, logs / "vllm.log", ENGINE_CORES, MAX_MODEL_LEN)
        )
        config_path = s.out / "server.toml"
        config_path.write_text(f"[pool]\nbatch_prompts = {BATCH_PROMPTS}\n")
        server_args = ["--config", str(config_path)]
        server_args += ["--tokenizer", str(run.tokenizer_dir), "--store", "sqlite"]
        server_args += ["--max-model-len", str(MAX_MODEL_LEN), "--run-workers", str(RUN_WORKERS)]
        server_args += ["--sandbox-start", "on_first_use", "--log-level", "warning"]
        run.url = await stack.enter_async_context(
            server(server_args, s.out / "state", logs / "server.log")
        )
        summary["trainer"] = s.trainer
        say("engine warm-up: the held-out problems and one batch, untimed ...")
        summary["engine_warm_up_s"] = await run.warm_engine()
        if s.trainer == "trl":
            summary["modes"]["sync"] = done = await run.trl()
            final = s.out / "checkpoints" / "final"
            await asyncio.to_thread(shutil.rmtree, final, True)
            await asyncio.to_thread(Path(done.pop("final_checkpoint")).rename, final)
        for mode in s.modes if s.trainer == "builtin" else ():
            summary["modes"][mode] = await run.mode(mode)
            name = "final" if mode == s.modes[0] else f"{mode}-final"
            await asyncio.to_thread(run.final_checkpoint, mode, name)
    (s.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
