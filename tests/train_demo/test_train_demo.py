"""``train-demo`` end to end on the real engine, small: the mechanics, not the learning
(that is ``bench/train_demo.py``: seconds of learning prove nothing).

Checked: a warm start and each mode's final checkpoint are written as loadable HF
directories; every step loads its checkpoint in place and the next rollouts carry its
version (sync: exactly the previous step's; async: within the lag); the learner agrees
with the engine on the current version's tokens to 1e-3; metrics, summary and the
picture are written. And a dead engine ends the run with an error naming it, leaving no
process behind.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from prorl_async.client import RolloutClient
from prorl_async.train_demo import run as run_module
from prorl_async.train_demo.report import plot
from prorl_async.train_demo.run import Run, train_demo
from prorl_async.train_demo.settings import Settings
from prorl_async.trainer import RolloutManager
from prorl_async.vllm_cpu import EngineEnv
from tests.proctree import cmdline, descendants

# A real engine start (~60 s), a learner (torch import), two short modes.
pytestmark = pytest.mark.timeout(900)

METRIC_KEYS = {
    "mode",
    "trainer",
    "step",
    "wall_s",
    "reward_mean",
    "pass_rate",
    "tokens",
    "logprob_diff_mean",
    "logprob_diff_max",
    "weight_version_min",
    "weight_version_max",
    "rollout_wait_s",
    "train_s",
    "weight_sync_s",
}


def small(out: Path, **overrides: Any) -> Settings:
    """Seconds of work a mode; every group kept (a barely warm policy may score all 0)."""
    fields: dict[str, Any] = {
        "out": out,
        "steps": 2,
        "prompts_per_step": 4,
        "group_size": 4,
        "sft_steps": 30,
        # Steps large enough that the async run's weights differ from the warm start's by
        # far more than 1e-3 in logprob: sync's first step then shows whether the engine
        # was given the warm start back before generating.
        "lr": 1e-2,
        "eval_every": 2,
        "eval_problems": 8,
        "group_filter": None,
        "step_timeout_s": 120.0,
        "learner_timeout_s": 300.0,
    }
    return Settings(**(fields | overrides))


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _checkpoint_ok(path: Path) -> None:
    names = {p.name for p in path.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= names, (path, names)
    assert json.loads((path / "config.json").read_text())["tie_word_embeddings"] is False


async def test_a_short_run_trains_through_the_service_in_both_modes(
    engine_env: EngineEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    said: list[str] = []
    opened: list[list[tuple[Any, Any]]] = []  # the engine's weights as each mode begins
    placed: list[set[frozenset[int]]] = []  # the cores of the engine processes' threads

    class Recording(RolloutManager):
        async def __aenter__(self) -> RolloutManager:
            async with RolloutClient(self.urls[0]) as client:
                backends = await client.weights()
            opened.append([(b["weight_version"], b["weights_path"]) for b in backends])
            placed.append(_engine_cores(out))
            return await super().__aenter__()

    monkeypatch.setattr(run_module, "RolloutManager", Recording)
    summary = await train_demo(small(out), said.append)
    # Each mode's first rollout is made by the warm start, labelled version 0: it is
    # loaded before the manager opens (sync follows async, whose weights are loaded).
    warm = str(out / "checkpoints" / "step-0000")
    assert opened == [[(0, warm)], [(0, warm)]], opened
    # The engine core and the worker, every thread, on the engine's core (vLLM itself binds
    # only the worker's OpenMP threads).
    assert placed == [{frozenset({0})}, {frozenset({0})}], placed
    for name in ("step-0000", "final", "sync-final"):
        _checkpoint_ok(out / "checkpoints" / name)
    # The final checkpoints are the last steps' (each loaded in place by the engine).
    last = out / "checkpoints" / "async-step-0002" / "model.safetensors"
    assert (out / "checkpoints" / "final" / "model.safetensors").read_bytes() == last.read_bytes()
    lines = _lines(out / "metrics.jsonl")
    assert [(x["mode"], x["step"]) for x in lines] == [
        ("async", 1),
        ("async", 2),
        ("sync", 1),
        ("sync", 2),
    ]
    for x in lines:
        assert METRIC_KEYS <= set(x), METRIC_KEYS - set(x)
        assert x["trainer"] == "builtin" and x["tokens"] > 0
        # Tokens of the learner's current version are checked against the engine's
        # logprobs; an async step may have none (all made before the last load landed).
        if x["fidelity_tokens"]:
            assert x["logprob_diff_max"] <= 1e-3, x
        else:
            assert x["mode"] == "async" and x["logprob_diff_max"] is None, x
        lag = x["step"] - x["weight_version_min"]
        assert lag == 1 if x["mode"] == "sync" else 1 <= lag <= 2, x
    assert all("eval_pass_at_1" in x for x in lines if x["step"] == 2)
    assert any(x["fidelity_tokens"] for x in lines if x["mode"] == "async")
    for mode in ("async", "sync"):
        figures = summary["modes"][mode]
        assert figures["steps"] == 2 and 0 <= figures["final_pass_at_1"] <= 1
        assert figures["rollout_s"] > 0 and figures["train_s"] > 0
    assert json.loads((out / "summary.json").read_text()) == summary
    assert any("step   2/2" in line for line in said)
    curve = out / "curve.png"
    await asyncio.to_thread(
        plot, engine_env, out / "metrics.jsonl", out / "summary.json", curve, out / "plot.log"
    )
    assert curve.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


async def test_a_dead_engine_ends_the_run_with_an_error_and_nothing_left(
    engine_env: EngineEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine is SIGKILLed as the first step's batch is asked for: the run fails
    within its bounds (the manager's stall bound here), naming what stopped, and every
    process it started (learner, engine, server) is gone."""
    killed: list[int] = []
    real_step = Run._step

    async def step_after_killing(self: Run, *args: Any) -> dict[str, Any]:
        if not killed:
            killed.append(self.engine.pid)
            os.killpg(self.engine.pid, signal.SIGKILL)
        return await real_step(self, *args)

    monkeypatch.setattr(Run, "_step", step_after_killing)
    before = descendants(os.getpid())
    settings = small(tmp_path / "out", steps=3, step_timeout_s=60.0, modes=("sync",))
    with pytest.raises(Exception) as failure:  # noqa: B017 - any error, but one that says why
        await asyncio.wait_for(train_demo(settings, lambda _: None), 600)
    assert killed
    text = f"{type(failure.value).__name__}: {failure.value}"
    assert "stall" in text.lower() or "engine" in text.lower() or "llm" in text.lower(), text
    left = descendants(os.getpid()) - before
    assert left == set(), [cmdline(pid) for pid in left]


def _engine_cores(out: Path) -> set[frozenset[int]]:
    """The core sets of every thread of the vLLM engine processes serving this run's
    checkpoints (other tests' engines may be running in the same session)."""
    found: set[frozenset[int]] = set()
    servers = [pid for pid in descendants() if str(out) in cmdline(pid)]
    for pid in {p for server in servers for p in descendants(server)}:
        try:
            if not Path(f"/proc/{pid}/comm").read_text().startswith("VLLM::"):
                continue
            for tid in os.listdir(f"/proc/{pid}/task"):
                found.add(frozenset(os.sched_getaffinity(int(tid))))
        except OSError:
            continue
    assert found, "no VLLM:: engine process serving this run"
    return found
