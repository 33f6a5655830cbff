"""Outside network for a sandbox, without the host's: slirp4netns in the sandbox's own netns.

A sandbox always gets its own network namespace. When its spec asks for network
(and the operator allows it), ``slirp4netns`` (Debian package ``slirp4netns``)
attaches a user-mode TCP/IP stack to that namespace: connections to outside
addresses are made by slirp4netns from the host, while ``--disable-host-loopback``
refuses the host's ``127.0.0.1`` (the server's API above all); the sandbox's own
``127.0.0.1`` is its private loopback. Services the host binds on a non-loopback
address stay reachable, as they are from any other machine.
"""

from __future__ import annotations

import asyncio
import os
import shutil

from prorl_async.util.procs import descendants

__all__ = ["NetworkError", "find_slirp4netns", "netns_pid", "start_slirp"]


class NetworkError(RuntimeError):
    """The sandbox's user-mode network could not be set up; the message says why."""


def find_slirp4netns() -> str | None:
    """Path of ``slirp4netns``, or None."""
    return shutil.which("slirp4netns") or (
        "/usr/bin/slirp4netns" if os.access("/usr/bin/slirp4netns", os.X_OK) else None
    )


def _netns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def netns_pid(root_pid: int) -> int:
    """A process under ``root_pid`` that lives in another network namespace than ours."""
    own = _netns(os.getpid())
    for pid in sorted(descendants(root_pid)):
        ns = _netns(pid)
        if ns is not None and ns != own:
            return pid
    raise NetworkError(f"no process under pid {root_pid} has its own network namespace")


async def start_slirp(
    target: int,
    *,
    prefix: list[str],
    userns: bool,
    log: str,
    timeout: float,
    env: dict[str, str] | None = None,
) -> asyncio.subprocess.Process:
    """Start slirp4netns on ``target``'s netns; return once the interface is configured.

    ``prefix`` runs before it (joining the sandbox's cgroups, so teardown and the crash
    reaper find it); its output is appended to ``log``. The caller owns the returned
    process and must end it.
    """
    binary = find_slirp4netns()
    if binary is None:
        raise NetworkError("network: slirp4netns is not installed (Debian package slirp4netns)")
    ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
    argv = [
        binary,
        "--configure",
        "--mtu=65520",
        "--disable-host-loopback",
        "--enable-sandbox",
        f"--ready-fd={ready_w}",
    ]
    if userns:
        argv.append(f"--userns-path=/proc/{target}/ns/user")
    try:
        out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            proc = await asyncio.create_subprocess_exec(
                *prefix,
                *argv,
                str(target),
                "tap0",
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                pass_fds=(ready_w,),
                env={"PATH": "/usr/bin:/bin", **(env or {})},
                start_new_session=True,
            )
        finally:
            os.close(out)
            os.close(ready_w)
        try:
            await _wait_ready(proc, ready_r, timeout)
        except BaseException:
            await _end(proc)
            raise
    finally:
        os.close(ready_r)
    return proc


async def _wait_ready(proc: asyncio.subprocess.Process, ready_r: int, timeout: float) -> None:
    # A byte arrives when the interface is up; EOF when slirp4netns exits first.
    loop = asyncio.get_running_loop()
    readable: asyncio.Future[None] = loop.create_future()
    loop.add_reader(ready_r, _resolve, readable)
    try:
        async with asyncio.timeout(timeout):
            await readable
    except TimeoutError:
        raise NetworkError(f"network: slirp4netns not ready after {timeout} s") from None
    finally:
        loop.remove_reader(ready_r)
    if not os.read(ready_r, 1):
        status = await proc.wait()
        raise NetworkError(f"network: slirp4netns exited with status {status} before it was ready")


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def _end(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.kill()
    await proc.wait()
