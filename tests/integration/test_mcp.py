"""`quinebox mcp`, spoken to with the MCP SDK's own client: in memory, over a real stdio subprocess, and over HTTP on
loopback. Real boxes throughout; the server's grants are the ceiling of every box, and what a client sends is hostile."""

import base64
import io
import json
import os
import re
import signal
import subprocess
import tarfile
import time
import urllib.error
import urllib.request

import anyio
import pytest
from commands import QUINEBOX
from live_boxes import live_boxes

pytest.importorskip("mcp")

from mcp import Client, StdioServerParameters

from quinebox.audit.log import AuditLog
from quinebox.box.policy import LABEL_SESSION
from quinebox.integrations.mcp_server import QuineboxMCP


def run(target, body, within: float = 120):
    """`body(client)` with the SDK's client connected to `target` (a server in memory, stdio parameters, a transport)."""

    async def go():
        with anyio.fail_after(within):
            async with Client(target) as client:
                return await body(client)

    try:
        return anyio.run(go)
    except BaseExceptionGroup as group:  # the SDK's task groups wrap what the body raised: the first is the one to see
        while isinstance(group, BaseExceptionGroup):
            group = group.exceptions[0]
        raise group from None


async def call(client, name, args=None):
    """A tool's result: (its structured content, or None for an error; its text)."""
    result = await client.call_tool(name, args or {})
    text = "".join(getattr(c, "text", "") for c in result.content)
    return (None if result.is_error else result.structured_content), text


async def ok(client, name, args=None):
    data, text = await call(client, name, args)
    assert data is not None, f"{name} failed: {text}"
    return data


async def refused(client, name, args, *words):
    data, text = await call(client, name, args)
    assert data is None, f"{name} {args} should have failed, answered {text[:300]}"
    assert "\n" not in text and all(w in text for w in words), text
    return text


def boxes_of(engine, session):
    return [b for b in live_boxes(engine, f"{LABEL_SESSION}={session}") if b.status == "running"]


def gone(engine, session, within=8.0):
    until = time.monotonic() + within
    while boxes_of(engine, session) and time.monotonic() < until:
        time.sleep(0.1)
    return not boxes_of(engine, session)


@pytest.fixture(scope="module")
def granted(tmp_path_factory):
    path = tmp_path_factory.mktemp("mcp-granted")
    (path / "inside.txt").write_text("granted file\n")
    (path / "ro").mkdir()
    for made in (path, path / "ro", path / "inside.txt"):  # the box's user is not this one (uid 1000 when the tests run as root)
        made.chmod(0o777 if made.is_dir() else 0o666)
    return path


@pytest.fixture(scope="module")
def server(granted):
    srv = QuineboxMCP([f"rw:{granted}", "mem:512m", "pids:128"])
    yield srv
    srv.close()


