"""Wire protocol between a tool client and the in-sandbox tool server.

Every message is one frame: a 4-byte big-endian payload length followed by a
msgpack-encoded :class:`Request` or :class:`Response`. Requests carry an id that
the server copies into its response, so one connection can have many calls in
flight and answers may come back in any order.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import msgspec

__all__ = [
    "MAX_FRAME",
    "FrameError",
    "Request",
    "Response",
    "decode_request",
    "decode_response",
    "encode_frame",
    "read_frame",
    "request_id_of",
]

MAX_FRAME = 256 * 1024 * 1024
"""Largest payload accepted in either direction (uploads and downloads included)."""

_HEADER = struct.Struct(">I")


class FrameError(Exception):
    """A frame could not be read or decoded; the message says what was wrong."""


class Request(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One tool call: ``tool`` is the tool's name, ``args`` its arguments."""

    id: int
    tool: str
    args: dict[str, Any] = {}


class Response(msgspec.Struct, frozen=True):
    """The answer to the request with the same ``id``.

    ``output`` is the observation text (what a model would see); ``error`` is set
    when ``ok`` is false and names what went wrong; ``data`` carries structured
    results (exit codes, file bytes, ...).
    """

    id: int
    ok: bool
    output: str = ""
    error: str | None = None
    data: dict[str, Any] = {}


_encoder = msgspec.msgpack.Encoder()
_request_decoder = msgspec.msgpack.Decoder(Request)
_response_decoder = msgspec.msgpack.Decoder(Response)


def encode_frame(message: Request | Response) -> bytes:
    """Serialise ``message`` with its length prefix."""
    payload = _encoder.encode(message)
    if len(payload) > MAX_FRAME:
        raise FrameError(f"frame of {len(payload)} bytes exceeds the {MAX_FRAME}-byte limit")
    return _HEADER.pack(len(payload)) + payload


async def read_frame(reader: asyncio.StreamReader) -> bytes | None:
    """Read one frame's payload; ``None`` on a clean end of stream between frames."""
    try:
        header = await reader.readexactly(_HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise FrameError("connection closed inside a frame header") from exc
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME:
        raise FrameError(f"frame length {size} exceeds the {MAX_FRAME}-byte limit")
    try:
        return await reader.readexactly(size)
    except asyncio.IncompleteReadError as exc:
        raise FrameError(f"connection closed after {len(exc.partial)} of {size} bytes") from exc


def decode_request(payload: bytes) -> Request:
    """Decode a request payload, raising :class:`FrameError` naming the bad field."""
    try:
        return _request_decoder.decode(payload)
    except msgspec.DecodeError as exc:
        raise FrameError(f"malformed request: {exc}") from exc


def decode_response(payload: bytes) -> Response:
    """Decode a response payload, raising :class:`FrameError` naming the bad field."""
    try:
        return _response_decoder.decode(payload)
    except msgspec.DecodeError as exc:
        raise FrameError(f"malformed response: {exc}") from exc


def request_id_of(payload: bytes) -> int:
    """Best-effort id of an undecodable request, so its error reaches the right caller."""
    try:
        raw = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError:
        return 0
    if isinstance(raw, dict) and isinstance(raw.get("id"), int):
        return int(raw["id"])
    return 0
