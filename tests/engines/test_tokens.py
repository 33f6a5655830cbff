"""Token claims against a real vLLM: the ids and logprobs are the engine's, the prompts are
exactly what the engine's own chat template makes, and scripted tool use scores as scripted."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from prorl_async.core.agent import TOOL_SPECS
from prorl_async.llm.agent_loop import FINISH_TOOL_SPEC
from prorl_async.scripted_llm.policies import tool_call
from prorl_async.vllm_cpu import VllmProcess
from tests.engines.conftest import ENGINE_TIMEOUT, EngineServer, Scripts, engine_post
from tests.helpers import Server

pytestmark = ENGINE_TIMEOUT

MATH_SYSTEM = "Solve it. Use the python tool, then call finish with the answer."


def math_job(problem: str, answer: str, seed: int, **sampling: Any) -> dict[str, Any]:
    return {
        "task": "math",
        "instance": {"problem": problem, "answer": answer, "system": MATH_SYSTEM},
        "sampling_params": {"seed": seed, **sampling},
    }


async def results(
    srv: Server, jobs: list[dict[str, Any]], wait: float = 240
) -> list[dict[str, Any]]:
    ids = await srv.client.submit_batch(jobs)
    docs = [await srv.client.result(i, wait=wait) for i in ids]
    done = [d for d in docs if d is not None]
    assert len(done) == len(docs), "a job did not finish"
    return done


async def test_single_turn_ids_and_logprobs_are_the_engines(
    vllm: VllmProcess, engine_server: EngineServer
) -> None:
    seeds = [100 + i for i in range(6)]
    jobs = []
    for i, seed in enumerate(seeds):
        job = math_job(f"What is {i} + {i}?", str(2 * i), seed=seed, max_tokens=48)
        job["instance"]["max_turns"] = 1
        jobs.append(job)
    async with engine_server(vllm) as srv:
        docs = await results(srv, jobs)
    for seed, doc in zip(seeds, docs, strict=True):
        assert doc["status"] == "done", doc["error"]
        n = len(doc["response_ids"])
        assert 0 < n <= 48
        assert len(doc["response_mask"]) == len(doc["response_logprobs"]) == n
        assert doc["response_mask"] == [1] * n
        # A direct replay of the same request (prompt ids, seed) gives the same tokens.
        body = {
            "model": "tiny-qwen3",
            "prompt": doc["prompt_ids"],
            "max_tokens": 48,
            "seed": seed,
            "logprobs": 0,
            "return_token_ids": True,
        }
        direct = (await engine_post(vllm, "/v1/completions", body))["choices"][0]
        assert direct["token_ids"] == doc["response_ids"]
        assert direct["logprobs"]["token_logprobs"] == pytest.approx(
            doc["response_logprobs"], abs=1e-4
        )


async def test_prompt_ids_are_what_the_engine_tokenizes(
    vllm: VllmProcess, engine_server: EngineServer, scripts: Scripts
) -> None:
    seed = scripts.add(
        [
            "Let me compute.\n" + tool_call("python", {"code": "print(6 * 7)"}),
            tool_call("python", {"code": "x = 2\nprint(x ** 10)"}),
            "The answer is 42.\n" + tool_call("finish", {"answer": "42"}),
        ]
    )
    async with engine_server(vllm) as srv:
        [doc] = await results(srv, [math_job("What is 6 times 7?", "42", seed)])
    assert doc["status"] == "done" and doc["reward"] == 1.0, doc["eval"]
    tools = [TOOL_SPECS["python"], FINISH_TOOL_SPEC]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": MATH_SYSTEM},
        {"role": "user", "content": "What is 6 times 7?"},
    ]
    rendered = await _tokenize(vllm, messages, tools)
    assert doc["prompt_ids"] == rendered
    # Every later turn's prompt is the whole conversation so far, re-rendered by the engine.
    buffer = list(doc["prompt_ids"])
    turns = doc["turns"]
    for k, turn in enumerate(turns):
        if turn["role"] == "assistant":
            assert buffer == await _tokenize(vllm, messages, tools), f"turn {k}"
            messages.append(
                {"role": "assistant", "content": turn["text"].removesuffix("<|im_end|>")}
            )
        else:
            messages.append({"role": "tool", "content": _observation(turn["text"])})
        buffer += turn["token_ids"]
    assert buffer == doc["prompt_ids"] + doc["response_ids"]


async def _tokenize(
    vllm: VllmProcess, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> list[int]:
    body = {
        "model": "tiny-qwen3",
        "messages": messages,
        "tools": tools,
        "add_generation_prompt": True,
    }
    return list((await engine_post(vllm, "/tokenize", body))["tokens"])


def _observation(segment: str) -> str:
    start = segment.index("<tool_response>\n") + len("<tool_response>\n")
    return segment[start : segment.rindex("\n</tool_response>")]


SWE_REPO = {
    "calc/__init__.py": "",
    "calc/ops.py": "def add(a, b):\n    return a - b\n",
    "tests/test_ops.py": (
        "from calc.ops import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n"
    ),
}
SWE_TESTS = "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest -q -p no:cacheprovider"
ADD_FUNCTION = {
    "prompt": 'def add(a: int, b: int) -> int:\n    """Return the sum of a and b."""\n',
    "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n",
    "entry_point": "add",
}


def _swe(fix: str) -> list[str]:
    edit = {"command": "str_replace", "path": "calc/ops.py", "old_str": "return a - b"}
    return [
        tool_call("str_replace_editor", {**edit, "new_str": fix}),
        tool_call("bash", {"command": SWE_TESTS}),
        tool_call("finish", {"answer": "fixed"}),
    ]


def _code(body: str) -> list[str]:
    solution = f"def add(a: int, b: int) -> int:\n    return {body}\n"
    create = {"command": "create", "path": "solution.py", "file_text": solution}
    return [tool_call("str_replace_editor", create), tool_call("finish", {})]


@pytest.mark.parametrize(
    ("task", "good", "bad"),
    [
        ("math", ["print(17 + 25)", "42"], ["print(17 + 25)", "41"]),
        ("code", "a + b", "a * b"),
        ("swe", "return a + b", "return a * b"),
    ],
)
async def test_scripted_multi_turn_jobs_score_as_scripted(
    vllm: VllmProcess,
    engine_server: EngineServer,
    scripts: Scripts,
    task: str,
    good: Any,
    bad: Any,
) -> None:
    jobs = [_job(task, scripts, plan) for plan in (good, bad)]
    async with engine_server(vllm, runtime="bwrap") as srv:
        docs = await results(srv, jobs)
    assert [d["status"] for d in docs] == ["done", "done"], [d["error"] for d in docs]
    assert [d["reward"] for d in docs] == [1.0, 0.0], [d["eval"] for d in docs]
    for doc in docs:
        assert doc["num_turns"] >= 2
        _check_masks(doc)


def _job(task: str, scripts: Scripts, plan: Any) -> dict[str, Any]:
    if task == "math":
        code, answer = plan
        seed = scripts.add(
            [tool_call("python", {"code": code}), tool_call("finish", {"answer": answer})]
        )
        return math_job("What is 17 + 25?", "42", seed)
    if task == "code":
        return {
            "task": "code",
            "instance": ADD_FUNCTION,
            "sampling_params": {"seed": scripts.add(_code(plan))},
        }
    instance = {
        "repo": {"files": SWE_REPO},
        "problem_statement": "add(1, 2) should be 3.",
        "test_command": SWE_TESTS,
        "fail_to_pass": ["tests/test_ops.py::test_add"],
    }
    return {
        "task": "swe",
        "instance": instance,
        "sampling_params": {"seed": scripts.add(_swe(plan))},
    }


def _check_masks(doc: dict[str, Any]) -> None:
    ids, mask, lps = doc["response_ids"], doc["response_mask"], doc["response_logprobs"]
    assert len(ids) == len(mask) == len(lps)
    at = 0
    for turn in doc["turns"]:
        n = len(turn["token_ids"])
        assert ids[at : at + n] == turn["token_ids"]
        if turn["role"] == "assistant":
            assert mask[at : at + n] == [1] * n
            assert lps[at : at + n] == turn["logprobs"]
            assert all(lp < 0 for lp in turn["logprobs"])  # the model's own, not forced 0s
        else:
            assert mask[at : at + n] == [0] * n and lps[at : at + n] == [0.0] * n
        at += n
    assert at == len(ids)


async def test_concurrent_jobs_keep_their_own_scripts(
    vllm: VllmProcess, engine_server: EngineServer, scripts: Scripts
) -> None:
    plans = [(f"print({i} * 3)", str(3 * i)) for i in range(8)]
    jobs = []
    for i, (code, answer) in enumerate(plans):
        seed = scripts.add(
            [tool_call("python", {"code": code}), tool_call("finish", {"answer": answer})]
        )
        jobs.append(math_job(f"What is {i} times 3?", str(3 * i), seed))
    async with engine_server(vllm) as srv:
        docs = await asyncio.wait_for(results(srv, jobs), 300)
    assert [d["reward"] for d in docs] == [1.0] * 8, [d["eval"] for d in docs]
