"""``LazySandbox``: a sandbox started on first use.

The order-sensitive rules (one start for concurrent first uses, cancel and failure at
every point, the budget wait with the job's timer paused) run on the TEST DOUBLE runtime
of ``tests/chaos/fake_runtime.py``, whose starts the test resolves by hand; then a real
bwrap sandbox is used through every entry point before and after its start.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from prorl_async.core.agent import SandboxTools
from prorl_async.sandbox import (
    BwrapRuntime,
    LazySandbox,
    Sandbox,
    SandboxHandle,
    SandboxSpec,
    SandboxStartError,
    SpecError,
)
from prorl_async.stages import StageScope
from prorl_async.toolserver.client import ToolServerError
from prorl_async.util.timer import PausableTimer
from tests.chaos.fake_runtime import FakeRuntime, FakeSandbox, fake_config
from tests.helpers import eventually


@pytest.fixture
async def rt(tmp_path: Path) -> AsyncIterator[FakeRuntime]:
    runtime = FakeRuntime(fake_config(tmp_path))
    yield runtime
    await runtime.aclose()


def _nothing_held(rt: FakeRuntime) -> bool:
    return rt.live == 0 and rt.budget.live == 0 and not rt.pending


async def test_a_bad_spec_fails_when_the_handle_is_made(rt: FakeRuntime) -> None:
    # Network is off on this runtime: an eager start refuses it before waiting; so does this.
    with pytest.raises(SpecError, match="network"):
        LazySandbox(rt, SandboxSpec(network=True))
    with pytest.raises(SpecError):
        LazySandbox(rt, SandboxSpec(files={"../escape": "x"}))
    assert rt.starts == [] and _nothing_held(rt)


async def test_a_handle_never_used_starts_nothing_and_closes_for_free(rt: FakeRuntime) -> None:
    rt.budget.resize(1)
    async with LazySandbox(rt, SandboxSpec()) as lazy:
        assert not lazy.started and not lazy.closed
        assert rt.budget.live == 0  # no slot held, so another start is not held back
        other = await asyncio.wait_for(_started_by_hand(rt), 5)
        await other.aclose()
    assert lazy.closed and len(rt.starts) == 1 and _nothing_held(rt)
    with pytest.raises(ToolServerError, match="closed"):
        await lazy.ready()  # a closed handle never starts one
    assert len(rt.starts) == 1


async def _started_by_hand(rt: FakeRuntime) -> FakeSandbox:
    task = asyncio.ensure_future(rt.start(SandboxSpec()))
    await eventually(lambda: bool(rt.pending))
    rt.pending[0].ok()
    sb = await task
    assert isinstance(sb, FakeSandbox)
    return sb


async def test_concurrent_first_uses_start_one_sandbox(rt: FakeRuntime) -> None:
    scope = StageScope("run", PausableTimer(60))
    lazy = LazySandbox(rt, SandboxSpec(), lambda: scope)
    users = [asyncio.ensure_future(lazy.ready()) for _ in range(5)]
    await eventually(lambda: len(rt.pending) == 1)
    await asyncio.sleep(0.01)
    assert len(rt.starts) == 1 and rt.starts[0].stage == "run"  # the scope at first use
    rt.pending[0].ok()
    got = await asyncio.gather(*users)
    assert all(sb is got[0] for sb in got) and lazy.started
    assert await lazy.ready() is got[0] and len(rt.starts) == 1
    assert rt.live == 1 and scope.slots == 1
    await lazy.aclose()
    assert _nothing_held(rt) and lazy.closed


async def test_the_first_use_waits_for_a_slot_with_the_timer_paused(rt: FakeRuntime) -> None:
    rt.budget.resize(1)
    holder = await _started_by_hand(rt)  # the budget is full
    timer = PausableTimer(60)
    timer.resume()  # the job is working in its stage
    lazy = LazySandbox(rt, SandboxSpec(), lambda: StageScope("run", timer))
    use = asyncio.ensure_future(lazy.ready())
    await eventually(lambda: rt.budget.waiting == 1)
    assert not timer.running  # waiting for the server's capacity is not the job's time
    await holder.aclose()
    await eventually(lambda: bool(rt.pending))
    assert timer.running  # the slot is taken: starting the sandbox is the job's time
    rt.pending[0].ok()
    await use
    await lazy.aclose()
    assert _nothing_held(rt)


@pytest.mark.parametrize("where", ["waiting for a slot", "starting"])
async def test_a_first_use_cancelled_leaves_nothing_and_the_next_use_starts(
    rt: FakeRuntime, where: str
) -> None:
    rt.budget.resize(1)
    holder = await _started_by_hand(rt) if where == "waiting for a slot" else None
    lazy = LazySandbox(rt, SandboxSpec(), lambda: StageScope("run"))
    use = asyncio.ensure_future(lazy.call("bash", {"command": "true"}))
    if holder is not None:
        await eventually(lambda: rt.budget.waiting == 1)
    else:
        await eventually(lambda: bool(rt.pending))
    use.cancel()
    with pytest.raises(asyncio.CancelledError):
        await use
    assert not lazy.started and rt.budget.waiting == 0
    assert rt.budget.live == (1 if holder is not None else 0)
    if holder is not None:
        await holder.aclose()
    again = asyncio.ensure_future(lazy.ready())  # a cancelled start is not a failed one
    await eventually(lambda: bool(rt.pending))
    rt.pending[0].ok()
    await again
    await lazy.aclose()
    assert _nothing_held(rt)


async def test_a_failed_start_fails_every_use_and_is_not_retried(rt: FakeRuntime) -> None:
    lazy = LazySandbox(rt, SandboxSpec())
    first, second = (asyncio.ensure_future(lazy.exec("true")) for _ in range(2))
    await eventually(lambda: bool(rt.pending))
    rt.pending[0].fail("bwrap: no user namespaces")
    for use in (first, second):
        with pytest.raises(SandboxStartError, match="no user namespaces"):
            await use
    with pytest.raises(SandboxStartError):
        await lazy.read_file("x")
    assert len(rt.starts) == 1 and not lazy.started and _nothing_held(rt)
    await lazy.aclose()


async def test_a_start_failure_fails_the_tool_call_not_the_model(rt: FakeRuntime) -> None:
    # Not a ToolCallError (shown to the model, which goes on): the stage fails with it.
    tools = SandboxTools(LazySandbox(rt, SandboxSpec()), ["bash"])
    call = asyncio.ensure_future(tools.call("bash", {"command": "ls"}))
    await eventually(lambda: bool(rt.pending))
    rt.pending[0].fail()
    with pytest.raises(SandboxStartError):
        await call
    await tools.sandbox.aclose()


async def test_close_during_a_start_in_another_task_waits_and_leaves_nothing(
    rt: FakeRuntime,
) -> None:
    lazy = LazySandbox(rt, SandboxSpec())
    use = asyncio.ensure_future(lazy.ready())
    await eventually(lambda: bool(rt.pending))
    closing = asyncio.ensure_future(lazy.aclose())
    await asyncio.sleep(0.01)
    assert not closing.done()  # it waits for the start under way
    rt.pending[0].ok()
    with pytest.raises(ToolServerError, match="closed while it started"):
        await use
    await closing
    assert _nothing_held(rt) and lazy.closed


async def test_sync_properties_before_the_start(rt: FakeRuntime) -> None:
    lazy = LazySandbox(rt, SandboxSpec())
    assert lazy.inner_workspace == "/workspace"  # the same in every isolated sandbox
    assert lazy.limits == SandboxSpec().limits and not lazy.closed
    for name in ("id", "pid", "workspace", "loopback_ip"):
        with pytest.raises(RuntimeError, match="not started yet"):
            getattr(lazy, name)
    await lazy.aclose()


def test_the_lazy_handle_offers_everything_a_handler_may_use_of_a_sandbox() -> None:
    members = {n for n in dir(SandboxHandle) if not n.startswith("_")}
    members |= {"__aenter__", "__aexit__"}
    for name in members:
        assert hasattr(LazySandbox, name), name
        assert hasattr(Sandbox, name) or name in ("id", "limits"), name  # instance attributes
        if inspect.iscoroutinefunction(getattr(Sandbox, name, None)):
            assert inspect.iscoroutinefunction(getattr(LazySandbox, name)), name
    # And every public awaitable of a Sandbox a handler may call (not the runtime's wiring).
    wiring = {"wait_process"}
    for name, _ in inspect.getmembers(Sandbox, inspect.iscoroutinefunction):
        if not name.startswith("_") and name not in wiring:
            assert name in members, f"Sandbox.{name} is missing from SandboxHandle"


# -- a real sandbox ----------------------------------------------------------------------


async def test_a_real_sandbox_through_every_entry_point(bwrap: BwrapRuntime) -> None:
    lazy = LazySandbox(bwrap, SandboxSpec())
    assert bwrap.live == 0
    client = lazy.client  # taken before the start: its calls start the sandbox
    await client.upload("data.bin", b"\x00\x01hello")
    assert bwrap.live == 1 and lazy.started
    sb = await lazy.ready()
    assert await client.download("data.bin") == b"\x00\x01hello"
    assert (await lazy.exec("cat data.bin | tail -c 5")).stdout == "hello"
    await lazy.write_files({"a.txt": "A"})
    assert await lazy.read_file("a.txt") == "A"
    result = await lazy.call("python", {"code": "print(6 * 7)"})
    assert result.ok and "42" in result.output
    assert lazy.pid == sb.pid and lazy.id == sb.id and lazy.workspace == sb.workspace
    assert lazy.inner_workspace == sb.inner_workspace == "/workspace"
    assert lazy.client is sb.client
    await lazy.aclose()
    assert bwrap.live == 0 and lazy.closed and sb.closed
