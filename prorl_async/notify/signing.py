"""Callback signatures: ``X-Prorl-Signature: sha256=<hex HMAC-SHA256 of the body>``."""

from __future__ import annotations

import hashlib
import hmac

__all__ = ["SIGNATURE_HEADER", "sign", "verify"]

SIGNATURE_HEADER = "X-Prorl-Signature"


def sign(secret: bytes, body: bytes) -> str:
    """The signature header value of ``body``."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def verify(secret: bytes, body: bytes, header: str) -> bool:
    """Whether ``header`` is the signature of ``body`` (constant-time compare)."""
    return hmac.compare_digest(sign(secret, body).encode(), header.encode())
