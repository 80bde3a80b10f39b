"""The frame format both sides import: round trips, and every way a peer can send garbage."""

import io
import struct

import pytest

from quinebox.guest.protocol import HEADER, MAX_JSON, MAX_PAYLOAD, ProtocolError, encode, read_frame


@pytest.mark.parametrize(
    "message, payload",
    [
        ({"kind": "hello"}, b""),
        ({"kind": "chat", "messages": [{"role": "user", "content": "ünïcödé ✓"}]}, b""),
        ({"kind": "data", "stream": 1}, b"\x00\x01\xff" * 1000),
        ({"kind": "x", "nested": {"a": [1, 2, None, True]}}, b""),
    ],
)
def test_round_trip(message, payload):
    assert read_frame(io.BytesIO(encode(message, payload))) == (message, payload)


def test_frames_follow_each_other_on_one_stream():
    stream = io.BytesIO(encode({"kind": "a"}) + encode({"kind": "b"}, b"p"))
    assert read_frame(stream) == ({"kind": "a"}, b"")
    assert read_frame(stream) == ({"kind": "b"}, b"p")
    with pytest.raises(EOFError):
        read_frame(stream)


def frame(body: bytes, payload: bytes = b"", body_len: int | None = None, payload_len: int | None = None) -> bytes:
    return HEADER.pack(len(body) if body_len is None else body_len, len(payload) if payload_len is None else payload_len) + body + payload


@pytest.mark.parametrize(
    "data, words",
    [
        (b"\x00\x00\x00", "truncated frame header"),
        (frame(b"", body_len=MAX_JSON + 1), "over the limit"),
        (frame(b"{}", payload_len=MAX_PAYLOAD + 1), "over the limit"),
        (struct.pack(">II", 0xFFFFFFFF, 0xFFFFFFFF), "over the limit"),
        (frame(b'{"kind": "a"}', body_len=100), "truncated frame body"),
        (frame(b"not json"), "not JSON"),
        (frame(b"\xff\xfe"), "not JSON"),
        (frame(b"[1, 2]"), "string 'kind'"),
        (frame(b'"hello"'), "string 'kind'"),
        (frame(b'{"kind": 5}'), "string 'kind'"),
        (frame(b'{"no": "kind"}'), "string 'kind'"),
        (frame(b'{"kind": "a"}', b"xy", payload_len=10), "truncated frame payload"),
    ],
)
def test_garbage_is_refused_with_a_reason(data, words):
    with pytest.raises(ProtocolError, match=words):
        read_frame(io.BytesIO(data))


def test_encode_refuses_what_the_peer_would_refuse():
    with pytest.raises(ProtocolError):
        encode({"kind": "x"}, b"\x00" * (MAX_PAYLOAD + 1))
