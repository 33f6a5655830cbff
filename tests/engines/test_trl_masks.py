"""TRL's rollouts and ours agree on what a completion is: a real multi-turn trajectory
(a real vLLM following a script: a python call, its observation, then ``finish``) goes
through ``ServiceRollouts`` into TRL's ``GRPOTrainer``, and TRL's loss mask is exactly
the trajectory's ``response_mask``: the tool observation's tokens are out of the loss,
every model token is in."""

from __future__ import annotations

import asyncio
import json

import pytest

from prorl_async.integrations.trl import dataset_row
from prorl_async.scripted_llm.policies import tool_call
from prorl_async.vllm_cpu import EngineEnv, VllmProcess
from tests.engines.conftest import EngineServer, Scripts
from tests.engines.test_tokens import MATH_SYSTEM
from tests.handlers.policies import require_bwrap

pytestmark = pytest.mark.timeout(900)


async def test_trls_loss_mask_is_the_response_mask(
    engine_env: EngineEnv,
    vllm: VllmProcess,
    engine_server: EngineServer,
    scripts: Scripts,
    model_dir: object,
) -> None:
    require_bwrap()
    await asyncio.to_thread(engine_env.add_trl)
    plan = [
        "Let me compute.\n" + tool_call("python", {"code": "print(17 + 25)"}),
        "It printed 42.\n" + tool_call("finish", {"answer": "42"}),
    ]
    seed = scripts.add(plan)
    instance = {"problem": "What is 17 + 25?", "answer": "42", "system": MATH_SYSTEM}
    prompt = dataset_row("math", instance, {"seed": seed})["prompt"]
    async with engine_server(vllm, runtime="bwrap") as srv:
        argv = [str(engine_env.python), "-m", "tests.engines.trl_probe", srv.url]
        argv += [str(model_dir), json.dumps([prompt, prompt])]
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=engine_env.process_env(),
        )
        try:
            stdout, stderr = await asyncio.wait_for(proc.communicate(), 600)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert proc.returncode == 0, stderr.decode()[-3000:]
        [line] = [x for x in stdout.decode().splitlines() if x.startswith("PROBE ")]
        found = json.loads(line.removeprefix("PROBE "))
        docs = [await srv.client.result(job_id) for job_id in found["job_ids"]]
    for i, doc in enumerate(docs):
        assert doc is not None and doc["status"] == "done" and doc["reward"] == 1.0, doc
        mask = doc["response_mask"]
        assert 0 in mask and mask.count(1) > 0  # a tool observation between model turns
        assert found["completion_ids"][i] == doc["response_ids"]
        assert found["tool_mask"][i] == mask
        assert found["loss_mask"][i] == mask
    assert found["padding_masked"]
    # TRL counts only the tokens its loss sees as the completion's length.
    model_tokens = [d["response_mask"].count(1) for d in docs if d is not None]
    assert found["mean_length"] == pytest.approx(sum(model_tokens) / len(model_tokens))
