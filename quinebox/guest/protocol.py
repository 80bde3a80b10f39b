"""Frames between a box and its host, imported by both sides so they agree by construction.

A frame is an 8-byte header (JSON length, payload length; big-endian), a JSON
object with at least a string `kind`, and an optional binary payload. Both
lengths are capped before anything is read, so a hostile peer can make us
refuse a frame but never make us allocate without bound.

Guest → host kinds: hello, chat, event, revise, restore_world, spawn, killed (the init's). Host → guest:
welcome, chat_result, revised, world_plan and world_data, noted, error.
Stdlib only: this file runs inside untrusted boxes.
"""

import json
import struct

HEADER = struct.Struct(">II")
MAX_JSON = 8 << 20
MAX_PAYLOAD = 1 << 20


class ProtocolError(Exception):
    """The peer sent something that is not a valid frame; the connection cannot continue."""


def encode(message, payload=b""):
    body = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()
    if len(body) > MAX_JSON or len(payload) > MAX_PAYLOAD:
        raise ProtocolError(f"frame too large ({len(body)} + {len(payload)} bytes)")
    return HEADER.pack(len(body), len(payload)) + body + payload


def _read_exact(reader, size):
    data = reader.read(size)
    if len(data) < size:
        raise EOFError
    return data


def read_frame(reader):
    """Next (message, payload) from a buffered binary reader; EOFError at a clean end."""
    header = reader.read(HEADER.size)
    if not header:
        raise EOFError
    if len(header) < HEADER.size:
        raise ProtocolError("truncated frame header")
    body_len, payload_len = HEADER.unpack(header)
    if body_len > MAX_JSON or payload_len > MAX_PAYLOAD:
        raise ProtocolError(f"frame of {body_len} + {payload_len} bytes is over the limit ({MAX_JSON} + {MAX_PAYLOAD})")
    try:
        message = json.loads(_read_exact(reader, body_len))
    except EOFError:
        raise ProtocolError("truncated frame body") from None
    except ValueError as exc:
        raise ProtocolError(f"frame is not JSON: {exc}") from None
    except RecursionError:
        raise ProtocolError("frame is nested too deeply") from None
    if not isinstance(message, dict) or not isinstance(message.get("kind"), str):
        raise ProtocolError("frame must be a JSON object with a string 'kind'")
    try:
        payload = _read_exact(reader, payload_len) if payload_len else b""
    except EOFError:
        raise ProtocolError("truncated frame payload") from None
    return message, payload