def test_tools_make_a_box_run_in_it_and_edit_its_files(engine, server, granted):
    async def body(c):
        names = {t.name for t in (await c.list_tools()).tools}
        assert names >= {"create_sandbox", "list_sandboxes", "remove_sandbox", "exec", "read_file", "write_file", "edit_file", "list_files",
                         "world_log", "world_diff", "restore_revision", "export_world", "run_mission", "fork_session"}
        made = await ok(c, "create_sandbox", {"name": "mcp-files", "grants": [f"rw:{granted}"]})
        box = made["box"]
        assert made["look"]["shell"] == f"quinebox exec --in {box} -it -- sh" and made["look"]["diff"] == f"quinebox world diff {box}"
        assert boxes_of(engine, box)
        assert {"box": box, "name": "mcp-files"}.items() <= (await ok(c, "list_sandboxes"))["boxes"][0].items()

        done = await ok(c, "exec", {"box": "mcp-files", "argv": ["sh", "-c", "echo out; echo err >&2; exit 3"]})
        assert (done["exit_code"], done["stdout"], done["stderr"]) == (3, "out\n", "err\n")
        big = await ok(c, "exec", {"box": box, "command": "head -c 200000 /dev/zero | tr '\\0' y", "max_output": 1000})
        assert big["stdout_bytes_cut"] == 199000 and big["stdout"].startswith("y" * 1000) and "[truncated: 199000 more bytes cut]" in big["stdout"]
        slow = await ok(c, "exec", {"box": box, "command": "sleep 60", "timeout": 1})
        assert (slow["exit_code"], slow["timed_out"]) == (124, True)
        fed = await ok(c, "exec", {"box": box, "argv": ["cat"], "input": "material", "env": {"X": "1"}, "cwd": "/tmp"})
        assert fed["stdout"] == "material"

        await ok(c, "write_file", {"box": box, "path": "src/app.py", "content": "print('hello')\nprint('hello')\n"})
        assert (await ok(c, "read_file", {"box": box, "path": "/world/src/app.py"}))["content"] == "print('hello')\nprint('hello')\n"
        await refused(c, "edit_file", {"box": box, "path": "src/app.py", "old_string": "hello", "new_string": "bye"}, "occurs 2 times")
        await refused(c, "edit_file", {"box": box, "path": "src/app.py", "old_string": "absent", "new_string": "x"}, "does not occur")
        edited = await ok(c, "edit_file", {"box": box, "path": "src/app.py", "old_string": "hello", "new_string": "bye", "replace_all": True})
        assert edited["replaced"] == 2
        ran = await ok(c, "exec", {"box": box, "command": "python3 /world/src/app.py"})
        assert ran["stdout"] == "bye\nbye\n"
        part = await ok(c, "read_file", {"box": box, "path": "src/app.py", "offset": 7, "limit": 3})
        assert (part["content"], part["size"], part["bytes_not_read"]) == ("bye", 26, 16)
        blob = await ok(c, "write_file", {"box": box, "path": "bin.dat", "content": base64.b64encode(b"\0\xff").decode(), "encoding": "base64"})
        assert blob["bytes"] == 2
        assert (await ok(c, "read_file", {"box": box, "path": "bin.dat", "encoding": "base64"}))["content"] == base64.b64encode(b"\0\xff").decode()
        listed = await ok(c, "list_files", {"box": box, "recursive": True})
        assert {e["path"]: e["type"] for e in listed["entries"]} == {"bin.dat": "file", "src": "dir", "src/app.py": "file"}
        # a granted host directory is the box's too
        assert (await ok(c, "read_file", {"box": box, "path": f"{granted}/inside.txt"}))["content"] == "granted file\n"
        await ok(c, "write_file", {"box": box, "path": f"{granted}/from-box.txt", "content": "made in the box"})
        assert (granted / "from-box.txt").read_text() == "made in the box"

        log = (await ok(c, "world_log", {"box": box}))["revisions"]
        assert log[0]["rev"] == 0 and any("src/app.py" in r["changed"] for r in log)
        written = next(r["rev"] for r in log if "src/app.py" in r["changed"])
        diff = await ok(c, "world_diff", {"box": box, "rev": log[-1]["rev"], "against": 0})
        assert "+print('bye')" in diff["diff"] and "A src/app.py" in diff["diff"]
        restored = await ok(c, "restore_revision", {"box": box, "rev": written})
        assert restored["world_revision"] > log[-1]["rev"]
        assert (await ok(c, "read_file", {"box": box, "path": "src/app.py"}))["content"] == "print('hello')\nprint('hello')\n"
        assert not any(e["path"] == "bin.dat" for e in (await ok(c, "list_files", {"box": box}))["entries"])

        inline = await ok(c, "export_world", {"box": box})
        with tarfile.open(fileobj=io.BytesIO(base64.b64decode(inline["tar_base64"]))) as tar:
            assert "src/app.py" in tar.getnames()
        await refused(c, "export_world", {"box": box, "max_bytes": 10}, "more than 10 bytes")
        target = granted / "out" / "world.tar"
        await ok(c, "export_world", {"box": box, "path": str(target)})
        with tarfile.open(target) as tar:
            assert "src/app.py" in tar.getnames()
        await refused(c, "export_world", {"box": box, "path": str(target)}, "exists")
        await refused(c, "export_world", {"box": box, "path": "/etc/world.tar"}, "not in a directory this server holds rw")
        os.symlink("/etc", granted / "escape")
        await refused(c, "export_world", {"box": box, "path": str(granted / "escape" / "w.tar")}, "cannot write")
        assert not os.path.exists("/etc/w.tar")

        assert (await ok(c, "remove_sandbox", {"box": box}))["removed"]
        await refused(c, "exec", {"box": box, "argv": ["true"]}, "no box")
        return box

    box = run(server.mcp, body)
    assert gone(engine, box)


