"""The engine launcher's spin setting: seconds, vLLM's own, or a clear refusal."""

from __future__ import annotations

from pathlib import Path

import pytest

from prorl_async.vllm_cpu import EngineEnv, VllmProcess
from prorl_async.vllm_cpu.launch import DEFAULT_IDLE_SPIN_S, idle_spin_s


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (None, DEFAULT_IDLE_SPIN_S),
        ("", DEFAULT_IDLE_SPIN_S),
        ("0", 0.0),
        (" 0.5 ", 0.5),
        ("vllm", None),
    ],
)
def test_the_spin_setting_is_read(value: str | None, seconds: float | None) -> None:
    assert idle_spin_s(value) == seconds


@pytest.mark.parametrize("value", ["-1", "fast", "nan"])
def test_a_spin_that_is_not_seconds_is_refused_naming_it(value: str) -> None:
    with pytest.raises(ValueError, match=f"PRORL_VLLM_IDLE_SPIN_S='{value}'"):
        idle_spin_s(value)


def test_the_engine_is_started_through_the_launcher(tmp_path: Path) -> None:
    proc = VllmProcess(EngineEnv(tmp_path), tmp_path, log_path=tmp_path / "log")
    assert proc.argv()[1:3] == ["-m", "prorl_async.vllm_cpu.launch"]
    with pytest.raises(ValueError, match="idle_spin_s must be >= 0"):
        VllmProcess(EngineEnv(tmp_path), tmp_path, log_path=tmp_path / "log", idle_spin_s=-1)
