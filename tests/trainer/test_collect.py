"""``prorl-async collect`` as a subprocess against real servers."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import msgspec

from tests.trainer.checks import check_group
from tests.trainer.harness import mixed_prompts, rig


async def run_collect(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "prorl_async.cli",
        "collect",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def write_tasks(path: Path, jobs: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(j) + "\n" for j in jobs))
    return path


async def test_collect_fills_batches_from_a_cluster_file(tmp_path: Path) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", mixed_prompts(120, run_s=0.01))
    async with rig(tmp_path) as r:
        cluster = {
            "slurm_job_id": "123",
            "servers": [{"url": u, "node": "n1"} for u in r.urls],
            "llms": [{"address": r.llm.address, "node": "n1"}],
            "assignment": {u: [r.llm.address] for u in r.urls},
        }
        (tmp_path / "cluster.json").write_text(json.dumps(cluster))
        code, out, err = await run_collect(
            "--cluster",
            str(tmp_path / "cluster.json"),
            "--tasks",
            str(tasks),
            "--group-size",
            "4",
            "--batch-groups",
            "3",
            "--batches",
            "2",
            "--output",
            str(tmp_path / "out.jsonl"),
            "--backends",
            r.llm.address,
        )
    assert code == 0, err
    assert "batch 1/2: 3 groups in" in out and "batch 2/2: 3 groups in" in out
    assert "pass rate" in out
    lines = (tmp_path / "out.jsonl").read_bytes().splitlines()
    assert len(lines) == 6
    records = [msgspec.json.decode(line) for line in lines]
    assert len({rec["prompt_uid"] for rec in records}) == 6
    from prorl_async.trainer import Group

    for rec in records:
        group = Group(rec["prompt_uid"], rec["job"], rec["results"], attempts=rec["attempts"])
        check_group(group, 4)


async def test_collect_fails_clearly(tmp_path: Path) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", mixed_prompts(3))
    code, _, err = await run_collect(
        "--servers",
        "http://127.0.0.1:9",
        "--tasks",
        str(tasks),
        "--group-size",
        "2",
        "--batch-groups",
        "1",
        "--output",
        str(tmp_path / "out.jsonl"),
    )
    assert code == 1
    assert "no rollout server answered /status: http://127.0.0.1:9" in err

    (tmp_path / "bad.jsonl").write_text('{"task": "planted", "instance": {}}\n{oops\n')
    code, _, err = await run_collect(
        "--servers",
        "http://127.0.0.1:9",
        "--tasks",
        str(tmp_path / "bad.jsonl"),
        "--group-size",
        "2",
        "--batch-groups",
        "1",
        "--output",
        str(tmp_path / "o.jsonl"),
    )
    assert code == 2
    assert "bad.jsonl:2" in err
