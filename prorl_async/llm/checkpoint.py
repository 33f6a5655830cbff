"""Whether a checkpoint directory can be loaded in place on the engines (checked before
anything is paused, where this server can read the files)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["checkpoint_problem"]

# Architecture fields a checkpoint must share with what an engine serves.
_SHAPE = (
    "model_type",
    "architectures",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "tie_word_embeddings",
)


def _config(directory: str) -> dict[str, Any] | None:
    try:
        data = json.loads((Path(directory) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def checkpoint_problem(path: str, serving: dict[str, str | None]) -> str | None:
    """Why ``path`` cannot be loaded on these backends (address -> the checkpoint each
    serves), or ``None``. Checked where this server can read the files."""
    directory = Path(path)
    if not directory.is_dir():
        return f"path: no such directory: {path}"
    new = _config(path)
    if new is None:
        return f"path: {path} has no readable config.json (not a model checkpoint)"
    if not any(directory.glob("*.safetensors")) and not any(directory.glob("*.bin")):
        return f"path: {path} has no weight files (*.safetensors or *.bin)"
    for address, current in serving.items():
        old = _config(current) if current else None
        if old is None:
            continue  # not readable from here: the engine will check
        for key in _SHAPE:
            if old.get(key) != new.get(key):
                return (
                    f"path: {path} does not fit backend {address}: {key} is "
                    f"{new.get(key)!r} there, {old.get(key)!r} in what it serves ({current})"
                )
    return None
