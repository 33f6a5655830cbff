"""Telling clients a job ended: the event stream's settings, and callbacks (an allowlist,
HMAC signatures, and a sender retrying with backoff from a durable outbox)."""

from prorl_async.notify.config import CallbacksConfig, EventsConfig, NotifyConfigError
from prorl_async.notify.memory import MemoryOutbox
from prorl_async.notify.sender import CallbackSender, Delivery, Outbox
from prorl_async.notify.signing import SIGNATURE_HEADER, sign, verify

__all__ = [
    "SIGNATURE_HEADER",
    "CallbackSender",
    "CallbacksConfig",
    "Delivery",
    "EventsConfig",
    "MemoryOutbox",
    "NotifyConfigError",
    "Outbox",
    "sign",
    "verify",
]
