"""The polling helpers fail bounded, naming what they awaited."""

from __future__ import annotations

import pytest

from tests.helpers import eventually, eventually_sync, free_ports


async def test_eventually_returns_once_the_check_holds() -> None:
    calls = []

    async def third_time() -> bool:
        calls.append(1)
        return len(calls) == 3

    assert await eventually(third_time, timeout=5) >= 0
    assert len(calls) == 3


async def test_eventually_names_what_it_awaited() -> None:
    with pytest.raises(AssertionError, match=r"not within 0.05 s: the flag"):
        await eventually(lambda: False, timeout=0.05, what="the flag")

    async def state() -> str:
        return "state then"

    with pytest.raises(AssertionError, match="state then"):
        await eventually(lambda: False, timeout=0.05, what=state)
    with pytest.raises(AssertionError, match=r"`.*lambda: 1 > 2.*` to hold"):
        await eventually(lambda: 1 > 2, timeout=0.05)


def test_eventually_sync_is_bounded_too() -> None:
    with pytest.raises(AssertionError, match=r"not within 0.05 s: never"):
        eventually_sync(lambda: False, 0.05, lambda: "never", interval=0.01)
    assert eventually_sync(lambda: True, 1) < 1


def test_free_ports_are_distinct() -> None:
    ports = free_ports(3)
    assert len(set(ports)) == 3