def test_a_grant_beyond_the_servers_is_refused_in_one_line_and_audited(engine, server, granted, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, granted / "link-out")

    async def body(c):
        asks = [
            (["net:example.com"], "refused net:example.com"),
            (["mem:4g"], "refused mem:4g"),
            ([f"rw:{elsewhere}"], f"refused rw:{elsewhere}"),
            ([f"ro:{granted}/link-out"], f"refused ro:{elsewhere}"),  # a link in a granted directory is followed before it is checked
            ([f"rw:{granted}/../.."], "refused rw:"),
            (["syscall:ptrace"], "refused syscall:ptrace"),
            (["spawn:2", "depth:1"], "refused spawn:2"),
        ]
        for grants, words in asks:
            await refused(c, "create_sandbox", {"grants": grants}, words, "this MCP server holds")
            await refused(c, "run_mission", {"mission": "anything", "grants": grants}, words)
        await refused(c, "create_sandbox", {"grants": ["bogus:1"]}, "unknown grant")
        narrower = await ok(c, "create_sandbox", {"grants": [f"ro:{granted}/ro", "mem:128m"]})
        assert narrower["grants"] == [f"ro:{granted}/ro", "mem:128m", "pids:128"]
        await ok(c, "remove_sandbox", {"box": narrower["box"]})

    before = sum(1 for _ in AuditLog().records())
    run(server.mcp, body)
    refusals = [r for r in list(AuditLog().records())[before:] if r["kind"] == "child_refused" and r["facts"].get("by") == "mcp"]
    assert len(refusals) == 14
    assert refusals[0]["facts"]["request"] == ["net:example.com"] and refusals[0]["facts"]["tool"] == "create_sandbox"
    assert "refused net:example.com" in refusals[0]["facts"]["why"]
    audit = subprocess.run([QUINEBOX, "audit", "--json"], capture_output=True, timeout=60)
    assert b'"child_refused"' in audit.stdout and b"refused net:example.com" in audit.stdout


def test_the_servers_options_are_box_options_and_an_unknown_one_is_named():
    """The server builds one BoxOptions from what it is given (policy, image, backend, runtime, …): a misspelt option is
    refused naming it and the nearest, never dropped."""
    with pytest.raises(TypeError, match=r"unknown box option 'imgae' \(did you mean 'image'\?\)"):
        QuineboxMCP([], imgae="python:3.12-slim")
    srv = QuineboxMCP(["mem:512m"], image="python:3.12-slim", backend="oci", runtime="runc", deny=["net:example.com"])
    made = srv.options_for(srv.ceiling, None)
    assert (made.image, made.pull, made.backend, made.runtime, made.deny, made.grants) == (
        "python:3.12-slim", "missing", "oci", "runc", ("net:example.com",), ("mem:512m",))
    assert srv.options_for(srv.ceiling, "alpine:3").pull == "never"  # a client's image is never pulled for it


