"""Sandbox start-to-ready and close times per runtime, and 64 concurrent starts.

Start-to-ready is ``runtime.start()`` until the tool server inside answers (a
successful connect). The apptainer row uses the TEST DOUBLE from tests/doubles
(bwrap underneath), so it measures the runtime's plumbing, not real Apptainer.

    python bench/sandboxes.py            # prints a table
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import uvloop

from prorl_async.sandbox import RuntimeConfig, SandboxSpec, bwrap_problem, get_runtime
from prorl_async.util.procs import descendants

ROUNDS = 20
CONCURRENT = 64
DOUBLES = Path(__file__).resolve().parent.parent / "tests" / "doubles"


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


async def _start_close(name: str, config: RuntimeConfig, spec: SandboxSpec) -> tuple[str, str]:
    runtime = get_runtime(name, config)
    starts, closes = [], []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        sb = await runtime.start(spec)
        t1 = time.perf_counter()
        await sb.aclose()
        starts.append((t1 - t0) * 1000)
        closes.append((time.perf_counter() - t1) * 1000)
    figures = (
        f"start p50 {_pct(starts, 0.5):.0f} ms, p99 {_pct(starts, 0.99):.0f} ms; "
        f"close p50 {statistics.median(closes):.0f} ms"
    )
    return f"{name} sandbox ({ROUNDS} sequential)", figures


async def _concurrent(config: RuntimeConfig) -> list[tuple[str, str]]:
    runtime = get_runtime("bwrap", config)
    base_rss = _rss_kib(os.getpid())
    t0 = time.perf_counter()
    sbs = await asyncio.gather(*(runtime.start() for _ in range(CONCURRENT)))
    started = time.perf_counter() - t0
    try:
        await asyncio.gather(*(sb.exec("true") for sb in sbs))
        pids = {p for sb in sbs for p in descendants(sb.pid) | {sb.pid}}
        sandbox_rss = sum(_rss_kib(p) for p in pids) / 1024
        server_rss = (_rss_kib(os.getpid()) - base_rss) / 1024
    finally:
        t1 = time.perf_counter()
        await asyncio.gather(*(sb.aclose() for sb in sbs))
        closed = time.perf_counter() - t1
    return [
        (
            f"{CONCURRENT} concurrent bwrap starts",
            f"{started:.2f} s wall (all ready), close {closed:.2f} s",
        ),
        (
            f"{CONCURRENT} live bwrap sandboxes, RSS",
            f"{sandbox_rss:.0f} MiB in sandboxes "
            f"({sandbox_rss / CONCURRENT:.1f} MiB each), server +{server_rss:.1f} MiB",
        ),
    ]


async def run_section() -> list[tuple[str, str]]:
    """Rows (what, figures) for the benchmark table."""
    with tempfile.TemporaryDirectory(prefix="psb-bench-") as tmp:
        config = RuntimeConfig(
            state_dir=f"{tmp}/state",
            run_dir=f"{tmp}/run",
            loopback_dir=f"{tmp}/lo",
            image_python=sys.executable,
        )
        rows = [await _start_close("local", config, SandboxSpec())]
        if bwrap_problem() is not None:
            return rows + [("bwrap", f"unavailable: {bwrap_problem()}")]
        rows.append(await _start_close("bwrap", config, SandboxSpec()))
        image = Path(tmp) / "double.sif"
        image.write_bytes(b"SIF-DOUBLE\n")
        os.environ["PATH"] = f"{DOUBLES}:{os.environ['PATH']}"
        rows.append(await _start_close("apptainer", config, SandboxSpec(image=str(image))))
        rows += await _concurrent(config)
        return rows


def main() -> None:
    rows = uvloop.run(run_section())
    width = max(len(what) for what, _ in rows)
    for what, figures in rows:
        print(f"{what:<{width}}  {figures}")


if __name__ == "__main__":
    main()
