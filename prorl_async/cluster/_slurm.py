"""Small wrappers over Slurm's ``scontrol``: a node's address, a node list's names."""

from __future__ import annotations

import subprocess

__all__ = ["SlurmError", "node_addr"]


class SlurmError(RuntimeError):
    """A Slurm command failed or answered something unexpected."""


def _scontrol(*args: str) -> str:
    try:
        done = subprocess.run(
            ["scontrol", *args], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmError(f"scontrol {' '.join(args)}: {exc}") from exc
    if done.returncode != 0:
        raise SlurmError(f"scontrol {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def node_addr(node: str) -> str:
    """The node's ``NodeAddr`` (what other nodes reach it by), not its ``hostname``."""
    for field in _scontrol("-o", "show", "node", node).split():
        if field.startswith("NodeAddr="):
            return field.split("=", 1)[1]
    raise SlurmError(f"scontrol show node {node}: no NodeAddr field")
