"""Run vLLM's OpenAI server with its idle spin bounded (run by the engine venv's python).

vLLM's processes pass each engine step over a shared-memory queue whose reader, after
every message, keeps polling with ``sched_yield`` for ``busy_loop_s`` (1 s in vLLM 0.32)
before it sleeps on a socket. On a GPU host that core is spare. On a small CPU host it is
not: the CPU worker spins a second after every step, so while the engine is idle or
lightly loaded it takes a core from everything beside it (the rollout server, the
engine's own API server, a learner). Measured on 2 cores: an idle worker used 1.04 CPU-s
in 3 s with vLLM's spin and 0.07 with 0.02 s (docs/performance.md, train-demo).

``PRORL_VLLM_IDLE_SPIN_S`` sets the spin in seconds (default 0.02; ``vllm`` leaves vLLM's
own). Usage: ``python -m prorl_async.vllm_cpu.launch [api_server args]``.

vLLM's server starts its engine processes with ``spawn``; a spawned child runs the
parent's main module again as ``__mp_main__`` before its target, which is why this
module stays ``__main__`` while the server runs (``alter_sys=False``) and bounds the spin
when run under either name.
"""

from __future__ import annotations

import inspect
import logging
import os
import runpy
import sys

from prorl_async.vllm_cpu.env import DEFAULT_IDLE_SPIN_S, IDLE_SPIN_VAR

__all__ = ["DEFAULT_IDLE_SPIN_S", "apply_from_env", "bound_idle_spin", "idle_spin_s", "main"]

SERVER_MODULE = "vllm.entrypoints.openai.api_server"

log = logging.getLogger("prorl_async.vllm_cpu.launch")


def idle_spin_s(value: str | None) -> float | None:
    """The spin ``value`` asks for: seconds, or None for vLLM's own (``"vllm"``)."""
    if value is None or value.strip() == "":
        return DEFAULT_IDLE_SPIN_S
    if value.strip() == "vllm":
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0.0:  # also refuses nan
        raise ValueError(
            f"{IDLE_SPIN_VAR}={value!r}: expected seconds >= 0 or 'vllm' (vLLM's own spin)"
        )
    return seconds


def bound_idle_spin(seconds: float) -> bool:
    """Make ``seconds`` the default spin of every shared-memory queue reader made from now
    on; False (and a warning) if this vLLM has no such setting."""
    try:
        from vllm.distributed.device_communicators import shm_broadcast
    except ImportError as exc:
        log.warning("idle spin left as vLLM's: %r", exc)
        return False
    cls = getattr(shm_broadcast, "SpinCondition", None)
    init = getattr(cls, "__init__", None)
    defaults = getattr(init, "__defaults__", None)
    try:
        params = list(inspect.signature(init).parameters) if init is not None else []
    except (TypeError, ValueError):
        params = []
    if defaults is None or "busy_loop_s" not in params or params[-1] != "busy_loop_s":
        log.warning("idle spin left as vLLM's: no SpinCondition(busy_loop_s=) in this vLLM")
        return False
    assert init is not None
    init.__defaults__ = (*defaults[:-1], float(seconds))
    return True


def apply_from_env() -> None:
    """Bound the spin as ``PRORL_VLLM_IDLE_SPIN_S`` says (this process and its children)."""
    seconds = idle_spin_s(os.environ.get(IDLE_SPIN_VAR))
    if seconds is not None:
        bound_idle_spin(seconds)


def main() -> None:
    apply_from_env()
    sys.argv[0] = SERVER_MODULE
    runpy.run_module(SERVER_MODULE, run_name="__main__", alter_sys=False)


if __name__ == "__main__":
    main()
elif __name__ == "__mp_main__":  # an engine process vLLM spawned from the server
    apply_from_env()
