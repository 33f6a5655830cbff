"""App-wide services a handler may use through ``job.services``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prorl_async.config import ServerConfig

if TYPE_CHECKING:
    from prorl_async.backends import BackendPool
    from prorl_async.metrics import Metrics
    from prorl_async.sandbox import Runtime
    from prorl_async.tokenizer import ChatTokenizer

__all__ = ["Services"]


class Services:
    """Shared resources set up once per server (see ``setup.open_services``).

    ``pool`` is the LLM backend pool, ``runtime`` the sandbox runtime and
    ``tokenizer`` the chat tokenizer; each is ``None`` until the server sets it up.
    """

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.pool: BackendPool | None = None
        self.runtime: Runtime | None = None
        self.tokenizer: ChatTokenizer | None = None
        self.metrics: Metrics | None = None
