"""deploy/slurm/prorl.sbatch on a real three-node Slurm (three slurmd on this host).

n1 and n2 run two scripted LLMs each (the TEST DOUBLE for vLLM/SGLang), n3 none; every
node runs one rollout server bound to its NodeAddr (127.0.0.11..13).
"""

from __future__ import annotations

import json
import os
import random
import signal
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from prorl_async.cluster import assign, load_spec
from prorl_async.sandbox.keeper import sweep, tagged
from tests.cluster.jobs import (
    PRORL,
    SCRIPTED_LLM,
    job_field,
    job_processes,
    submit,
    wait_ended,
    wait_no_processes,
)
from tests.cluster.slurm import ADDRS, PrivateSlurm
from tests.helpers import eventually_sync
from tests.proctree import cmdline, descendants

TOKEN = "t0ken-not-on-any-command-line"
GONE_WITHIN_S = 5.0  # issue 44's bound on what a killed server leaves


def _tasks(path: Path, n: int) -> Path:
    with path.open("w") as f:
        for i in range(n):
            instance = {"problem": f"What is {i} + 1?", "answer": str(i + 1), "max_turns": 2}
            job = {"task": "math", "instance": instance, "sampling_params": {"max_tokens": 8}}
            f.write(json.dumps(job) + "\n")
    return path


def _llm_env(llm_cmd: str = SCRIPTED_LLM) -> dict[str, str]:
    return {
        "PRORL_LLM_CMD": llm_cmd,
        "PRORL_LLM_NODES": "n[1-2]",
        "PRORL_LLMS_PER_NODE": "2",
        "PRORL_TOKEN": TOKEN,
        "PRORL_START_TIMEOUT_S": "90",
    }


def _collect(tmp: Path, batches: int) -> str:
    tasks = _tasks(tmp / "tasks.jsonl", 16)
    return (
        f'{PRORL} collect --cluster "$PRORL_CLUSTER" --tasks {tasks} --group-size 4 '
        f"--batch-groups 8 --batches {batches} --filter none --output {tmp / 'out.jsonl'}"
    )


def _check_tokens(result: dict[str, Any]) -> None:
    ids, mask, lps = result["response_ids"], result["response_mask"], result["response_logprobs"]
    assert len(ids) == len(mask) == len(lps)
    sampled = [t for t in result["turns"] if t["role"] == "assistant"]
    assert [i for i, m in zip(ids, mask, strict=True) if m] == [
        i for t in sampled for i in t["token_ids"]
    ]
    assert [p for p, m in zip(lps, mask, strict=True) if m] == [
        p for t in sampled for p in t["logprobs"]
    ]
    assert all(p == 0.0 for p, m in zip(lps, mask, strict=True) if not m)


