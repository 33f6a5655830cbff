"""App-wide services a handler may use through ``job.services``."""

from __future__ import annotations

from typing import Any

from prorl_async.config import ServerConfig

__all__ = ["Services"]


class Services:
    """Shared resources set up once per server (see ``app.py``'s cleanup context).

    ``pool`` is the LLM backend pool, ``runtime`` the sandbox runtime and
    ``tokenizer`` the chat tokenizer; each is ``None`` until the server sets it up.
    """

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.pool: Any = None
        self.runtime: Any = None
        self.tokenizer: Any = None
        self.metrics: Any = None
