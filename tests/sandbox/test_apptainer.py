"""The apptainer runtime against the apptainer TEST DOUBLE (tests/doubles/apptainer).

Apptainer cannot be installed on these machines, so the double records its argv
and runs the command under real bwrap; the tests assert the flags the runtime
passes and that a sandbox started through it works and tears down cleanly.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from prorl_async.sandbox import (
    ApptainerRuntime,
    RuntimeConfig,
    RuntimeUnavailableError,
    SandboxSpec,
    SpecError,
)
from prorl_async.sandbox.apptainer import find_apptainer
from prorl_async.util.procs import descendants
from tests.conftest import require
from tests.sandbox.conftest import snapshot, still_running

_FIXED = ["--containall", "--cleanenv", "--no-home", "--writable-tmpfs", "--pid"]


@pytest.fixture
def image(tmp_path: Path) -> str:
    path = tmp_path / "tools.sif"
    path.write_bytes(b"SIF-DOUBLE\n")
    return str(path)


def _double_problem(image: str) -> str | None:
    """Run the double as the runtime will (bare environment, the double's own bwrap):
    None if it can start a sandbox, else why not."""
    binary = find_apptainer()
    assert binary is not None and binary.endswith("apptainer"), binary
    argv = [binary, "exec", "--net", "--network", "none", image, "/bin/true"]
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
    return None if done.returncode == 0 else f"exit {done.returncode}: {done.stderr.strip()}"


@pytest.fixture
async def runtime(
    config: RuntimeConfig, apptainer_double: Path, image: str
) -> AsyncIterator[ApptainerRuntime]:
    problem = _double_problem(image)
    require(problem is None, f"the apptainer double runs under bwrap, which fails: {problem}")
    # The double's "image" is the host root, so the tool server runs on the host's Python.
    fields = {f: getattr(config, f) for f in config.__struct_fields__}
    runtime = ApptainerRuntime(
        RuntimeConfig(**{**fields, "image_python": sys.executable, "allow_network": True})
    )
    yield runtime
    await runtime.aclose()


def _calls(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


async def test_exec_flags_and_working_sandbox(
    runtime: ApptainerRuntime, apptainer_double: Path, image: str
) -> None:
    sb = await runtime.start(SandboxSpec(image=image, files={"f.txt": "hi"}, env={"X": "1"}))
    async with sb:
        r = await sb.exec('cat f.txt; echo " $SANDBOX_LOOPBACK_IP $X"; pwd')
        assert r.stdout.split() == ["hi", sb.loopback_ip, "1", "/workspace"]
        tree = snapshot(descendants(sb.pid) | {sb.pid})
    assert still_running(tree) == []
    (call,) = _calls(apptainer_double)
    argv = call["argv"]
    assert isinstance(argv, list)
    assert argv[:6] == ["exec", *_FIXED]
    assert argv[6:9] == ["--net", "--network", "none"]
    assert "--fakeroot" not in argv
    assert f"{sb.workspace}:/workspace" in argv and f"{sb.layout.socket_dir}:/run/prorl" in argv
    assert argv[argv.index(image) + 1 :][:4] == [
        sys.executable,
        "-P",
        "-m",
        "prorl_async.toolserver",
    ]
    env = call["env"]
    assert isinstance(env, dict)
    assert env["APPTAINERENV_SANDBOX_LOOPBACK_IP"] == sb.loopback_ip
    assert env["APPTAINERENV_X"] == "1"


async def test_network_opt_in_and_fakeroot(
    runtime: ApptainerRuntime, apptainer_double: Path, image: str
) -> None:
    async with await runtime.start(SandboxSpec(image=image, network=True, fakeroot=True)) as sb:
        assert (await sb.exec("id -u")).stdout.strip() == "0"
    (call,) = _calls(apptainer_double)
    argv = call["argv"]
    assert isinstance(argv, list)
    assert "--fakeroot" in argv
    assert argv[argv.index("--network") + 1] == "bridge"  # its own netns, never the host's


async def test_image_is_required_and_must_exist(runtime: ApptainerRuntime, tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="image"):
        await runtime.start(SandboxSpec())
    with pytest.raises(SpecError, match="missing.sif"):
        await runtime.start(SandboxSpec(image=str(tmp_path / "missing.sif")))
    assert runtime.live == 0


def test_unavailable_without_apptainer(
    config: RuntimeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(RuntimeUnavailableError, match="apptainer"):
        ApptainerRuntime(config)
