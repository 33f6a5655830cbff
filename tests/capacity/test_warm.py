"""Warm sandboxes: INIT of a math job takes a pre-started sandbox; the pool refills within
the budget, a sandbox is never handed out twice, and a start of another spec evicts one."""

from __future__ import annotations

import statistics

from prorl_async.scripted_llm import ScriptedLLM
from tests.handlers.policies import require_bwrap
from tests.serverutil import ServerFactory, eventually

WARM = 3


async def test_math_init_takes_a_warm_sandbox_and_the_pool_refills(
    make_server: ServerFactory,
) -> None:
    require_bwrap()
    async with (
        ScriptedLLM(policy="finish") as llm,
        make_server(runtime="bwrap", warm_sandboxes=WARM, max_sandboxes=4) as srv,
    ):
        await srv.client.add_llm_server(llm.address)
        runtime = srv.service.services.runtime
        warm = runtime.warm
        await eventually(lambda: warm.ready == WARM, timeout=30)
        assert (await srv.client.status())["sandbox_budget"]["warm_ready"] == WARM
        inits, handed = [], set()
        for i in range(6):
            # One at a time, each once the pool is full again: every INIT finds one ready.
            await eventually(lambda: warm.ready == WARM, timeout=30)
            ready = {id(sb) for sb, _ in warm._idle}
            job_id = await srv.client.submit("math", {"problem": f"{i} + 1?", "answer": "1"})
            res = await srv.client.result(job_id, wait=30)
            assert res is not None and res["status"] == "done", res
            inits.append(res["timing"]["init_s"])
            used = ready - {id(sb) for sb, _ in warm._idle}
            assert len(used) == 1 and not used & handed  # one job per sandbox, never returned
            handed |= used
        assert statistics.median(inits) < 0.010, inits
        assert warm.taken == 6 and warm.started >= 6 + WARM - 1
        assert runtime.budget.peak <= 4
        await eventually(lambda: warm.ready == WARM, timeout=30)  # refilled after the last


async def test_a_start_of_another_spec_evicts_a_warm_sandbox_within_the_budget(
    make_server: ServerFactory,
) -> None:
    require_bwrap()
    async with (
        ScriptedLLM(policy="finish") as llm,
        make_server(runtime="bwrap", warm_sandboxes=2, max_sandboxes=2) as srv,
    ):
        await srv.client.add_llm_server(llm.address)
        runtime = srv.service.services.runtime
        await eventually(lambda: runtime.warm.ready == 2, timeout=30)
        # Files make the spec instance-dependent: it cannot use a warm one, so it waits for
        # a slot and a warm sandbox gives its slot up.
        instance = {"prompt": "x", "files": {"a.txt": "hi"}, "reward_command": "cat a.txt"}
        res = await srv.client.result(await srv.client.submit("sandbox", instance), wait=30)
        assert res is not None and res["status"] == "done" and res["reward"] == 1.0, res
        assert runtime.warm.taken == 0 and runtime.budget.peak <= 2
        await eventually(lambda: runtime.warm.ready == 2, timeout=30)
        status = await srv.client.status()
        assert status["sandbox_budget"]["live"] == 2 and "warm" in status["idle_sandbox_seconds"]