def test_three_nodes_collect_node_local_assignment(slurm: PrivateSlurm, tmp_path: Path) -> None:
    env = {
        **_llm_env(),
        "PRORL_STATE_ROOT": str(tmp_path / "state"),
        "PRORL_TRAINER_CMD": _collect(tmp_path, 2),
    }
    job = submit(slurm, tmp_path, env, "-N", "3")
    assert wait_ended(slurm, job, 120) == "COMPLETED", (tmp_path / "job.out").read_text()
    assert job_field(slurm, job, "ExitCode") == "0:0"
    wait_no_processes(job, 30)
    run = tmp_path / f"prorl-{job}"  # the default run dir: $SLURM_SUBMIT_DIR/prorl-$SLURM_JOB_ID
    spec = load_spec((run / "cluster.json").read_bytes())
    assert spec.slurm_job_id == job
    # bound to each node's NodeAddr, not hostname
    assert [(s.node, s.url.rsplit(":", 1)[0]) for s in spec.servers] == [
        (n, f"http://{a}") for n, a in ADDRS.items()
    ]
    assert sorted(m.node for m in spec.llms) == ["n1", "n1", "n2", "n2"]
    assert all(m.address.startswith(f"http://{ADDRS[m.node]}:") for m in spec.llms)
    assert spec.assignment == assign(spec.servers, spec.llms)
    node_of = {m.address: m.node for m in spec.llms}
    by_node = {s.node: [node_of[a] for a in spec.assignment[s.url]] for s in spec.servers}
    assert sorted(by_node["n3"]) in (["n1"], ["n2"]), by_node  # the LLM-less node: remote
    assert sorted(by_node["n1"] + by_node["n2"]).count("n1") >= 1
    assert all(set(by_node[n]) == {n} for n in ("n1", "n2")), by_node  # others: local only
    results = [
        r
        for line in (tmp_path / "out.jsonl").read_text().splitlines()
        for r in json.loads(line)["results"]
    ]
    assert len(results) >= 60
    used = {t["backend"] for r in results for t in r["turns"] if t["role"] == "assistant"}
    assert used == set(node_of), "every backend served requests"
    server_of = {a: url for url, addrs in spec.assignment.items() for a in addrs}
    assert {server_of[a] for a in used} == {s.url for s in spec.servers}, "every server ran jobs"
    for result in results:
        _check_tokens(result)
    # one log per process; node-local state dirs, one per server
    logs = {p.name for p in (run / "logs").iterdir()}
    assert {"trainer.log", "server-n1-0.log", "server-n3-0.log", "llm-n2-1.log"} <= logs
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == [
        "server-n1-0",
        "server-n2-0",
        "server-n3-0",
    ]
    for node in ("n1", "n2", "n3"):
        assert "stopped cleanly" in (run / "logs" / f"server-{node}-0.log").read_text()


def _sandbox_records(state: Path) -> list[Path]:
    return sorted(state.glob("*/sandboxes/*.json"))


