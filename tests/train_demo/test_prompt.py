"""The train-demo prompt is exactly what the ``math`` handler's agent loop sends."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

import handlers.math
from handlers.math import TOOLS, MathHandler
from prorl_async.core.agent import SandboxTools
from prorl_async.llm.agent_loop import Trajectory, run_agent_loop
from prorl_async.llm.generation import Generation
from prorl_async.llm.tokenizer import ChatTokenizer, load_tokenizer
from prorl_async.train_demo.prompt import prompt_ids, prompt_messages, prompt_text, prompt_tools
from prorl_async.train_demo.task import answer_text, instance

PAIRS = [(0, 0), (12, 34), (99, 99), (7, 58)]


@pytest.mark.parametrize(("a", "b"), PAIRS)
async def test_messages_and_tools_are_what_the_handler_runs_the_agent_with(
    a: int, b: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}

    async def fake_run_agent(job: Any, *, messages: Any, tools: Any, max_turns: Any) -> None:
        seen.update(messages=messages, specs=tools.specs, max_turns=max_turns)

    monkeypatch.setattr(handlers.math, "run_agent", fake_run_agent)
    handler = MathHandler()
    job = SimpleNamespace(
        instance=handler.validate(instance(a, b)),
        state={"sandbox": object()},
        shared=SimpleNamespace(metrics=None),
    )
    await handler.run(cast(Any, job))
    assert seen == {"messages": prompt_messages(a, b), "specs": prompt_tools(), "max_turns": 1}


class _Recorder:
    """A generator that answers once and keeps the prompt it was sent."""

    def __init__(self, reply: list[int]) -> None:
        self.reply = reply
        self.prompts: list[list[int]] = []

    async def generate(
        self, prompt_ids: list[int], max_tokens: int, sampling: dict[str, Any]
    ) -> Generation:
        self.prompts.append(list(prompt_ids))
        return Generation(self.reply, [0.0] * len(self.reply), "stop", "recorder")


async def _loop_prompt(tok: ChatTokenizer, a: int, b: int) -> list[int]:
    recorder = _Recorder(tok.encode(answer_text(a, b)) + [tok.eos_id])
    await run_agent_loop(
        generator=recorder,
        tokenizer=tok,
        messages=prompt_messages(a, b),
        tools=SandboxTools(cast(Any, None), TOOLS),
        trajectory=Trajectory(),
        max_turns=1,
        max_model_len=4096,
        sampling={},
        max_tokens=64,
    )
    assert len(recorder.prompts) == 1
    return recorder.prompts[0]


@pytest.mark.parametrize("vocab", ["task", "bundled"])
async def test_prompt_ids_are_what_the_agent_loop_sends(
    vocab: str, request: pytest.FixtureRequest
) -> None:
    tok = request.getfixturevalue("task_tok") if vocab == "task" else load_tokenizer()
    for a, b in PAIRS:
        ids = prompt_ids(tok, a, b)
        assert await _loop_prompt(tok, a, b) == ids
        assert tok.encode(prompt_text(a, b)) == ids


def test_prompt_text_is_what_the_loaded_tokenizer_renders(task_tok: ChatTokenizer) -> None:
    for a, b in PAIRS:
        text = prompt_text(a, b)
        assert (
            task_tok.render(prompt_messages(a, b), prompt_tools(), add_generation_prompt=True)
            == text
        )
        assert text.endswith(f"What is {a} + {b}?<|im_end|>\n<|im_start|>assistant\n")