def test_hostile_arguments_are_tool_errors_and_the_server_goes_on(engine, server):
    async def body(c):
        box = (await ok(c, "create_sandbox"))["box"]
        await ok(c, "exec", {"box": box, "command": "ln -s /etc/passwd /world/pw; ln -s / /world/root; mkfifo /world/fifo; "
                                                    "head -c 2000000 /dev/zero > /world/big; mkdir -p /world/d"})
        for path, words in [
            ("../etc/passwd", "'..'"), ("/world/../etc/passwd", "'..'"), ("/etc/passwd", "outside"), ("/proc/self/environ", "outside"),
            ("pw", "resolves to /etc/passwd"), ("root/etc/shadow", "resolves to /etc/shadow"), ("fifo", "not a regular file"),
            ("d", "not a regular file"), ("missing", "No such file"), ("a\0b", "NUL"), ("x" * 5000, "characters"),
        ]:
            await refused(c, "read_file", {"box": box, "path": path}, words)
        await refused(c, "write_file", {"box": box, "path": "root/tmp/x", "content": "x"}, "outside")
        await refused(c, "write_file", {"box": box, "path": "/tmp/x", "content": "x"}, "outside")
        await refused(c, "edit_file", {"box": box, "path": "pw", "old_string": "root", "new_string": "toor"}, "outside")
        await refused(c, "list_files", {"box": box, "path": "root"}, "outside")
        await refused(c, "write_file", {"box": box, "path": "b64", "content": "!!", "encoding": "base64"}, "base64")
        big = await ok(c, "read_file", {"box": box, "path": "big"})
        assert big["size"] == 2000000 and big["bytes_not_read"] == 2000000 - (256 << 10)
        for args, words in [
            ({"box": box, "path": "big", "limit": 10**12}, "limit"), ({"box": box, "path": "big", "offset": -1}, "offset"),
            ({"box": box, "path": "big", "encoding": "rot13"}, "encoding"),
        ]:
            await refused(c, "read_file", args, words)
        for args, words in [
            ({"box": box, "argv": ["true"], "max_output": 10**12}, "max_output"), ({"box": box, "argv": ["true"], "max_output": -1}, "max_output"),
            ({"box": box, "argv": ["true"], "timeout": 1e9}, "timeout"), ({"box": box, "argv": ["true"], "timeout": -1}, "timeout"),
            ({"box": box, "command": "x" * (300 << 10)}, "characters"), ({"box": box, "argv": ["echo", "a\0b"]}, "NUL"),
            ({"box": box, "argv": []}, "nothing to run"), ({"box": box}, "one of them"), ({"box": box, "argv": ["a"], "command": "b"}, "one of them"),
            ({"box": box, "argv": ["true"], "env": {"A=B": "1"}}, "environment variable"), ({"box": box, "argv": ["true"], "cwd": "rel"}, "absolute"),
            ({"box": "nope", "argv": ["true"]}, "no box"), ({"box": box, "argv": ["true"], "bogus": 1}, "bogus"),
            ({"box": 123, "argv": ["true"]}, "box"), ({"box": box, "argv": "ls"}, "argv"), ({"box": box, "argv": [1, 2]}, "argv"),
        ]:
            await refused(c, "exec", args, words)
        for args, words in [
            ({"image": "../../x"}, "bad image"), ({"name": "bad name!"}, "bad name"), ({"ttl": 10**9}, "ttl"),
            ({"grants": "rw:/"}, "grants"), ({"grants": ["x"] * 300}, "too long"), ({"unknown": True}, "unknown"),
            ({"image": "quinebox-test-no-such-image:1"}, "is not on this machine, and this server pulls no image a client names"),
        ]:
            await refused(c, "create_sandbox", args, words)
        await refused(c, "world_diff", {"box": box, "rev": 999}, "no revision 999")
        await refused(c, "restore_revision", {"box": box, "rev": -3}, "rev")
        await refused(c, "fork_session", {"session": "0000", "at": 1}, "no session")
        result = await c.call_tool("no_such_tool", {})
        assert result.is_error
        # the client's mistakes changed nothing: the box and the server still answer
        assert (await ok(c, "exec", {"box": box, "argv": ["echo", "still here"]}))["stdout"] == "still here\n"
        await ok(c, "remove_sandbox", {"box": box})

    run(server.mcp, body)


