"""A private three-node Slurm 22.05 on this one host, for the launcher tests.

Node names n1..n3 each get their own ``slurmd -N nX`` on a free port and their own
loopback address (127.0.0.11..13) as ``NodeAddr``, so a process bound by NodeAddr is
told apart from one bound by ``hostname``. munge runs with its own key and socket and
slurmctld on a free port: nothing is shared with another Slurm on the machine. Every
daemon is this object's child and is stopped by pid in :meth:`stop`.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests.helpers import eventually_sync, free_ports

__all__ = ["NODES", "PrivateSlurm", "slurm_available"]

NODES = ("n1", "n2", "n3")
ADDRS = {n: f"127.0.0.{11 + i}" for i, n in enumerate(NODES)}
_BINARIES = ("slurmctld", "slurmd", "sbatch", "srun", "scontrol", "munged", "mungekey")


def slurm_available() -> bool:
    return all(shutil.which(b) for b in _BINARIES)


class PrivateSlurm:
    """``start()`` brings it up (~2-4 s); ``env`` is what clients need; ``stop()`` ends it."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.conf = base / "etc" / "slurm.conf"
        # munged wants o+x on every directory above its socket; pytest's tmp dirs are 0700
        self._munge_dir = Path(tempfile.mkdtemp(prefix="prorl-munge-"))
        self._munge_dir.chmod(0o755)
        self.socket = self._munge_dir / "munge.socket.2"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._daemons: list[subprocess.Popen[bytes]] = []

    def start(self, timeout: float = 60.0) -> None:
        for sub in ("etc", "state", "log", "run", "munge", *(f"spool/{n}" for n in NODES)):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        self._start_munge()
        self._write_conf()
        self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        for node in NODES:
            self._spawn(f"slurmd-{node}", ["slurmd", "-D", "-N", node, "-f", str(self.conf)])
        self._wait_idle(timeout)

    def _start_munge(self) -> None:
        m = self.base / "munge"
        subprocess.run(["mungekey", "-c", "-f", "-k", str(m / "munge.key")], check=True)
        self._spawn(
            "munged",
            [
                "munged",
                "-F",
                "-S",
                str(self.socket),
                f"--key-file={m / 'munge.key'}",
                f"--pid-file={m / 'munged.pid'}",
                f"--log-file={m / 'munged.log'}",
                f"--seed-file={m / 'seed'}",
            ],
        )
        eventually_sync(self._munge_ok, 20, f"munged up; see {m / 'munged.log'}", interval=0.05)

    def _munge_ok(self) -> bool:
        cred = subprocess.run(["munge", "-n", "-S", str(self.socket)], capture_output=True)
        if cred.returncode != 0:
            return False
        check = subprocess.run(
            ["unmunge", "-S", str(self.socket)], input=cred.stdout, capture_output=True
        )
        return check.returncode == 0

    def _write_conf(self) -> None:
        ctld_port, *node_ports = free_ports(1 + len(NODES), host="0.0.0.0")
        host = socket.gethostname().split(".")[0]
        b = self.base
        nodes = "\n".join(
            f"NodeName={n} NodeHostname={host} NodeAddr={ADDRS[n]} Port={p} CPUs={os.cpu_count()}"
            " RealMemory=4000 State=UNKNOWN"
            for n, p in zip(NODES, node_ports, strict=True)
        )
        self.conf.write_text(f"""\
ClusterName=prorltest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
AuthInfo=socket={self.socket}
SlurmUser=root
StateSaveLocation={b}/state
SlurmdSpoolDir={b}/spool/%n
SlurmctldPidFile={b}/run/slurmctld.pid
SlurmdPidFile={b}/run/slurmd-%n.pid
SlurmctldLogFile={b}/log/slurmctld.log
SlurmdLogFile={b}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MailProg=/bin/true
ReturnToService=2
SchedulerParameters=batch_sched_delay=0
KillWait=10
FirstJobId={random.randrange(10_000, 900_000)}
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")

    def _spawn(self, name: str, argv: list[str]) -> None:
        with open(self.base / "log" / f"{name}.stderr", "ab") as log:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=self.env,
                start_new_session=True,
            )
        self._daemons.append(proc)

    def _wait_idle(self, timeout: float) -> None:
        state = ""

        def idle() -> bool:
            nonlocal state
            for proc in self._daemons:
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"{proc.args!r} exited ({proc.returncode}); see {self.base}/log"
                    )
            state = self.run("sinfo", "-h", "-o", "%T", check=False).stdout
            states = set(state.split())
            if states & {"down", "drain", "fail", "down*", "drained"}:
                self.run("scontrol", "update", "NodeName=n[1-3]", "State=RESUME", check=False)
            return bool(states) and states <= {"idle", "mixed", "allocated", "completing"}

        eventually_sync(
            idle, timeout, lambda: f"Slurm nodes idle (state {state!r}); see {self.base}/log"
        )

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this Slurm."""
        return subprocess.run(
            argv, env=self.env, capture_output=True, text=True, check=check, timeout=60
        )

    def stop(self) -> None:
        """Cancel every job, then stop the daemons by pid (SIGTERM, then SIGKILL)."""
        if any(p.poll() is None for p in self._daemons):
            self.run("scancel", "--full", "--user", "root", check=False)
        for proc in reversed(self._daemons):
            if proc.poll() is None:
                proc.terminate()
        for proc in reversed(self._daemons):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._daemons.clear()
        shutil.rmtree(self._munge_dir, ignore_errors=True)


if __name__ == "__main__":  # python -m tests.cluster.slurm DIR
    import sys

    slurm = PrivateSlurm(Path(sys.argv[1]))
    t0 = time.monotonic()
    slurm.start()
    sys.stdout.write(f"up in {time.monotonic() - t0:.1f}s: export SLURM_CONF={slurm.conf}\n")
    sys.stdout.flush()
    try:
        input("press enter to stop\n")
    finally:
        slurm.stop()
