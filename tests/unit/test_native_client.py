"""The native thin client (bin/quinebox.c), built here with the machine's C compiler, against a command server of the
test's own on a Unix socket in a state dir of its own: it sends exactly the frame and descriptors client.py sends,
forwards the same signals, exits with what the server answers as client.py does, and hands every other case to the
Python client unchanged (here a script standing in for it, which says what it was given).

scripts/setup.sh builds the same source as the venv's `quinebox`; the serve pass runs the CLI's tests through it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from quinebox import fdpass
from quinebox.state import SERVE_SOCKET

REPO = Path(__file__).resolve().parents[2]
#: Stands in for the Python client the native one execs: says its argv and QUINEBOX_HANDED, exits 42.
STAND_IN = "import json, os, sys\nprint(json.dumps({'argv': sys.argv[1:], 'handed': os.environ.get('QUINEBOX_HANDED')}))\nsys.exit(42)\n"


@pytest.fixture(scope="module")
def native(tmp_path_factory) -> Path:
    """bin/quinebox.c built as setup.sh builds it, its Python client the stand-in."""
    here = tmp_path_factory.mktemp("native")
    (here / "stand_in.py").write_text(STAND_IN)
    compiler = shutil.which("cc")
    assert compiler, "no C compiler: scripts/setup.sh builds the native client with cc (apt-get install gcc)"
    subprocess.run([compiler, "-O2", "-Wall", "-Wextra", "-Werror", f'-DQB_PYTHON="{sys.executable}"', f'-DQB_SCRIPT="{here / "stand_in.py"}"',
                    "-o", str(here / "quinebox"), str(REPO / "bin" / "quinebox.c")], check=True, timeout=120)
    return here / "quinebox"


PYTHON_CLIENT = [sys.executable, str(REPO / "bin" / "quinebox")]


class Server:
    """A listening socket where the state dir's command server listens; each connection answered by `answer`."""

    def __init__(self, state: Path):
        (state / "run").mkdir(parents=True, mode=0o700)
        state.chmod(0o700)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(state / "run" / SERVE_SOCKET))
        self.listener.listen(4)
        self.got: list[tuple[dict, list[os.stat_result]]] = []
        self.signals: list[int] = []

    def serve(self, answers: list, *, then=None) -> threading.Thread:
        """Answer one connection: read its run frame (kept with its descriptors' stat), call `then` (a test's step),
        send `answers` (dicts as frames, bytes as raw frames), read any signal frames until the client is gone."""

        def run() -> None:
            self.listener.settimeout(30)
            conn, _ = self.listener.accept()
            with conn:
                message, fds = fdpass.receive(conn, 30)
                self.got.append((message, [os.fstat(fd) for fd in fds]))
                for fd in fds:
                    os.close(fd)
                if then is not None:
                    then(conn)
                for answer in answers:
                    if isinstance(answer, bytes):
                        conn.sendall(len(answer).to_bytes(4, "big") + answer)
                    else:
                        fdpass.send(conn, answer)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def state(tmp_path) -> Path:
    return tmp_path / "state"


@pytest.fixture
def server(state):
    made = Server(state)
    yield made
    made.close()


def client(cmd: list[str], state: Path, tmp_path: Path, extra: dict | None = None, **kwargs) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "QUINEBOX_STATE_DIR": str(state), "GREETING": "héllo ✓", **(extra or {})}
    return subprocess.run(cmd, env=env, capture_output=True, timeout=60, cwd=tmp_path, **kwargs)


def test_it_sends_what_the_python_client_sends_with_its_stdio_and_exits_with_the_status(native, server, state, tmp_path):
    argv = ["exec", "-g", "net:none", "--", "sh", "-c", "echo 'é'; exit 3"]
    stdin = tmp_path / "in"
    stdin.write_bytes(b"material\n")
    for cmd in ([str(native)], PYTHON_CLIENT):
        thread = server.serve([{"kind": "exit", "code": 7}])
        with stdin.open("rb") as given:
            done = client([*cmd, *argv], state, tmp_path, stdin=given, umask=0o027)
        thread.join(30)
        assert (done.returncode, done.stdout, done.stderr) == (7, b"", b""), (cmd, done)
        message, fds = server.got[-1]
        assert fds[0].st_ino == stdin.stat().st_ino and len(fds) in (3, 4)  # and /dev/tty, where the runner has one
        if len(fds) == 4:
            assert os.path.samestat(fds[3], os.stat("/dev/tty"))
    (native_said, _), (python_said, _) = server.got
    # The environment as given: Python's own start adds LC_CTYPE under the C locale (PEP 538), which the Python client
    # then passes on as if it had been given.
    given = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "QUINEBOX_STATE_DIR": str(state), "GREETING": "héllo ✓"}
    assert native_said["env"] == given and {k: v for k, v in python_said["env"].items() if k != "LC_CTYPE"} == given
    assert {**native_said, "env": None} == {**python_said, "env": None}
    assert (native_said["kind"], native_said["argv"], native_said["cwd"], native_said["umask"]) == ("run", argv, str(tmp_path), 0o027)


GONE = b"quinebox: the command server's worker for this command is gone (`quinebox serve status`); run again\n"


