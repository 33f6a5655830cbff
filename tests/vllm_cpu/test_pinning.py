"""The engine stays on the cores it is bound to: every thread of vLLM's engine processes,
not only the worker's OpenMP threads that vLLM binds itself."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from prorl_async.vllm_cpu.process import bound_cores, pin_engine

# A process that names itself (as vLLM's do) and holds a second thread until its stdin closes.
NAMED = """
import sys, threading
with open("/proc/self/comm", "w") as f:
    f.write(sys.argv[1])
threading.Thread(target=sys.stdin.read, daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize(
    ("spec", "cores"),
    [
        ("0", {0}),
        ("0-3", {0, 1, 2, 3}),
        ("0,2-3", {0, 2, 3}),
        ("auto", None),
        ("nobind", None),
        ("0-1|2-3", None),  # one binding per rank: vLLM's own business
        (None, None),
    ],
)
def test_bound_cores_reads_a_single_rank_binding(spec: str | None, cores: set[int] | None) -> None:
    assert bound_cores(spec) == cores


def test_a_binding_that_is_not_cores_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="VLLM_CPU_OMP_THREADS_BIND='core0'"):
        bound_cores("core0")


# A parent of three such processes, as vLLM's API server is of its engine processes: it
# prints their pids and ends them when its stdin closes.
TREE = """
import subprocess, sys
kids = [subprocess.Popen([sys.executable, "-c", sys.argv[1], name], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
        for name in ("VLLM::EngineCor", "VLLM::Worker", "bystander")]
for kid in kids:
    assert kid.stdout.readline() == "ready\\n"
print(" ".join(str(kid.pid) for kid in kids), flush=True)
sys.stdin.read()
for kid in kids:
    kid.stdin.close()
    kid.wait()
"""


@contextmanager
def engine_like_tree() -> Iterator[tuple[int, list[int]]]:
    """The parent's pid and its children's: engine core, worker, bystander."""
    proc = subprocess.Popen(
        [sys.executable, "-c", TREE, NAMED],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        kids = [int(pid) for pid in proc.stdout.readline().split()]
        assert len(kids) == 3, kids
        yield proc.pid, kids
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def affinities(pid: int) -> list[set[int]]:
    return [os.sched_getaffinity(int(tid)) for tid in os.listdir(f"/proc/{pid}/task")]


def test_every_thread_of_the_engine_processes_is_pinned_and_nothing_else() -> None:
    allowed = os.sched_getaffinity(0)
    if len(allowed) < 2:
        pytest.skip("needs two usable cores to tell a pinned thread from a free one")
    core = min(allowed)
    with engine_like_tree() as (root, (engine_core, worker, other)):
        pinned = pin_engine(root, {core})
        assert affinities(engine_core) == [{core}, {core}]
        assert affinities(worker) == [{core}, {core}]
        assert affinities(other) == [allowed, allowed]
        assert affinities(root) == [allowed]
        assert pinned == 4
