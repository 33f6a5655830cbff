"""The keeper: ends every sandbox process of a server the moment the server dies.

``--die-with-parent`` does not cover every path: a sandbox whose launch is between
``fork`` and bwrap's ``prctl`` when the server dies (the ``sh`` prefix that joins its
cgroups runs first), and helpers such as slirp4netns, outlive a server killed with
SIGKILL or by the OOM killer, re-parented to init. The restart-time reaper
(``records.reap_stale``) cleans up only if a server starts again on the same state dir.

So a runtime runs a keeper (:class:`Keeper`) while it has a sandbox: a small process of
its own session that holds the read end of a pipe whose write end only the server has.
Every process a runtime launches carries ``PRORL_SANDBOX_TAG=<tag>`` in its environment
(bwrap's outer and namespace-init processes, apptainer's starter, slirp4netns; what runs
inside a PID namespace dies with its init). When the pipe reaches EOF (the kernel closes
it whatever ended the server), the keeper SIGKILLs every process whose environment
carries the tag, sweeping until none has been found for ``QUIET_S`` (late ``exec``\\ s of a
launch under way are caught), bounded by ``SWEEP_S``, then exits. A server that closes
its runtime normally has ended its sandboxes already: the sweep finds nothing.

Why not a cgroup: cgroup v1, v2 without a delegated subtree, and a root-less server
cannot all kill a cgroup; every process can read the environment of its own processes
(root: of all). Why not ``PR_SET_PDEATHSIG``: it follows the thread that forked, and a
process that sets it after its parent died never gets it. The keeper runs as the
server's user, has no socket, and nothing of it is reachable from a sandbox (the pipe's
write end is close-on-exec in the server).

    python -I -S prorl_async/sandbox/keeper.py TAG      # stdin: the pipe
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["ENV", "Keeper", "sweep", "tagged"]

ENV = "PRORL_SANDBOX_TAG"
SWEEP_S = 4.0
QUIET_S = 1.0
BYE = b"bye\n"
_INTERVAL_S = 0.05

log = logging.getLogger(__name__)


def tagged(tag: str) -> set[int]:
    """Pids of the processes whose environment holds ``PRORL_SANDBOX_TAG=tag``."""
    needle = f"{ENV}={tag}".encode()
    found = set()
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            environ = Path(entry.path, "environ").read_bytes()
        except OSError:
            continue  # gone, or not ours to read
        if needle in environ.split(b"\0"):
            found.add(int(entry.name))
    return found


def sweep(tag: str, *, total_s: float = SWEEP_S, quiet_s: float = QUIET_S) -> int:
    """SIGKILL every process tagged ``tag`` (and its process group), again and again until
    none has been seen for ``quiet_s`` or ``total_s`` passed (at least one pass); how
    many were killed."""
    killed: set[int] = set()
    start = last_seen = time.monotonic()
    while True:
        found = tagged(tag)
        now = time.monotonic()
        if found:
            last_seen = now
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if os.getpgid(pid) == pid:
                    os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
            killed.add(pid)
        if now - last_seen >= quiet_s or now - start >= total_s:
            return len(killed)
        time.sleep(_INTERVAL_S)  # a separate process with no event loop: a plain pause


class Keeper:
    """The server's side: starts the keeper process and holds the pipe's write end.

    ``release`` tells the keeper the runtime has no sandbox left (it makes one last pass,
    finding nothing, and exits) without waiting for it; ``wait`` reaps it, bounded.
    """

    def __init__(self, tag: str | None = None) -> None:
        self.tag = tag or f"{os.getpid()}-{secrets.token_hex(8)}"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        # stdin=PIPE: the write end stays in this process only (close-on-exec, and every
        # other child is started with close_fds). Its own session: a signal to the
        # server's process group (Ctrl-C) does not end the keeper before the server.
        # Run by path, isolated: it needs the standard library only.
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-S", __file__, self.tag],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            start_new_session=True,
            close_fds=True,
        )

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def release(self) -> None:
        """Say BYE and close the pipe: the keeper exits after one pass (no waiting here)."""
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdin.closed:
            return
        with contextlib.suppress(OSError):
            proc.stdin.write(BYE)
            proc.stdin.flush()
        with contextlib.suppress(OSError):
            proc.stdin.close()

    def exited(self) -> bool:
        """Whether the keeper has ended (and is reaped)."""
        return self._proc is None or self._proc.poll() is not None

    def wait(self, timeout_s: float = SWEEP_S + 2.0) -> None:
        """Release, then reap it (killed if it has not ended within ``timeout_s``)."""
        self.release()
        proc = self._proc
        if proc is None:
            return
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0]:
        sys.stderr.write("usage: python keeper.py TAG  (stdin: the pipe)\n")
        return 2
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server's Ctrl-C is not ours
    # Block until the server's end of the pipe closes: it died, or said BYE first.
    said = b""
    while chunk := sys.stdin.buffer.read(4096):
        said = (said + chunk)[-len(BYE) :]
    if said == BYE:
        sweep(argv[0], total_s=0.0)  # its sandboxes are closed: one pass, nothing expected
    else:
        sweep(argv[0])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
