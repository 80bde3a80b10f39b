"""fdpass: one frame (a length and a marshal'd dict) and the descriptors that ride with it, over real Unix sockets.

The one framing every quinebox process speaks to another: the thin client and the command server, a claimer and
the pool, a process and a box's owner. Real socket pairs, real listeners, a real process of another user."""

import _socket
import marshal
import os
import shutil
import socket
import tempfile
import threading

import pytest

from quinebox import fdpass
from quinebox.errors import StateError

NOBODY = 65534


def test_a_message_and_its_descriptors_arrive_together():
    left, right = socket.socketpair()
    read_end, write_end = os.pipe()
    with left, right:
        fdpass.send(left, {"kind": "claim", "shape": {"ünïcode": [1, 2]}, "n": None, "yes": True, "f": 0.5}, [write_end, read_end])
        message, fds = fdpass.receive(right, 2.0)
        assert message == {"kind": "claim", "shape": {"ünïcode": [1, 2]}, "n": None, "yes": True, "f": 0.5} and len(fds) == 2
        os.write(fds[0], b"through the passed descriptor")
        assert os.read(read_end, 100) == b"through the passed descriptor"
    for fd in (read_end, write_end, *fds):
        os.close(fd)


def test_a_tuple_arrives_as_a_list_as_json_carried_it():
    """Receivers check for lists (a shape's mounts, an exec's argv): a sender's tuple must not make a frame theirs refuse."""
    left, right = socket.socketpair()
    with left, right:
        fdpass.send(left, {"argv": ("ls", "-l"), "deep": {"owner": (0, 0), "mounts": [({"Source": "/x"},)]}})
        message, _ = fdpass.receive(right, 2.0)
    assert message == {"argv": ["ls", "-l"], "deep": {"owner": [0, 0], "mounts": [[{"Source": "/x"}]]}}
    assert type(message["argv"]) is list and type(message["deep"]["owner"]) is list


def test_the_most_descriptors_a_frame_carries_all_arrive():
    """The thin client's stdio and terminal, and the client's connection with them to a spare worker: five."""
    left, right = socket.socketpair()
    pipes = [os.pipe() for _ in range(fdpass.MAX_FDS)]
    with left, right:
        fdpass.send(left, {"kind": "run"}, [w for _, w in pipes])
        message, fds = fdpass.receive(right, 2.0)
    assert message == {"kind": "run"} and len(fds) == fdpass.MAX_FDS == 5
    for fd, (r, _) in zip(fds, pipes, strict=True):
        os.write(fd, b"x")
        assert os.read(r, 1) == b"x"
    for fd in (*fds, *(fd for pipe in pipes for fd in pipe)):
        os.close(fd)


def frame(body: bytes, length: int | None = None) -> bytes:
    return (len(body) if length is None else length).to_bytes(4, "big") + body


@pytest.mark.parametrize(
    "junk",
    [
        frame(b"not marshal"),
        frame(marshal.dumps([1, 2])),
        frame(marshal.dumps("a string")),
        frame(b""),
        frame(b"x", length=fdpass.MAX_FRAME + 1),
        frame(marshal.dumps({"kind": "run"}), length=100),  # cut short by the peer's end
        b"\x00\x00",  # not even a whole length
        b"",
    ],
    ids=["not-marshal", "a-list", "a-string", "empty", "too-big", "cut-short", "half-a-length", "nothing"],
)
def test_what_is_not_a_frame_of_a_dict_is_an_empty_message(junk):
    left, right = socket.socketpair()
    with left, right:
        left.sendall(junk)
        left.shutdown(socket.SHUT_WR)
        assert fdpass.receive(right, 2.0) == ({}, [])


