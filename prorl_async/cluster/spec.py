"""The cluster document (``cluster.json``) the Slurm launcher writes and trainers read.

``{"slurm_job_id": str, "servers": [{"url", "node"}], "llms": [{"address", "node"}],
"assignment": {server_url: [llm address, ...]}}``.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

__all__ = ["ClusterSpec", "LLMEntry", "ServerEntry", "dump_spec", "load_spec"]


class ServerEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One rollout server: its base URL and the Slurm node it runs on."""

    url: str
    node: str


class LLMEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One LLM backend: its OpenAI-style base address (``http://host:port/v1``) and node."""

    address: str
    node: str


class ClusterSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Servers, LLM backends and which server uses which backends."""

    servers: list[ServerEntry]
    llms: list[LLMEntry] = msgspec.field(default_factory=list)
    assignment: dict[str, list[str]] = msgspec.field(default_factory=dict)
    slurm_job_id: str = ""


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(ClusterSpec)


def load_spec(raw: bytes | str, *, source: str = "cluster document") -> ClusterSpec:
    """Parse a cluster document; a ``ValueError`` names what was wrong and where."""
    try:
        return _decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise ValueError(f"{source}: {exc}") from exc


def dump_spec(spec: ClusterSpec, path: str | Path | None = None) -> bytes:
    """Encode ``spec`` (indented); written atomically to ``path`` when given."""
    data = msgspec.json.format(_encoder.encode(spec), indent=2) + b"\n"
    if path is not None:
        target = Path(path)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_bytes(data)
        tmp.replace(target)
    return data
