"""``prorl-async cluster assign|node|bringup`` as processes, without Slurm (``--addr`` given)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from prorl_async.cluster.node import node_gpus, split_gpus

CLI = [sys.executable, "-m", "prorl_async.cli", "cluster"]


def _cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], input=stdin, capture_output=True, text=True, timeout=60)


def test_assign_reads_stdin_or_file_and_writes_the_document(tmp_path: Path) -> None:
    doc = {
        "slurm_job_id": "7",
        "servers": [{"url": "http://a:1", "node": "a"}, {"url": "http://b:1", "node": "b"}],
        "llms": [{"address": f"http://a:{p}/v1", "node": "a"} for p in (2, 3, 4)],
    }
    out = _cli("assign", stdin=json.dumps(doc))
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["assignment"] == {
        "http://a:1": ["http://a:2/v1", "http://a:3/v1"],
        "http://b:1": ["http://a:4/v1"],
    }
    assert got["slurm_job_id"] == "7" and got["servers"] == doc["servers"]
    path = tmp_path / "c.json"
    path.write_text(json.dumps(doc))
    assert json.loads(_cli("assign", "--file", str(path)).stdout) == got


def test_assign_names_what_is_wrong() -> None:
    bad = _cli("assign", stdin=json.dumps({"servers": [{"url": "http://a:1"}]}))
    assert bad.returncode == 1 and "node" in bad.stderr and "stdin" in bad.stderr
    none = _cli(
        "assign", stdin=json.dumps({"servers": [], "llms": [{"address": "x", "node": "a"}]})
    )
    assert none.returncode == 1 and "no rollout server" in none.stderr


def test_node_rejects_a_bad_template(tmp_path: Path) -> None:
    out = _cli(
        "node",
        "--role",
        "llm",
        "--node",
        "n1",
        "--addr",
        "127.0.0.1",
        "--count",
        "1",
        "--run-dir",
        str(tmp_path),
        "--llm-cmd",
        "serve --port {prot}",
    )
    assert out.returncode == 1 and "PRORL_LLM_CMD" in out.stderr and "prot" in out.stderr


def test_bringup_fails_fast_with_the_log_tail_and_the_node_stops_the_rest(tmp_path: Path) -> None:
    llm = "sh -c 'echo weights missing >&2; exit 4'"
    node = subprocess.Popen(
        [
            *CLI,
            "node",
            "--role",
            "llm",
            "--node",
            "n1",
            "--addr",
            "127.0.0.1",
            "--count",
            "2",
            "--run-dir",
            str(tmp_path),
            "--llm-cmd",
            llm,
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        start = time.monotonic()
        out = _cli(
            "bringup",
            "--run-dir",
            str(tmp_path),
            "--servers",
            "0",
            "--llms",
            "2",
            "--timeout",
            "60",
        )
        assert time.monotonic() - start < 30
        assert out.returncode == 1
        assert "exited with status 4" in out.stderr and "weights missing" in out.stderr
        assert node.wait(timeout=30) == 1  # both children failed: non-zero
        assert sorted(p.name for p in (tmp_path / "cluster.d").glob("*.failed")) == [
            "llm-n1-0.failed",
            "llm-n1-1.failed",
        ]
    finally:
        node.kill()
        node.wait()


def test_bringup_timeout_names_what_is_missing(tmp_path: Path) -> None:
    out = _cli(
        "bringup", "--run-dir", str(tmp_path), "--servers", "2", "--llms", "0", "--timeout", "0.5"
    )
    assert out.returncode == 1 and "not up after 0.5 s: 0/2 servers" in out.stderr


def test_split_gpus() -> None:
    assert split_gpus([], 2) == [[], []]
    assert split_gpus(["0", "1", "2", "3"], 2) == [["0", "1"], ["2", "3"]]
    assert split_gpus(["0", "1", "2", "3"], 3) == [["0"], ["1"], ["2"]]
    assert split_gpus(["0"], 2) == [["0"], ["0"]]


def test_node_gpus_follow_slurm_cuda_visible_devices() -> None:
    assert node_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}) == ["2", "3"]
    assert node_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
