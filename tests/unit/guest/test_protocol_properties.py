"""The frame format against anything a box could write: it ends in a frame, a clean EOF, or one ProtocolError."""

import io
import json

from hypothesis import example, given
from hypothesis import strategies as st

from quinebox.guest import protocol

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


def frames(data: bytes) -> list:
    """Every frame in `data`, until EOF or the first ProtocolError (the connection would end there)."""
    reader, out = io.BufferedReader(io.BytesIO(data)), []
    while True:
        try:
            out.append(protocol.read_frame(reader))
        except (EOFError, protocol.ProtocolError):
            return out


@given(st.binary(max_size=4096))
@example(protocol.HEADER.pack(200_000, 0) + b"[" * 100_000 + b"]" * 100_000)  # nested past the interpreter's recursion limit
@example(protocol.HEADER.pack(protocol.MAX_JSON + 1, 0))
@example(protocol.HEADER.pack(2, protocol.MAX_PAYLOAD + 1) + b"{}")
@example(protocol.HEADER.pack(10, 0) + b'{"kind"')
def test_any_bytes_end_in_frames_eof_or_one_protocol_error(data):
    for message, payload in frames(data):
        assert isinstance(message, dict) and isinstance(message["kind"], str) and isinstance(payload, bytes)


@given(st.dictionaries(st.text(max_size=8), JSON, max_size=6), st.text(max_size=20), st.binary(max_size=2048))
def test_what_is_encoded_is_read_back_exactly(fields, kind, payload):
    message = {**fields, "kind": kind}
    [(read, data)] = frames(protocol.encode(message, payload))
    assert read == json.loads(json.dumps(message)) and data == payload


@given(st.lists(st.tuples(st.dictionaries(st.text(max_size=8), JSON, max_size=3), st.binary(max_size=64)), max_size=10), st.integers(min_value=0))
def test_a_truncated_stream_yields_a_prefix_of_its_frames(messages, cut):
    encoded = [protocol.encode({**fields, "kind": "k"}, payload) for fields, payload in messages]
    stream = b"".join(encoded)
    cut = cut % (len(stream) + 1)
    complete, end = 0, 0
    for size in map(len, encoded):
        if end + size > cut:
            break
        end, complete = end + size, complete + 1
    assert len(frames(stream[:cut])) == complete