def test_a_mission_runs_as_an_agent_and_its_session_forks(engine, granted, tmp_path):
    script = tmp_path / "model.yaml"
    script.write_text(json.dumps({"turns": [{"sh": "cat <&3 > /world/got; echo seen >> /world/got; cat /world/got >&4"}, {"exit": "success"}]}))
    srv = QuineboxMCP([f"rw:{granted}", "mem:512m"], model=f"script:{script}")

    async def body(c):
        box = (await ok(c, "create_sandbox"))["box"]
        await ok(c, "write_file", {"box": box, "path": "seed.txt", "content": "from the box"})
        first = await ok(c, "run_mission", {"mission": "copy the material", "input": "material\n", "from_box": box, "timeout": 120})
        assert (first["exit_code"], first["stdout"]) == (0, "material\nseen\n"), first
        assert first["look"]["show"] == f"quinebox show {first['session']}"
        session = first["session"]
        forked = await ok(c, "fork_session", {"session": session, "at": 2, "mission": "once more"})
        assert forked["exit_code"] == 0 and forked["session"] != session, forked
        await refused(c, "fork_session", {"session": session, "at": 1, "grants": ["net"]}, "refused net")
        await ok(c, "remove_sandbox", {"box": box})
        return session

    try:
        session = run(srv.mcp, body)
    finally:
        srv.close()
    world = subprocess.run([QUINEBOX, "world", "export", session], capture_output=True, timeout=60)
    with tarfile.open(fileobj=io.BytesIO(world.stdout)) as tar:
        assert {"seed.txt", "got"} <= set(tar.getnames())


def children_named(word: bytes) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except (OSError, ValueError):
            continue
        if ppid == os.getpid() and word in cmdline:
            found.append(int(pid))
    return found


def test_stdio_server_serves_and_its_kill_leaves_no_box(engine):
    params = StdioServerParameters(command=QUINEBOX, args=["mcp", "-g", "mem:256m"], env=dict(os.environ))
    made = []

    async def body(c):
        box = (await ok(c, "create_sandbox"))["box"]
        made.append(box)
        assert (await ok(c, "exec", {"box": box, "command": "echo over stdio"}))["stdout"] == "over stdio\n"
        await refused(c, "create_sandbox", {"grants": ["net"]}, "refused net")
        assert boxes_of(engine, box)
        [pid] = children_named(b"mcp")
        os.kill(pid, signal.SIGKILL)
        return box

    try:
        run(params, body, within=60)
    except BaseException as exc:
        if not made:
            raise
        assert not isinstance(exc, (KeyboardInterrupt, AssertionError)), exc
    assert made and gone(engine, made[0], within=5.0), "the box outlived its MCP server by 5 s"


def test_sigterm_with_a_command_still_running_ends_the_server_at_once_and_its_boxes(engine):
    """Spoken to line by line, as any client does: garbage on the wire is answered, and SIGTERM does not wait for a
    command that is still running (nor for the thread reading stdin)."""
    proc = subprocess.Popen([QUINEBOX, "mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def send(message):
        proc.stdin.write(message if isinstance(message, bytes) else json.dumps(message).encode() + b"\n")
        proc.stdin.flush()

    def answer(id):
        while True:
            message = json.loads(proc.stdout.readline())
            if message.get("id") == id:
                return message

    try:
        send({"jsonrpc": "2.0", "id": 0, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}})
        assert "result" in answer(0)
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        send(b"not json at all\n" + b"[" * 10000 + b"\n")
        send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "create_sandbox", "arguments": {}}})
        box = answer(1)["result"]["structuredContent"]["box"]
        send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "exec", "arguments": {"box": box, "command": "sleep 300"}}})
        time.sleep(0.5)
        assert boxes_of(engine, box)
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 128 + signal.SIGTERM
        assert time.monotonic() - began < 5
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert gone(engine, box, within=3.0)


