"""A stage's deadline: armed one loop step after the timer runs, all deadlines resumed in
one step sharing one loop callback (``prorl_async.util.timer``)."""

from __future__ import annotations

import asyncio

import pytest

from prorl_async.util import timer as timer_mod
from prorl_async.util.timer import PausableTimer

_LOOP_CLOCK_S = 0.002


async def _stage(budget: float, body_waits: asyncio.Event) -> tuple[str, bool, float]:
    """One stage under a deadline, as the pipeline runs it (``with``)."""
    timer = PausableTimer(budget)
    deadline = timer.deadline()
    try:
        with deadline:
            await body_waits.wait()
    except TimeoutError:
        return "timed_out", deadline.expired(), timer.elapsed()
    return "done", deadline.expired(), timer.elapsed()


async def test_many_deadlines_resumed_in_one_step_all_fire() -> None:
    never = asyncio.Event()
    outcomes = await asyncio.wait_for(
        asyncio.gather(*(_stage(0.05, never) for _ in range(200))), timeout=30
    )
    assert {o[0] for o in outcomes} == {"timed_out"}
    assert all(expired for _, expired, _ in outcomes)
    # Cancelled for the budget: only once the active time had reached it (to the loop
    # clock's resolution: uvloop's timers count whole milliseconds).
    assert min(active for _, _, active in outcomes) >= 0.05 - _LOOP_CLOCK_S
    assert asyncio.get_running_loop() not in timer_mod._DUE  # the batch was taken


async def test_a_stage_that_ends_without_waiting_never_arms_a_loop_timer() -> None:
    timer = PausableTimer(0.01)
    deadline = timer.deadline()
    with deadline:
        pass
    assert deadline._handle is None
    await asyncio.sleep(0)  # the shared arming callback runs: the deadline has exited
    assert deadline._handle is None and not deadline.expired()
    assert asyncio.get_running_loop() not in timer_mod._DUE


async def test_paused_time_does_not_count_and_the_task_is_uncancelled() -> None:
    timer = PausableTimer(0.2)
    released = asyncio.Event()
    task = asyncio.current_task()
    assert task is not None
    with timer.deadline():
        with timer.paused():
            # Paused before the arming step: no loop timer; 0.3 s of waiting is not active.
            asyncio.get_running_loop().call_later(0.3, released.set)
            await asyncio.wait_for(released.wait(), timeout=30)
        assert timer.elapsed() < 0.2
    assert task.cancelling() == 0


@pytest.mark.parametrize("entered", ["with", "async with"])
async def test_both_forms_raise_timeout_error_at_the_exit(entered: str) -> None:
    timer = PausableTimer(0.02)
    deadline = timer.deadline()
    with pytest.raises(TimeoutError):
        if entered == "with":
            with deadline:
                await asyncio.Event().wait()
        else:
            async with deadline:
                await asyncio.Event().wait()
    assert deadline.expired()
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
