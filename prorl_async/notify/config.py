"""The ``[callbacks]`` and ``[events]`` tables of the server configuration."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

import msgspec

__all__ = ["CallbacksConfig", "EventsConfig", "NotifyConfigError", "SECRET_ENV"]

# The environment variable that may hold the HMAC secret instead of ``secret_file``.
SECRET_ENV = "PRORL_CALLBACK_SECRET"


class NotifyConfigError(ValueError):
    """A ``[callbacks]`` or ``[events]`` value is wrong; the message names it."""


class CallbacksConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``[callbacks]``: where results may be POSTed, how they are signed and retried."""

    # Host names or fnmatch patterns ("*.cluster.local") a callback_url may name;
    # empty: callbacks are off and every callback_url is refused (422).
    allow_hosts: tuple[str, ...] = ()
    # File holding the HMAC-SHA256 secret (surrounding whitespace dropped); or set
    # PRORL_CALLBACK_SECRET. Required when allow_hosts is set.
    secret_file: str | None = None
    # The secret itself, as read from secret_file or the environment.
    secret: str | None = None
    # A delivery is retried with backoff until this long after its job ended.
    retry_for_s: float = 900.0
    # First retry delay; doubled per attempt up to max_backoff_s (with jitter).
    backoff_s: float = 1.0
    max_backoff_s: float = 60.0
    # One attempt's deadline (connect, send, answer).
    timeout_s: float = 10.0
    # Deliveries in flight at once.
    concurrency: int = 64

    @property
    def enabled(self) -> bool:
        return bool(self.allow_hosts)

    def problem(self) -> str | None:
        """What is wrong with these settings, or None."""
        for name in ("retry_for_s", "backoff_s", "max_backoff_s", "timeout_s"):
            if not getattr(self, name) > 0:
                return f"callbacks.{name} must be > 0, got {getattr(self, name)}"
        if self.concurrency < 1:
            return f"callbacks.concurrency must be >= 1, got {self.concurrency}"
        if self.allow_hosts and not self.secret:
            return (
                "callbacks.allow_hosts is set but there is no secret to sign with: "
                f"set callbacks.secret_file or {SECRET_ENV}"
            )
        return None

    def target_problem(self, url: str) -> str | None:
        """Why ``url`` may not be a callback target here, or None."""
        if not self.allow_hosts:
            return "callbacks are off on this server (no [callbacks] allow_hosts configured)"
        try:
            parts = urlsplit(url)
            host = parts.hostname
            parts.port  # noqa: B018 (raises on a bad port)
        except ValueError as exc:
            return f"not a valid URL ({exc})"
        if parts.scheme not in ("http", "https") or not host:
            return f"expected an http(s) URL with a host, got {url!r}"
        if parts.username is not None or parts.password is not None:
            return "credentials in the URL are not accepted"
        if not any(fnmatch.fnmatchcase(host, p.lower()) for p in self.allow_hosts):
            return f"host {host!r} is not in the server's callbacks.allow_hosts"
        return None

    def with_secret(self, env: Mapping[str, str]) -> CallbacksConfig:
        """These settings with ``secret`` read from ``secret_file`` or the environment."""
        if self.secret_file is not None:
            try:
                secret = Path(self.secret_file).read_text().strip()
            except (OSError, UnicodeDecodeError) as exc:
                raise NotifyConfigError(
                    f"callbacks.secret_file {self.secret_file}: {exc}"
                ) from None
            if not secret:
                raise NotifyConfigError(
                    f"callbacks.secret_file {self.secret_file}: the file is empty"
                )
            return msgspec.structs.replace(self, secret=secret)
        if self.secret is None and env.get(SECRET_ENV):
            return msgspec.structs.replace(self, secret=env[SECRET_ENV])
        return self


class EventsConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``[events]``: the ``GET /events`` stream."""

    # A comment line is sent after this many seconds without an event.
    heartbeat_s: float = 15.0
    # Unsent bytes held for one stream; beyond it the stream waits for its consumer.
    buffer_bytes: int = 256 * 1024
    # A consumer that takes nothing of a full buffer for this long is disconnected.
    stall_s: float = 30.0

    def problem(self) -> str | None:
        for name in ("heartbeat_s", "stall_s"):
            if not getattr(self, name) > 0:
                return f"events.{name} must be > 0, got {getattr(self, name)}"
        if self.buffer_bytes < 4096:
            return f"events.buffer_bytes must be >= 4096, got {self.buffer_bytes}"
        return None