def test_a_peer_that_says_nothing_times_out_and_nothing_is_there_to_connect_to(tmp_path):
    left, right = socket.socketpair()
    with left, right, pytest.raises(TimeoutError):
        fdpass.receive(right, 0.2)
    assert right.gettimeout() is None  # the socket is left blocking, as it came
    assert fdpass.connect(str(tmp_path / "nobody.sock")) is None
    assert fdpass.ask(str(tmp_path / "nobody.sock"), {"kind": "status"}, 1) is None


def test_a_long_message_arrives_whole():
    left, right = socket.socketpair()
    big = {"kind": "claim", "shape": "x" * 500_000}
    with left, right:
        sender = threading.Thread(target=fdpass.send, args=(left, big))
        sender.start()
        assert fdpass.receive(right, 5.0) == (big, [])
        sender.join()


@pytest.mark.parametrize("kind", [None, _socket.socket], ids=["socket", "_socket"])
def test_one_connect_for_servers_and_the_thin_client_and_an_ask_answered(tmp_path, kind):
    """The thin client connects with `_socket.socket` (no socket module on its path), everyone else with socket.socket;
    both speak the same frames to a server made by `listen`."""
    path = str(tmp_path / "s.sock")
    listener = fdpass.listen(path, mode=0o600, backlog=1)
    listener.settimeout(10)  # a connect that never comes fails the test, never hangs it

    def serve():
        conn, _ = listener.accept()
        with conn:
            message, _ = fdpass.receive(conn, 5.0)
            fdpass.send(conn, {"kind": "answer", "to": message.get("kind")})

    for _ in range(2):
        server = threading.Thread(target=serve, daemon=True)
        server.start()
        conn = fdpass.connect(path) if kind is None else fdpass.connect(path, kind)
        assert type(conn) is (socket.socket if kind is None else _socket.socket)
        fdpass.send(conn, {"kind": "hello"})
        assert fdpass.receive(conn, 5.0) == ({"kind": "answer", "to": "hello"}, [])
        conn.close()
        server.join()
    server = threading.Thread(target=serve, daemon=True)
    server.start()
    assert fdpass.ask(path, {"kind": "status"}, 5.0) == {"kind": "answer", "to": "status"}
    server.join()
    listener.close()


@pytest.mark.root_only  # becomes another user
def test_a_socket_another_user_answers_on_is_refused_in_one_line_and_sent_nothing():
    """SO_PEERCRED is read before a byte is sent: a process of another user listening where ours should gets nothing,
    and the caller is told in one line (fdpass's connect said None, as if nothing answered, to all but the thin client)."""
    where = tempfile.mkdtemp(prefix="quinebox-fdpass-")  # pytest's own tmp dirs are root's alone: nobody could not bind there
    os.chmod(where, 0o777)
    path = os.path.join(where, "theirs.sock")
    ready_r, ready_w = os.pipe()
    got_r, got_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the other user's process: it listens, accepts one connection and says how many bytes it got
        try:
            os.close(ready_r)
            os.close(got_r)
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            listener = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
            listener.bind(path)
            listener.listen(4)
            listener.settimeout(10)  # a caller that never connects (or never refuses) fails the test, never hangs it
            os.write(ready_w, b"1")
            for _ in range(2):
                fd, _ = listener._accept()
                conn = _socket.socket(fileno=fd)
                conn.settimeout(2.0)
                try:
                    data = conn.recv(100)
                except OSError:
                    data = b""
                os.write(got_w, str(len(data)).encode() + b"\n")
                conn.close()
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(got_w)
    try:
        assert os.read(ready_r, 1) == b"1"
        for call in (lambda: fdpass.connect(path), lambda: fdpass.ask(path, {"kind": "status"}, 2)):
            with pytest.raises(StateError) as refused:
                call()
            said = str(refused.value)
            assert "\n" not in said and f"answers as uid {NOBODY}, not as you (uid 0), and was sent nothing" in said, said
        with os.fdopen(got_r) as got:
            assert got.read().split() == ["0", "0"]  # connected to (that is how its uid was read), and sent nothing
    finally:
        os.waitpid(pid, 0)
        shutil.rmtree(where)