def _status(url: str) -> dict[str, Any]:
    request = urllib.request.Request(f"{url}/status", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        return dict(json.load(resp))


def _status_without_token(url: str) -> int:
    try:
        with urllib.request.urlopen(f"{url}/status", timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_scancel_mid_run_leaves_nothing(slurm: PrivateSlurm, tmp_path: Path) -> None:
    slow_llm = f"{SCRIPTED_LLM} --ttft 0.5"
    state = tmp_path / "state"
    env = {
        **_llm_env(slow_llm),
        "PRORL_STATE_ROOT": str(state),
        "PRORL_TRAINER_CMD": _collect(tmp_path, 100),
    }
    job = submit(slurm, tmp_path, env, "-N", "3")
    cluster = tmp_path / f"prorl-{job}" / "cluster.json"
    eventually_sync(
        lambda: cluster.exists() and len(_sandbox_records(state)) >= 3,
        90,
        lambda: f"rollouts running; job.out: {(tmp_path / 'job.out').read_text()}",
    )
    spec = load_spec(cluster.read_bytes())
    # the token reached the servers through the environment only
    assert all(_status_without_token(s.url) == 401 for s in spec.servers)
    assert not [cmd for cmd in job_processes(job).values() if TOKEN in cmd]
    # each server has exactly the backends cluster.json assigns it, with weight version 0
    for server in spec.servers:
        backends = _status(server.url)["backends"]
        assert sorted(b["address"] for b in backends) == sorted(spec.assignment[server.url])
        assert {b["weight_version"] for b in backends} == {0}
    slurm.run("scancel", job)
    took = wait_no_processes(job, 30)
    assert _sandbox_records(state) == []
    assert wait_ended(slurm, job, 30) == "CANCELLED"
    assert took < 30


def test_llm_that_exits_at_once_fails_fast_with_its_log(
    slurm: PrivateSlurm, tmp_path: Path
) -> None:
    env = {
        **_llm_env("sh -c 'echo cannot load the model on port {port} >&2; exit 3'"),
        "PRORL_LLM_NODES": "n2",
        "PRORL_LLMS_PER_NODE": "1",
        "PRORL_STATE_ROOT": str(tmp_path / "state"),
        "PRORL_TRAINER_CMD": f"touch {tmp_path / 'trainer-ran'}",
    }
    job = submit(slurm, tmp_path, env, "-N", "3")
    assert wait_ended(slurm, job, 60) == "FAILED"
    wait_no_processes(job, 30)
    out = (tmp_path / "job.out").read_text()
    assert "llm-n2-0 exited with status 3" in out, out
    assert "cannot load the model on port" in out, out  # the tail of its log
    assert not (tmp_path / "trainer-ran").exists()
    start, end = job_field(slurm, job, "StartTime"), job_field(slurm, job, "EndTime")
    assert _seconds(end) - _seconds(start) < 30, (start, end)


def _seconds(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp).timestamp()


def _stamp(log: Path, text: str) -> str:
    for line in log.read_text().splitlines():
        if text in line:
            return line[:23]
    raise AssertionError(f"{text!r} not in {log}: {log.read_text()}")


def _minutes_run(slurm: PrivateSlurm, job: str) -> int:
    """Whole minutes the job has run, rounded up."""
    out = slurm.run("squeue", "-h", "-j", job, "-o", "%M").stdout.strip()  # [[D-]H:]MM:SS
    days, _, clock = out.rpartition("-")
    parts = [int(x) for x in clock.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    seconds = (int(days or 0) * 24 + parts[0]) * 3600 + parts[1] * 60 + parts[2]
    return -(-seconds // 60)


def test_time_limit_stops_servers_gracefully_then_llms(slurm: PrivateSlurm, tmp_path: Path) -> None:
    env = {
        **_llm_env(),
        "PRORL_LLM_NODES": "n1",
        "PRORL_LLMS_PER_NODE": "1",
        "PRORL_STATE_ROOT": str(tmp_path / "state"),
    }
    job = submit(slurm, tmp_path, env, "-N", "3", "--time=10")
    run = tmp_path / f"prorl-{job}"
    eventually_sync((run / "cluster.json").exists, 90, lambda: (tmp_path / "job.out").read_text())
    # Less time left than the --signal=B:TERM@120 warning, so the batch shell is warned, but
    # over a minute before the hard limit (at which Slurm signals every step at once).
    slurm.run("scontrol", "update", f"JobId={job}", f"TimeLimit={_minutes_run(slurm, job) + 2}")
    wait_ended(slurm, job, 100)
    wait_no_processes(job, 30)
    out = (tmp_path / "job.out").read_text()
    assert "got SIGTERM" in out, out
    for node in ("n1", "n2", "n3"):
        log = run / "logs" / f"server-{node}-0.log"
        # SIGTERM, not SIGKILL: the server ran its orderly shutdown to the end
        assert _stamp(log, "signal received") <= _stamp(log, "stopped cleanly")
    servers_done = max(
        _stamp(run / "logs" / f"node-servers-{i}.log", "all stopped") for i in range(3)
    )
    llms_told = _stamp(run / "logs" / "node-llms-0.log", "signal received")
    assert servers_done <= llms_told, (servers_done, llms_told)


def test_job_exit_status_is_the_trainers_and_state_is_node_local(
    slurm: PrivateSlurm, tmp_path: Path
) -> None:
    # no LLMs (the trainer brings its own); state root defaults to $TMPDIR/prorl-$SLURM_JOB_ID
    env = {
        "TMPDIR": str(tmp_path / "nodetmp"),
        "PRORL_SERVERS_PER_NODE": "2",
        "PRORL_TRAINER_CMD": 'test -s "$PRORL_CLUSTER" && exit 7',
    }
    (tmp_path / "nodetmp").mkdir()
    job = submit(slurm, tmp_path, env, "-N", "3")
    assert wait_ended(slurm, job, 90) == "FAILED"
    assert job_field(slurm, job, "ExitCode") == "7:0"
    wait_no_processes(job, 30)
    spec = load_spec((tmp_path / f"prorl-{job}" / "cluster.json").read_bytes())
    assert len(spec.servers) == 6 and spec.llms == []
    assert spec.assignment == {s.url: [] for s in spec.servers}
    state = tmp_path / "nodetmp" / f"prorl-{job}"
    assert sorted(p.name for p in state.iterdir()) == [
        f"server-{n}-{i}" for n in ("n1", "n2", "n3") for i in (0, 1)
    ]


def test_batch_sigterm_stops_a_compound_trainer_and_its_children(
    slurm: PrivateSlurm, tmp_path: Path
) -> None:
    """The trainer command is ``cd ... && python ...`` whose python ignores SIGTERM: the
    launcher signals the trainer's whole process group, then kills it after the grace
    period, so nothing of the job outlives it (before, only the ``bash -c`` got SIGTERM)."""
    pid_file = tmp_path / "trainer.pid"
    stubborn = (
        "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(600)"
    )
    env = {
        "PRORL_STATE_ROOT": str(tmp_path / "state"),
        "PRORL_STOP_GRACE_S": "1",
        "PRORL_TRAINER_CMD": f'cd {tmp_path} && python3 -c "{stubborn}"',
    }
    job = submit(slurm, tmp_path, env, "-N", "1")
    eventually_sync(
        lambda: pid_file.exists() and pid_file.read_text() != "", 90, "the trainer runs"
    )
    slurm.run("scancel", "--batch", "--signal=TERM", job)
    wait_ended(slurm, job, 60)
    wait_no_processes(job, 30)
    out = (tmp_path / "job.out").read_text()
    assert "stopping the trainer" in out, out
    assert not os.path.exists(f"/proc/{pid_file.read_text()}"), out


def test_a_server_killed_inside_the_job_leaves_no_sandbox_process(
    slurm: PrivateSlurm, tmp_path: Path
) -> None:
    """Under Slurm, with the job going on (so neither the step's end nor its cgroup cleans
    up): a rollout server SIGKILLed mid-run leaves no process of its sandboxes 5 s later.
    Two servers on the node: the other one, and the job, live on."""
    env = {
        **_llm_env(f"{SCRIPTED_LLM} --ttft 0.5"),
        "PRORL_LLM_NODES": "n1",
        "PRORL_LLMS_PER_NODE": "1",
        "PRORL_SERVERS_PER_NODE": "2",
        "PRORL_STATE_ROOT": str(tmp_path / "state"),
        "PRORL_TRAINER_CMD": _collect(tmp_path, 100),
    }
    job = submit(slurm, tmp_path, env, "-N", "1", "-w", "n1")
    tag = ""
    try:
        eventually_sync(
            lambda: len(_sandboxed_servers(job)) == 2,
            90,
            lambda: f"two servers with sandboxes; job.out: {(tmp_path / 'job.out').read_text()}",
        )
        servers = _sandboxed_servers(job)
        victim = sorted(servers)[random.Random(44).randrange(2)]
        tag = servers[victim]
        assert tagged(tag), "the server to kill has sandbox processes"
        os.kill(victim, signal.SIGKILL)
        eventually_sync(
            lambda: not tagged(tag),
            GONE_WITHIN_S,
            lambda: f"left: {[cmdline(p) for p in tagged(tag)]}",
            interval=0.1,
        )
        survivor = next(p for p in servers if p != victim)
        assert survivor in job_processes(job), "the other server lives on"
        assert job_field(slurm, job, "JobState") == "RUNNING"
    finally:
        slurm.run("scancel", job)
        if tag:
            sweep(tag)  # a failing run leaves nothing either (linuxproc tracks no orphans)
        wait_no_processes(job, 30)


def _sandboxed_servers(job: str) -> dict[int, str]:
    """The job's rollout servers that run a sandbox keeper: pid -> their sandboxes' tag."""
    found = {}
    for pid, cmd in job_processes(job).items():
        if " serve " not in f"{cmd} ":
            continue
        keepers = [p for p in descendants(pid) if "sandbox/keeper.py" in cmdline(p)]
        if keepers:
            found[pid] = cmdline(keepers[0]).rsplit(" ", 1)[1]
    return found
