"""SWE-ReX's runtime in a quinebox box: `QuineboxDeployment` runs the real `swerex-remote`, driven by SWE-ReX's own
`RemoteRuntime` (sessions, actions, commands, files, uploads), reachable by its caller alone, leaving nothing.

Each step is its own `asyncio.run`, as SWE-agent calls the runtime: the relay must outlive the loop that started it.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import statistics
import subprocess
import sys
import time

import aiohttp
import pytest
from swerex.exceptions import DeploymentNotStartedError
from swerex.runtime.abstract import BashAction, Command, CreateBashSessionRequest, ReadFileRequest, UploadRequest, WriteFileRequest

from quinebox import QuineboxError
from quinebox.integrations.swerex import QuineboxDeployment, QuineboxDeploymentConfig


def run(coroutine, timeout: float = 120):
    return asyncio.run(asyncio.wait_for(coroutine, timeout))


@pytest.fixture(scope="module")
def deployment():
    made = QuineboxDeploymentConfig(grants=["mem:1g"]).get_deployment()
    began = time.monotonic()
    run(made.start())  # the first run on a machine installs SWE-ReX for the box's Python (~10-25 s), later ones find it
    print(f"\nswe-rex: deployment started in {time.monotonic() - began:.2f} s (a state dir's first box unpacks its image)")
    yield made
    run(made.stop())


def request(port: int, path: str, body: dict, headers: dict[str, str]) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json", **headers})
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


def boxes() -> set[str]:
    """The ids `quinebox box ls` lists: this user's living boxes."""
    listed = subprocess.run([sys.executable, "-m", "quinebox", "box", "ls"], capture_output=True, text=True, timeout=60, check=True)
    return {line.split()[0] for line in listed.stdout.splitlines()[1:] if line.strip()}


def test_a_bash_session_commands_and_files_through_the_runtime(deployment, tmp_path):
    runtime = deployment.runtime
    assert run(deployment.is_alive()).is_alive
    run(runtime.create_session(CreateBashSessionRequest()))
    said = run(runtime.run_in_session(BashAction(command="cd /tmp && export GREETING=hello && echo started")))
    assert (said.output, said.exit_code) == ("started\n", 0)
    said = run(runtime.run_in_session(BashAction(command='echo "$GREETING from $(pwd) as $(id -un)"')))  # the session kept its state
    assert (said.output, said.exit_code) == ("hello from /tmp as agent\n", 0)
    said = run(runtime.run_in_session(BashAction(command="ls /nonexistent", check="silent")))
    assert said.exit_code == 2 and said.output == "ls: cannot access '/nonexistent': No such file or directory\n"

    done = run(runtime.execute(Command(command=["python3", "-c", "import sys; print(6 * 7); print('e', file=sys.stderr); sys.exit(3)"])))
    assert (done.stdout, done.stderr, done.exit_code) == ("42\n", "e\n", 3)
    done = run(runtime.execute(Command(command="echo $X > out.txt && cat out.txt", shell=True, cwd="/world", env={"X": "from env", "PATH": "/usr/bin:/bin"})))
    assert (done.stdout, done.exit_code) == ("from env\n", 0)

    run(runtime.write_file(WriteFileRequest(path="/world/sub/notes.txt", content="line 1\nline 2 é\n")))
    assert run(runtime.read_file(ReadFileRequest(path="/world/sub/notes.txt"))).content == "line 1\nline 2 é\n"
    assert deployment.sandbox.read_file("/world/sub/notes.txt") == "line 1\nline 2 é\n".encode()  # the same file, seen by quinebox

    (tmp_path / "tree" / "d").mkdir(parents=True)
    (tmp_path / "tree" / "d" / "f.txt").write_bytes(b"uploaded\n")
    (tmp_path / "one.bin").write_bytes(bytes(range(256)) * 1024)
    run(runtime.upload(UploadRequest(source_path=str(tmp_path / "tree"), target_path="/world/tree")))
    run(runtime.upload(UploadRequest(source_path=str(tmp_path / "one.bin"), target_path="/world/one.bin")))
    assert deployment.sandbox.read_file("/world/tree/d/f.txt") == b"uploaded\n"
    assert deployment.sandbox.read_file("/world/one.bin") == bytes(range(256)) * 1024

    async def several():  # many connections at once, through the one relay
        return await asyncio.gather(*(runtime.execute(Command(command=["echo", str(n)])) for n in range(8)))

    assert [answer.stdout for answer in run(several())] == [f"{n}\n" for n in range(8)]