def http_server(*args, env=None):
    proc = subprocess.Popen([QUINEBOX, "mcp", "--http", "-g", "mem:256m", *args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=env)
    line = proc.stderr.readline().decode()
    found = re.search(r"(http://127\.0\.0\.1:\d+/mcp)", line)
    assert found, line + proc.stderr.read(2000).decode() if proc.poll() is not None else line
    token = re.search(r"Bearer ([A-Za-z0-9_-]+)'", line)
    return proc, found.group(1), token.group(1) if token else None


def post(url, headers):
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json", "Accept": "application/json, text/event-stream", **headers})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_http_needs_the_token_and_serves_with_it(engine, tmp_path):
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    proc, url, token = http_server()
    made = []
    try:
        assert token and post(url, {}) == 401 and post(url, {"Authorization": "Bearer wrong-token-0123456789"}) == 401
        assert post(url, {"Authorization": token}) == 401

        async def body(c):
            box = (await ok(c, "create_sandbox"))["box"]
            made.append(box)
            assert (await ok(c, "exec", {"box": box, "argv": ["echo", "over http"]}))["stdout"] == "over http\n"
            return box

        transport = streamable_http_client(url, http_client=httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60))
        run(transport, body, within=60)
        with pytest.raises(BaseException):  # noqa: B017 - whatever the SDK raises for a 401, it does not connect
            run(streamable_http_client(url, http_client=httpx2.AsyncClient(timeout=10)), body, within=20)
        assert len(made) == 1 and boxes_of(engine, made[0])
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
    assert gone(engine, made[0])

    secret = tmp_path / "token"
    secret.write_text("a-token-from-a-file-0123456789\n")
    proc, url, shown = http_server("--token-file", str(secret))
    try:
        assert shown is None and post(url, {}) == 401
        assert post(url, {"Authorization": "Bearer a-token-from-a-file-0123456789"}) != 401
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)


@pytest.mark.parametrize("backend", ["oci", "docker"])
def test_file_tools_on_what_the_box_planted_fail_at_once_and_the_box_stays_up(engine, backend):
    """A FIFO, a socket, a link to a device, a file growing without end: one-line tool errors (or a capped read) within
    seconds, on either backend."""
    srv = QuineboxMCP(["pids:128"], backend=backend)
    py = "/.quinebox/lib/ld.so --library-path /.quinebox/lib /.quinebox/lib/python3 -I -S"

    async def body(c):
        box = (await ok(c, "create_sandbox"))["box"]
        await ok(c, "exec", {"box": box, "command": f"cd /world && mkfifo fifo && ln -s /dev/zero zero && "
                                                    f"{py} -c \"import socket; socket.socket(socket.AF_UNIX).bind('sock')\" && "
                                                    "(while :; do head -c 65536 /dev/zero; sleep 0.02; done > grow 2>/dev/null &)"})
        timings = {}
        for tool, args, words in [
            ("read_file", {"path": "fifo"}, ("not a regular file", "a FIFO")),
            ("read_file", {"path": "sock"}, ("not a regular file", "a socket")),
            ("read_file", {"path": "zero"}, ("resolves to /dev/zero",)),
            ("edit_file", {"path": "fifo", "old_string": "a", "new_string": "b"}, ("a FIFO",)),
            ("write_file", {"path": "fifo", "content": "x"}, ("a FIFO, not a regular file",)),
            ("write_file", {"path": "sock", "content": "x"}, ("a socket, not a regular file",)),
        ]:
            began = time.monotonic()
            await refused(c, tool, {"box": box, **args}, *words)
            timings[f"{tool} {args['path']}"] = took = time.monotonic() - began
            assert took < 5
        began = time.monotonic()
        grow = await ok(c, "read_file", {"box": box, "path": "grow", "limit": 4096, "encoding": "base64"})
        timings["read_file grow"] = time.monotonic() - began
        assert len(base64.b64decode(grow["content"])) == 4096 and grow["bytes_not_read"] >= 0
        print("\nplanted mcp", backend, {k: round(v, 3) for k, v in timings.items()})
        assert (await ok(c, "exec", {"box": box, "command": "pkill -f 'head -c' ; echo up"}))["stdout"].endswith("up\n")

    try:
        run(srv.mcp, body)
    finally:
        srv.close()
