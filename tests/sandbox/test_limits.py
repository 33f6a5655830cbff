"""Limit structs, the prlimit prefix and the enforcement report."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest

from prorl_async.sandbox import LimitsError, SandboxLimits, SandboxSpec, SpecError
from prorl_async.sandbox.limits import describe_enforcement, nproc_binds, prlimit_argv


def test_defaults_stop_runaways() -> None:
    lim = SandboxLimits()
    assert lim.memory_bytes == 4 << 30
    assert lim.file_size_bytes == 1 << 30
    assert lim.max_processes is not None and lim.open_files is not None


def test_prlimit_prefix_sets_soft_and_hard() -> None:
    argv = prlimit_argv(SandboxLimits(memory_bytes=123, cpu_seconds=None))
    assert os.path.basename(argv[0]) == "prlimit" and argv[-1] == "--"
    assert "--as=123:123" in argv
    assert not any(a.startswith("--cpu") for a in argv)
    assert f"--fsize={1 << 30}:{1 << 30}" in argv


def test_bad_limits_are_named() -> None:
    with pytest.raises(LimitsError, match="limits.memory_bytes"):
        SandboxLimits(memory_bytes=0).validate()
    with pytest.raises(msgspec.ValidationError, match="bogus"):
        msgspec.convert({"bogus": 1}, SandboxLimits)


def test_bad_spec_is_named() -> None:
    with pytest.raises(SpecError, match="'../x'"):
        SandboxSpec(files={"../x": ""}).validate()
    with pytest.raises(SpecError, match="'/etc/passwd'"):
        SandboxSpec(files={"/etc/passwd": ""}).validate()
    with pytest.raises(SpecError, match="'A-B'"):
        SandboxSpec(env={"A-B": "1"}).validate()


def test_enforcement_report_is_honest_about_nproc() -> None:
    report = describe_enforcement(SandboxLimits(), None)
    if os.getuid() == 0:
        assert not nproc_binds()
        assert "NOT ENFORCED" in report["max_processes"]
    else:
        assert "RLIMIT_NPROC" in report["max_processes"]
    cg = describe_enforcement(SandboxLimits(), Path("/sys/fs/cgroup/x"))
    assert "pids cgroup" in cg["max_processes"]
    assert report["memory_bytes"] == f"RLIMIT_AS={4 << 30} per process"