def test_large_files_both_ways_and_a_reader_that_walks_away(deployment):
    runtime, sandbox = deployment.runtime, deployment.sandbox
    big = "".join(f"{n:08d}\n" for n in range(800_000))  # 7.2 MB: past every pipe's and socket's buffer between
    run(runtime.write_file(WriteFileRequest(path="/world/big.txt", content=big)))
    assert run(runtime.read_file(ReadFileRequest(path="/world/big.txt"))).content == big
    assert sandbox.exec(["wc", "-c", "/world/big.txt"]).stdout == b"7200000 /world/big.txt\n"
    # A client that asks for it all and leaves after a few bytes: the relay stops reading the box while that
    # client is behind, and must read it again once it is gone, for everyone else.
    port, token = runtime._config.port, runtime._config.auth_token
    greedy = socket.socket()
    greedy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: the window stays small
    greedy.settimeout(30)
    greedy.connect(("127.0.0.1", port))
    body = json.dumps({"path": "/world/big.txt"}).encode()
    greedy.sendall(b"POST /read_file HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-API-Key: " + token.encode()
                   + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    assert greedy.recv(12) == b"HTTP/1.1 200"
    deadline = time.monotonic() + 30
    while not deployment._relay._slow:  # 7.2 MB cannot all fit in the buffers between: the relay must fall behind
        assert time.monotonic() < deadline, "the relay never fell behind a reader that does not read"
        time.sleep(0.01)
    greedy.close()
    assert run(runtime.execute(Command(command=["echo", "still served"])), timeout=20).stdout == "still served\n"


def test_the_box_has_no_network_and_cannot_change_the_server(deployment):
    done = run(deployment.runtime.execute(Command(command="cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '; touch /opt/quinebox-swerex/x", shell=True)))
    assert done.stdout == "lo\n"
    assert done.exit_code == 1 and "Read-only file system" in done.stderr


def test_a_connection_without_the_token_is_refused(deployment):
    port = deployment.runtime._config.port  # the relay's host port: what another local process could find
    token = deployment.runtime._config.auth_token
    probe = {"command": "touch /world/reached", "shell": True}
    assert request(port, "/execute", probe, {})[0] in (401, 403)  # FastAPI's APIKeyHeader: 403 before 0.115, 401 since
    assert request(port, "/execute", probe, {"X-API-Key": "not-" + token})[0] == 401
    assert deployment.sandbox.exec(["test", "-e", "/world/reached"]).returncode == 1  # neither ran
    status, body = request(port, "/execute", probe, {"X-API-Key": token})
    assert status == 200 and json.loads(body)["exit_code"] == 0
    assert deployment.sandbox.exec(["test", "-e", "/world/reached"]).returncode == 0


def test_swerex_remote_given_no_token_serves_no_one(deployment):
    from quinebox.integrations.swerex import BOX_DIR, SERVER, cache_root

    installed = next(path.name for path in cache_root().iterdir() if path.name.startswith("swe-rex-"))
    done = deployment.sandbox.exec(["python3", "-I", "-c", SERVER, f"{BOX_DIR}/{installed}"], input=b"\n", timeout=30)
    assert (done.returncode, done.stdout) == (1, b"")
    assert done.stderr == b"no token on stdin: swerex-remote would serve anyone\n"


def test_another_user_is_closed_before_a_byte_reaches_the_box(deployment):
    port, token = deployment.runtime._config.port, deployment.runtime._config.auth_token
    # Even holding the token: the kernel's table says whose the connecting socket is, and it is not ours.
    code = (
        "import socket,sys\n"
        "s=socket.create_connection(('127.0.0.1',int(sys.argv[1])),timeout=20)\n"
        "body=b'{\"command\":\"touch /world/other\",\"shell\":true}'\n"
        "s.sendall(b'POST /execute HTTP/1.1\\r\\nHost: x\\r\\nContent-Type: application/json\\r\\nX-API-Key: '+sys.argv[2].encode()+"
        "b'\\r\\nContent-Length: '+str(len(body)).encode()+b'\\r\\n\\r\\n'+body)\n"
        "try:\n    print(repr(s.recv(65536)))\nexcept ConnectionResetError:\n    print('reset')\n"
    )
    other = subprocess.run(["/usr/bin/python3", "-I", "-c", code, str(port), token], user=65534, group=65534, capture_output=True, text=True, timeout=60)
    assert other.returncode == 0, other.stderr
    assert other.stdout.strip() in ("b''", "reset")
    assert deployment.sandbox.exec(["test", "-e", "/world/other"]).returncode == 1


def test_a_bash_action_round_trip_against_sb_exec(deployment):
    """The figures: a BashAction and a Command through the deployment, `sb.exec` of the same box, and SWE-ReX's own
    LocalRuntime on the host (no box, no relay: what its bash session costs by itself)."""
    from swerex.runtime.local import LocalRuntime

    runtime, sandbox = deployment.runtime, deployment.sandbox

    async def timed(runtime, make, n=20):
        times = []
        for _ in range(n):
            began = time.perf_counter()
            await make(runtime)
            times.append(time.perf_counter() - began)
        return statistics.median(times) * 1000

    async def bash(runtime):
        assert (await runtime.run_in_session(BashAction(command="true", session="bench"))).exit_code == 0

    async def command(runtime):
        assert (await runtime.execute(Command(command=["true"]))).exit_code == 0

    async def figures(runtime):
        await runtime.create_session(CreateBashSessionRequest(session="bench"))
        return await timed(runtime, bash), await timed(runtime, command)

    action, executed = run(figures(runtime))
    direct = run(timed(sandbox, lambda sb: sb.aexec(["true"])))
    local_action, local_executed = run(figures(LocalRuntime()))
    print(
        f"\nswe-rex: median round trip: BashAction {action:.1f} ms (LocalRuntime on the host: {local_action:.1f} ms); "
        f"Command {executed:.1f} ms (LocalRuntime: {local_executed:.1f} ms); sb.exec {direct:.1f} ms"
    )


def test_after_stop_nothing_is_left():
    made = QuineboxDeployment()
    run(made.start())
    sandbox, port = made.sandbox, made.runtime._config.port
    assert run(made.runtime.execute(Command(command=["echo", "up"]))).stdout == "up\n"
    run(made.stop())
    assert sandbox.returncode is not None
    assert sandbox.id not in boxes()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)
    with pytest.raises(DeploymentNotStartedError):
        _ = made.runtime
    with pytest.raises(DeploymentNotStartedError):
        run(made.is_alive())
    run(made.stop())  # a second stop does nothing


