"""Which job's stage is asking: the explicit scope a stage hands to what it calls.

The pipeline makes one ``StageScope`` for each stage of each job and sets it as
``job.scope`` while the stage runs. Whatever takes a shared resource on the job's
behalf is handed it: ``Runtime.start(spec, scope=job.scope)`` passes it to the sandbox
budget, which ranks the taker by its stage, pauses the job's timer while it waits for
a slot, and counts the slots the job took in the stage (``slots``). A taker without a
scope (a warm sandbox) is ranked below every stage and pauses no timer.
"""

from __future__ import annotations

from prorl_async.util.timer import PausableTimer

__all__ = ["StageScope"]


class StageScope:
    """One job in one stage: the stage's name, the job's timer, and the sandbox-budget
    slots the job took in it (counted by the budget)."""

    __slots__ = ("name", "timer", "slots")

    def __init__(self, name: str | None, timer: PausableTimer | None = None) -> None:
        self.name = name
        self.timer = timer
        self.slots = 0
