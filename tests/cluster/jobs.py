"""Submitting the launcher to the private Slurm and watching what its job leaves behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.cluster.slurm import PrivateSlurm
from tests.helpers import eventually_sync

SBATCH = Path(__file__).resolve().parents[2] / "deploy" / "slurm" / "prorl.sbatch"
PRORL = f"{sys.executable} -m prorl_async.cli"
SCRIPTED_LLM = f"{PRORL} scripted-llm --host {{host}} --port {{port}}"


def submit(slurm: PrivateSlurm, cwd: Path, env: dict[str, str], *args: str) -> str:
    """``sbatch [args] prorl.sbatch`` from ``cwd`` with ``env`` added; returns the job id."""
    full = {**slurm.env, "PRORL_BIN": PRORL, **env}
    out = _run(full, cwd, "sbatch", "--parsable", "-o", str(cwd / "job.out"), *args, str(SBATCH))
    return out.strip().split(";")[0]


def _run(env: dict[str, str], cwd: Path, *argv: str) -> str:
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"{argv}: {done.stderr}"
    return done.stdout


def job_field(slurm: PrivateSlurm, job: str, name: str) -> str:
    out = slurm.run("scontrol", "-o", "show", "job", job).stdout
    for item in out.split():
        if item.startswith(f"{name}="):
            return item.split("=", 1)[1]
    raise AssertionError(f"no {name} in {out}")


def wait_ended(slurm: PrivateSlurm, job: str, timeout: float) -> str:
    ended = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
    eventually_sync(lambda: job_field(slurm, job, "JobState") in ended, timeout, f"job {job} ends")
    return job_field(slurm, job, "JobState")


def job_processes(job: str) -> dict[int, str]:
    """Live processes of the job on any "node" (all on this host): its env or slurmstepd."""
    found = {}
    marker = f"\0SLURM_JOB_ID={job}\0".encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{name}/stat", "rb") as f:
                zombie = f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
        except OSError:
            continue
        if not zombie and (marker in b"\0" + env or f"[{job}." in cmd):
            found[int(name)] = cmd
    return found


def wait_no_processes(job: str, timeout: float) -> float:
    return eventually_sync(
        lambda: not job_processes(job),
        timeout,
        lambda: f"no process of job {job} left: {job_processes(job)}",
    )