def test_is_alive_says_which_part_ended():
    made = QuineboxDeployment()
    run(made.start())
    try:
        with pytest.raises(aiohttp.ClientError):  # the request's connection dies with the server it killed
            run(made.runtime.execute(Command(command="kill -9 $PPID", shell=True)))
        deadline = time.monotonic() + 20
        while not (answer := run(made.is_alive())).message.startswith("swerex-remote"):  # until the exec's end is seen
            assert not answer.is_alive and time.monotonic() < deadline, answer
        assert (answer.is_alive, answer.message) == (False, f"swerex-remote in box {made.sandbox.id} ended")
    finally:
        run(made.stop())


def test_swe_agent_s_way_root_in_a_task_image_nobody_outside(tmp_path):
    """SWE-agent runs as root: `cd /`, its tools uploaded to /root/tools and run. Root in the box, never on the host."""
    made = QuineboxDeployment(grants=["rootfs:rw"], user="root")
    run(made.start())
    try:
        runtime = made.runtime
        run(runtime.create_session(CreateBashSessionRequest(startup_timeout=10)))
        said = run(runtime.run_in_session(BashAction(command="cd / && id -u && mkdir -p /root/tools && head -1 /proc/self/uid_map")))
        root, mapped = said.output.split("\n", 1)
        assert root == "0" and mapped.split()[:1] == ["0"] and mapped.split()[1] != "0"  # uid 0 inside is another uid outside
        (tmp_path / "bundle" / "bin").mkdir(parents=True)
        (tmp_path / "bundle" / "bin" / "hello").write_text("#!/bin/sh\necho \"tool says $1\"\n")
        (tmp_path / "bundle" / "bin" / "hello").chmod(0o755)
        run(runtime.upload(UploadRequest(source_path=str(tmp_path / "bundle"), target_path="/root/tools/bundle")))
        # SWE-ReX's upload is a zip, which keeps no modes: SWE-agent makes its tools executable after, so here too.
        said = run(runtime.run_in_session(BashAction(command="chmod +x /root/tools/bundle/bin/* && export PATH=/root/tools/bundle/bin:$PATH && hello hi")))
        assert (said.output, said.exit_code) == ("tool says hi\n", 0)
    finally:
        run(made.stop())


def test_root_is_refused_in_one_line_where_the_box_has_no_user_namespace():
    made = QuineboxDeployment(backend="docker", user="root")
    with pytest.raises(QuineboxError) as refused:
        run(made.start())
    assert "\n" not in str(refused.value) and "root" in str(refused.value)
    with pytest.raises(DeploymentNotStartedError):
        _ = made.sandbox


def test_an_image_without_python_is_refused_in_one_line_and_leaves_no_box(test_images):
    made = QuineboxDeployment(image="quinebox-test/nopython:1")
    before = boxes()
    with pytest.raises(QuineboxError, match=r"cannot run swerex-remote: it needs a CPython on glibc") as refused:
        run(made.start())
    assert "\n" not in str(refused.value)
    assert boxes() == before
    with pytest.raises(DeploymentNotStartedError):
        _ = made.sandbox


def test_a_prepared_swerex_dir_is_used_as_it_is(deployment):
    del deployment  # started first: the cache holds an install to point at
    from quinebox.integrations.swerex import cache_root

    installed = next(path for path in cache_root().iterdir() if path.name.startswith("swe-rex-"))
    made = QuineboxDeployment(swerex_dir=str(installed))
    run(made.start())
    try:
        assert run(made.runtime.execute(Command(command=["echo", "prepared"]))).stdout == "prepared\n"
    finally:
        run(made.stop())


def test_a_swerex_dir_without_swerex_is_refused_in_one_line(tmp_path):
    made = QuineboxDeployment(swerex_dir=str(tmp_path))
    with pytest.raises(QuineboxError, match=r"^swerex-remote in box \w+ ended: ModuleNotFoundError: No module named '\w+'$"):
        run(made.start())
    with pytest.raises(DeploymentNotStartedError):
        _ = made.sandbox
