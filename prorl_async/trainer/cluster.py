"""Read the Slurm launcher's ``cluster.json``: which rollout servers to use."""

from __future__ import annotations

from pathlib import Path

import msgspec

__all__ = ["ClusterFile", "ClusterServer", "load_cluster"]


class ClusterServer(msgspec.Struct):
    url: str
    node: str = ""


class ClusterLLM(msgspec.Struct):
    address: str
    node: str = ""


# Unknown fields are allowed: the launcher may add keys this reader does not need.
class ClusterFile(msgspec.Struct):
    servers: list[ClusterServer]
    slurm_job_id: str = ""
    llms: list[ClusterLLM] = msgspec.field(default_factory=list)
    assignment: dict[str, list[str]] = msgspec.field(default_factory=dict)


def load_cluster(path: str | Path) -> ClusterFile:
    """Parse ``path``; a missing file or a bad field raises ``ValueError`` naming it."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"cluster file {path}: {exc.strerror or exc}") from None
    try:
        cluster = msgspec.json.decode(raw, type=ClusterFile)
    except msgspec.DecodeError as exc:
        raise ValueError(f"cluster file {path}: {exc}") from None
    if not cluster.servers:
        raise ValueError(f"cluster file {path}: 'servers' is empty")
    return cluster