@pytest.mark.parametrize(
    "answers, code, said",
    [
        ([{"kind": "exit", "code": 0}], 0, b""),
        ([{"kind": "exit", "code": 300}], 300 & 0xFF, b""),
        ([{"kind": "news", "detail": [1, 2.5, None, ("a", b"b")], "more": {"x": True}}, {"kind": "exit", "code": 5}], 5, b""),
        ([{"kind": "exit"}], 125, b""),
        ([], 125, GONE),
        ([{}], 125, GONE),
        ([b"\x00not marshal"], 125, GONE),
        ([b"{" + b"\x00" * 3], 125, GONE),
    ],
    ids=["exit 0", "exit 300", "other kinds skipped", "no code", "server gone", "empty dict", "not marshal", "cut short"],
)
def test_each_answer_is_taken_as_the_python_client_takes_it(native, server, state, tmp_path, answers, code, said):
    for cmd in ([str(native)], PYTHON_CLIENT):
        thread = server.serve(answers)
        done = client([*cmd, "exec", "--", "true"], state, tmp_path, stdin=subprocess.DEVNULL)
        thread.join(30)
        assert (done.returncode, done.stderr) == (code, said), (cmd, done)


@pytest.mark.parametrize("why", ["stale", "confined"])
def test_a_command_handed_back_goes_to_the_python_client_with_why(native, server, state, tmp_path, why):
    thread = server.serve([{"kind": why}])
    done = client([str(native), "run", "-m", "script:x.yaml", "go"], state, tmp_path, stdin=subprocess.DEVNULL)
    thread.join(30)
    assert done.returncode == 42, done
    assert json.loads(done.stdout) == {"argv": ["run", "-m", "script:x.yaml", "go"], "handed": why}


def test_its_signals_go_to_the_server_and_one_it_died_of_is_128_plus_it(native, server, state, tmp_path):
    told = threading.Event()

    def then(conn) -> None:
        told.set()
        for _ in range(2):  # SIGWINCH, then SIGTERM; the client's end after that
            message, _ = fdpass.receive(conn, 30)
            server.signals.append(message.get("signal"))

    thread = server.serve([], then=then)
    env = {"PATH": os.environ["PATH"], "QUINEBOX_STATE_DIR": str(state)}
    proc = subprocess.Popen([str(native), "exec", "--", "sleep", "60"], env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert told.wait(30)
        catching = lambda: int(next(line for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines() if line.startswith("SigCgt:")).split()[1], 16)  # noqa: E731
        while not catching() >> (signal.SIGWINCH - 1) & 1:  # its handlers are set just after its frame is sent
            thread.join(0.01)
        proc.send_signal(signal.SIGWINCH)
        while len(server.signals) < 1 and thread.is_alive():
            thread.join(0.05)
        proc.send_signal(signal.SIGTERM)
        thread.join(30)
        assert proc.wait(30) == 128 + signal.SIGTERM  # the server closed without an exit: it died of what we passed on
    finally:
        proc.kill()
        proc.wait()
    assert server.signals == [signal.SIGWINCH, signal.SIGTERM]
    assert proc.stderr.read() == b""


def accepted_none(server: Server) -> bool:
    server.listener.setblocking(False)
    try:
        server.listener.accept()[0].close()
    except BlockingIOError:
        return True
    return False


@pytest.mark.parametrize(
    "argv, extra",
    [
        (["ps"], {}),
        (["exec", "--", "true"], {"QUINEBOX_SERVE": "off"}),
        (["exec", "--", "true"], {"QUINEBOX_SERVE": "sometimes"}),
        (["exec", "--", "true"], {"QUINEBOX_STATE_DIR": "relative/state"}),
        (["exec", "--", "true"], {"QUINEBOX_HANDED": "stale"}),
        (["exec", "--", "echo", "\udcff"], {}),
    ],
    ids=["not a served command", "mode off", "a mode to refuse", "a relative state dir", "handed back already", "not UTF-8"],
)
def test_everything_else_is_the_python_clients_with_argv_unchanged_and_the_server_sent_nothing(native, server, state, tmp_path, argv, extra):
    raw = [os.fsencode(word) for word in argv]
    done = client([os.fsencode(str(native)), *raw], state, tmp_path, extra, stdin=subprocess.DEVNULL)
    assert done.returncode == 42, done
    assert json.loads(done.stdout)["argv"] == argv
    assert accepted_none(server)


def test_a_state_dir_others_may_write_or_no_server_is_the_python_clients(native, state, tmp_path):
    state.mkdir(mode=0o700)
    done = client([str(native), "exec", "--", "true"], state, tmp_path, stdin=subprocess.DEVNULL)  # no run dir: no server
    assert (done.returncode, json.loads(done.stdout)) == (42, {"argv": ["exec", "--", "true"], "handed": None})
    made = Server(state)
    try:
        state.chmod(0o770)
        done = client([str(native), "exec", "--", "true"], state, tmp_path, stdin=subprocess.DEVNULL)
        assert done.returncode == 42 and accepted_none(made)  # the Python client refuses it in one line
    finally:
        made.close()


def test_built_as_setup_builds_it_the_real_python_client_takes_over(tmp_path):
    """With setup.sh's names: the Python client beside it as quinebox-py (a quinebox.py there would be imported as the
    quinebox package itself, its directory first on the import path), which says what is wrong as ever."""
    shutil.copy(REPO / "bin" / "quinebox", tmp_path / "quinebox-py")
    subprocess.run(["cc", "-O2", f'-DQB_PYTHON="{sys.executable}"', f'-DQB_SCRIPT="{tmp_path / "quinebox-py"}"', "-o", str(tmp_path / "quinebox"),
                    str(REPO / "bin" / "quinebox.c")], check=True, timeout=120)
    done = subprocess.run([str(tmp_path / "quinebox"), "exce", "--", "true"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "No such command 'exce'" in done.stderr and done.stderr.startswith("Usage: quinebox [OPTIONS]"), done.stderr
