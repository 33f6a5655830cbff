"""The engine's idle spin is bounded (``vllm_cpu.launch``): after it answers, vLLM's worker
sleeps instead of polling its shared-memory queue for a second, so an idle engine leaves
the cores to what runs beside it."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from prorl_async.util.procs import descendants
from prorl_async.vllm_cpu import EngineEnv, VllmProcess
from prorl_async.vllm_cpu.env import IDLE_SPIN_VAR
from tests.engines.conftest import ENGINE_TIMEOUT

pytestmark = ENGINE_TIMEOUT

WORKER_COMM = "VLLM::Worker"
# How long the idle worker is watched: vLLM's own spin would poll for 1 s of it.
WINDOW_S = 2.0


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of every thread of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _generate(engine: VllmProcess) -> None:
    body = {"model": engine.served_name, "prompt": [1, 2, 3], "max_tokens": 4}
    request = urllib.request.Request(
        f"{engine.address}/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as resp:
        assert resp.status == 200


def test_an_idle_engine_worker_does_not_spin(vllm: VllmProcess) -> None:
    assert vllm.proc is not None
    workers = [
        pid
        for pid in descendants(vllm.proc.pid)
        if Path(f"/proc/{pid}/comm").read_text().strip() == WORKER_COMM
    ]
    assert len(workers) == 1, f"expected one {WORKER_COMM} under the engine, found {workers}"
    _generate(vllm)
    before, start = _cpu_s(workers[0]), time.monotonic()
    # A measurement window, not a wait for an event: the worker's CPU over it is the result.
    time.sleep(WINDOW_S)
    used, window = _cpu_s(workers[0]) - before, time.monotonic() - start
    # Spinning, the worker would use most of the first second of the window.
    assert used < 0.25 * window, f"the idle worker used {used:.2f} CPU-s in {window:.1f} s"


PROBE = """
import inspect, sys
from prorl_async.vllm_cpu import launch
from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
before = inspect.signature(SpinCondition.__init__).parameters["busy_loop_s"].default
launch.apply_from_env()
after = inspect.signature(SpinCondition.__init__).parameters["busy_loop_s"].default
print(before, after)
"""


@pytest.mark.parametrize(("value", "expected"), [("0.05", "0.05"), ("vllm", "1"), ("", "0.02")])
def test_the_launcher_sets_the_spin_of_every_queue_reader(
    engine_env: EngineEnv, value: str, expected: str
) -> None:
    out = subprocess.run(
        [str(engine_env.python), "-c", PROBE],
        env=engine_env.process_env(**{IDLE_SPIN_VAR: value}),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.split()
    assert out == ["1", expected]
