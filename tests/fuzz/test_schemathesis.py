"""Schema fuzzing (schemathesis) of every route of a real server with a token set.

Bounded: a fixed seed and example count per operation, ``PRORL_FUZZ_EXAMPLES`` (40 by default:
~950 requests; 200: 2,347; CI sets 300). Fails on any 5xx
other than 503 (stopped or admission full) and on any response that does not match
the OpenAPI document. Only the ``sleep`` and ``blocking`` tasks are registered, so no
job ever calls an LLM backend the fuzzer registers (those addresses are random).
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path

import pytest

from handlers.sleep import SleepHandler
from prorl_async.api.app import run_server
from prorl_async.config import load_config
from prorl_async.core.handler import HandlerRegistry
from tests.blocking import BlockingHandler

CONFIG = Path(__file__).with_name("schemathesis.toml")
TOKEN = "fuzz-token"
MAX_EXAMPLES = int(os.environ.get("PRORL_FUZZ_EXAMPLES", "40"))


@pytest.mark.timeout(300)  # a hang guard; the run takes ~20-60 s
async def test_schemathesis_finds_no_server_error_or_schema_violation(tmp_path: Path) -> None:
    cfg = load_config(
        overrides={
            "port": 0,
            "state_dir": str(tmp_path / "state"),
            "token": TOKEN,
            # Long-polls and stuck jobs must not eat the time budget.
            "max_wait_s": 0.05,
            "default_timeout_s": 2.0,
            "stop_grace_s": 1.0,
            **{f"{stage}_workers": 2 for stage in ("init", "run", "eval")},
        },
        env={},
    )
    registry = HandlerRegistry()
    registry.register(SleepHandler())
    registry.register(BlockingHandler())
    async with run_server(cfg, registry) as (_, url):
        out = await _schemathesis(url, tmp_path)
    found = re.search(r"(\d+) generated", out)
    # The coverage phase's fixed boundary cases (~700), plus the fuzzing phase's.
    assert found and int(found.group(1)) >= 600 + 6 * MAX_EXAMPLES, out[-3000:]


async def _schemathesis(url: str, workdir: Path) -> str:
    cmd = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "--config-file",
        str(CONFIG),
        "run",
        f"{url}/openapi.json",
        "-H",
        f"Authorization: Bearer {TOKEN}",
        "--checks",
        "not_a_server_error,response_schema_conformance",
        "--phases",
        "examples,coverage,fuzzing",
        "--max-examples",
        str(MAX_EXAMPLES),
        "--seed",
        "1",
        "--workers",
        "2",
        "--request-timeout",
        "10",
        "--no-color",
    ]
    proc = await asyncio.create_subprocess_exec(
        *cmd, cwd=workdir, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    try:
        async with asyncio.timeout(280):
            raw, _ = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    out = raw.decode(errors="replace")
    assert proc.returncode == 0, out[-6000:]
    return out
