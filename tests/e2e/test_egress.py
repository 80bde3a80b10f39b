"""Controlled egress on the real engine: boxes reach a simulated outside world only as their net grants allow.

The outside world is a server container started with testcontainers on a
network of its own (an HTTP server and a TCP echo server). Its name reaches
quinebox's resolver through QUINEBOX_EGRESS_HOSTS, and the tests grant its
network with net:CIDR. Clients in the box are real: Python's urllib through
HTTP_PROXY, a CONNECT tunnel, SOCKS5, and a direct connection that ignores
the proxy.
"""

import hashlib
import http.server
import io
import os
import subprocess
import textwrap
import threading
from pathlib import Path

import pytest
from certificates import issue_certificates
from commands import qb, scripts
from openai_server import exit_, sh
from package_index import write_index

import quinebox
from quinebox.agent.store import read_tape
from quinebox.audit.log import AuditLog
from quinebox.box.spec import DEFAULT_IMAGE

pytestmark = pytest.mark.root_only  # its outside networks are the engine's

os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")  # its reaper image is on a registry these machines cannot reach

SERVER = textwrap.dedent(
    """
    import functools, hashlib, http.server, os, socketserver, ssl, threading
    BODY = bytes(range(256)) * 4000
    class Files(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.send_header("Content-Length", str(len(BODY))); self.end_headers(); self.wfile.write(BODY)
        def log_message(self, *a): pass
    class Echo(socketserver.BaseRequestHandler):
        def handle(self):
            while data := self.request.recv(65536): self.request.sendall(data)
    class Digest(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = hashlib.sha256(self.headers.get("Authorization", "").encode()).hexdigest().encode()
            self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
        def log_message(self, *a): pass
    socketserver.ThreadingTCPServer.allow_reuse_address = True
    threading.Thread(target=socketserver.ThreadingTCPServer(("", 7000), Echo).serve_forever, daemon=True).start()
    open("/tmp/cert.pem", "w").write(os.environ["CERT"]); open("/tmp/key.pem", "w").write(os.environ["KEY"])
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); tls.load_cert_chain("/tmp/cert.pem", "/tmp/key.pem")
    api = http.server.ThreadingHTTPServer(("", 8443), Digest); api.socket = tls.wrap_socket(api.socket, server_side=True)
    threading.Thread(target=api.serve_forever, daemon=True).start()
    static = functools.partial(http.server.SimpleHTTPRequestHandler, directory="/srv")
    threading.Thread(target=http.server.ThreadingHTTPServer(("", 8080), static).serve_forever, daemon=True).start()
    http.server.ThreadingHTTPServer(("", 8000), Files).serve_forever()
    """
)
BODY = bytes(range(256)) * 4000
REAL = "real-token-" + os.urandom(12).hex()
BASE_IMAGE = "quinebox/base:bookworm"
CLIENTS_IMAGE = "quinebox-test/clients:1"


def published(srv: Path) -> Path:
    """What the static server serves: a package index holding one wheel, and a git repository (dumb HTTP)."""
    write_index(srv)
    work = srv.parent / "work"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q", str(work)], check=True)
    (work / "README").write_text("cloned through the proxy\n")
    subprocess.run([*git, "-C", str(work), "add", "README"], check=True)
    subprocess.run([*git, "-C", str(work), "commit", "-qm", "one"], check=True)
    subprocess.run([*git, "clone", "-q", "--bare", str(work), str(srv / "repo.git")], check=True)
    subprocess.run([*git, "-C", str(srv / "repo.git"), "update-server-info"], check=True)
    for path in [srv, *srv.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return srv


@pytest.fixture(scope="module")
def clients(engine):
    """An image with curl, git and pip, from Debian's packages (no registry)."""
    dockerfile = (
        f"FROM {BASE_IMAGE}\nRUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
        "curl git python3-pip >/dev/null && rm -rf /var/lib/apt/lists/*\n"
    )
    engine.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=CLIENTS_IMAGE, rm=True)
    return CLIENTS_IMAGE


@pytest.fixture(scope="module")
def outside(engine, tmp_path_factory):
    """(the server's network in CIDR form, the environment that names it files.test / echo.test)."""
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.network import Network

    here = tmp_path_factory.mktemp("egress")
    cert, key = issue_certificates(here, "api.test")
    served = published(here / "srv")
    with Network() as network:
        server = DockerContainer(DEFAULT_IMAGE, command=["python3", "-c", SERVER], network=network, env={"CERT": cert, "KEY": key}, volumes=[(str(served), "/srv", "ro")])
        with server:
            server.get_wrapped_container().reload()
            address = server.get_wrapped_container().attrs["NetworkSettings"]["Networks"][network.name]["IPAddress"]
            subnet = engine.api.inspect_network(network.id)["IPAM"]["Config"][0]["Subnet"]
            hosts = here / "hosts"
            hosts.write_text(f"{address} files.test echo.test api.test pypi.test git.test\n169.254.169.254 meta.test\n127.0.0.1 loop.test\n")
            env = {**os.environ, "QUINEBOX_EGRESS_HOSTS": str(hosts), "SSL_CERT_FILE": str(here / "ca.pem")}
            probe = "import socket,time\nfor _ in range(100):\n try: socket.create_connection(('127.0.0.1', 8080), 1).close(); break\n except OSError: time.sleep(0.1)"
            assert server.exec(["python3", "-c", probe]).exit_code == 0
            yield subnet, address, env


CLIENTS = textwrap.dedent(
    """
    import hashlib, socket, urllib.request
    body = urllib.request.urlopen("http://files.test:8000/data", timeout=10).read()
    print("urllib", len(body), hashlib.sha256(body).hexdigest())
    tunnel = socket.create_connection(("127.0.0.1", 3128))
    tunnel.sendall(b"CONNECT files.test:8000 HTTP/1.1\\r\\nHost: files.test:8000\\r\\n\\r\\n")
    print("connect", tunnel.recv(39).split(b"\\r\\n")[0].decode())
    tunnel.sendall(b"GET /d HTTP/1.1\\r\\nHost: files.test\\r\\nConnection: close\\r\\n\\r\\n")
    data = b""
    while chunk := tunnel.recv(65536):
        data += chunk
    print("tunnel", hashlib.sha256(data.split(b"\\r\\n\\r\\n", 1)[1]).hexdigest())
    socks = socket.create_connection(("127.0.0.1", 3128))
    socks.sendall(b"\\x05\\x01\\x00"); socks.recv(2)
    socks.sendall(b"\\x05\\x01\\x00\\x03\\x09echo.test" + (7000).to_bytes(2, "big"))
    print("socks", socks.recv(10)[:2].hex())
    socks.sendall(b"echo me")
    print("echo", socks.recv(100).decode())
    """
)


def test_a_box_reaches_a_granted_network_by_name_through_every_kind_of_client(outside):
    subnet, _, env = outside
    done = qb("exec", "-g", f"net:{subnet}", "--", "python3", "-c", CLIENTS, env=env)
    assert done.returncode == 0, done.stderr
    digest = hashlib.sha256(BODY).hexdigest()
    assert done.stdout.decode().splitlines() == [
        f"urllib {len(BODY)} {digest}", "connect HTTP/1.1 200 Connection established", f"tunnel {digest}", "socks 0500", "echo echo me",
    ]


def test_a_name_not_granted_is_refused_with_a_403_and_one_line(outside):
    _, address, env = outside
    fetch = "import urllib.request\ntry: urllib.request.urlopen('http://files.test:8000/data', timeout=10)\nexcept Exception as e: print(e.code, e.read().decode().strip())"
    done = qb("exec", "-g", "net:other.test", "--", "python3", "-c", fetch, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().strip() == f"403 egress to files.test:8000 refused: {address} is a private or special address; only a net:CIDR grant reaches it (grant net:{address}:8000)"
    assert done.stderr.decode().splitlines() == [f"quinebox: egress to files.test:8000 refused: {address} is a private or special address; only a net:CIDR grant reaches it (grant net:{address}:8000)"]


def test_a_direct_connection_that_ignores_the_proxy_has_no_route(outside):
    subnet, address, env = outside
    direct = f"import socket\ntry: socket.create_connection(('{address}', 8000), 5)\nexcept OSError as e: print(e.strerror)"
    done = qb("exec", "-g", f"net:{subnet}", "--", "python3", "-c", direct, env=env)
    assert (done.returncode, done.stdout) == (0, b"Network is unreachable\n"), done.stderr
    # /proc/net/dev, not /sys/class/net: a bwrap box mounts no /sys
    assert qb("exec", "-g", f"net:{subnet}", "--", "sh", "-c", "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '").stdout == b"lo\n"


def test_net_bridge_is_the_engines_network_as_before():
    done = qb("exec", "-g", "net:bridge", "--", "sh", "-c", "ls /sys/class/net; echo ${HTTP_PROXY:-no proxy}")
    assert b"eth0" in done.stdout and done.stdout.endswith(b"no proxy\n")


def test_a_child_asking_for_wider_network_is_refused_with_125(outside, tmp_path):
    subnet, _, env = outside
    scripts(tmp_path, mission=[{"sh": "quinebox exec -g net -- true; echo $? >&4; quinebox exec -g net:" + subnet + " -- true; echo $? >&4"}, {"exit": "success"}])
    done = qb("run", "-q", "-m", f"script:{tmp_path / 'mission.yaml'}", "-g", f"net:{subnet}", "-g", "spawn:2", "-g", "depth:1", "try", env=env)
    assert done.stdout == b"125\n0\n", done.stderr


def test_an_agent_with_egress_says_nothing_of_its_forwarder_and_a_secret_with_no_way_out_still_starts(tmp_path):
    """Under the lifeline, which listens for the box already, the agent's own forwarder stays quiet; a secret with
    no net grant is a placeholder alone (it once failed the box with 125: no trust to mount)."""
    scripts(tmp_path, mission=[{"sh": "printf 'ok %s\\n' \"${API_TOKEN%%-*}\" >&4"}, {"exit": "success"}])
    env = {**os.environ, "API_TOKEN": "a-value-never-seen-in-a-box"}
    for grants in (["-g", "net:host-loopback:9"], ["-g", "secret:API_TOKEN@api.test"]):
        done = qb("run", "-q", "-m", f"script:{tmp_path / 'mission.yaml'}", *grants, "say ok", env=env)
        assert (done.returncode, done.stdout, done.stderr) == (0, b"ok quinebox\n" if "secret" in grants[1] else b"ok \n", b""), grants


def test_an_agent_is_told_where_it_may_go_and_its_tape_records_each_connection(outside, fake_openai, monkeypatch):
    subnet, address, env = outside
    monkeypatch.setenv("QUINEBOX_EGRESS_HOSTS", env["QUINEBOX_EGRESS_HOSTS"])
    fake_openai.steps = [sh("python3 -c \"import urllib.request; print(len(urllib.request.urlopen('http://files.test:8000/').read()))\" >&4"), exit_()]
    result = quinebox.run("fetch it", grants=[f"net:{subnet}"])
    assert (result.returncode, result.stdout) == (0, f"{len(BODY)}\n".encode()), result.stderr
    system = fake_openai.requests[0].body["messages"][0]["content"]
    assert f"you may reach only what these grants allow: net:{subnet}" in system
    [record] = [r for r in read_tape(result.session) if r["kind"] == "egress"]
    assert (record["host"], record["port"], record["address"], record["allowed"], record["rule"]) == ("files.test", 8000, address, True, f"net:{subnet}")
    assert record["down"] > len(BODY)
    shown = qb("show", result.session).stdout.decode()
    assert f"egress    files.test:8000 ({address}) allowed by net:{subnet}" in shown, shown


SECRET_CLIENT = textwrap.dedent(
    """
    import os, urllib.request
    request = urllib.request.Request("https://api.test:8443/", headers={"Authorization": "Bearer " + os.environ["API_TOKEN"]})
    print(urllib.request.urlopen(request, timeout=10).read().decode())
    print(os.environ["API_TOKEN"])
    """
)


def test_a_secret_reaches_its_host_and_is_nowhere_in_the_box(outside):
    subnet, _, env = outside
    env = {**env, "API_TOKEN": REAL}
    grants = ["-g", f"net:{subnet}", "-g", "secret:API_TOKEN@api.test"]
    done = qb("exec", *grants, "--", "python3", "-c", SECRET_CLIENT, env=env)
    assert done.returncode == 0, done.stderr
    digest, held = done.stdout.decode().splitlines()
    assert digest == hashlib.sha256(f"Bearer {REAL}".encode()).hexdigest()  # the host got the real value
    assert held.startswith("quinebox-secret-API_TOKEN-") and REAL not in held
    look = "cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline /run/quinebox/tls/*; env; find / -xdev -type f -newer /proc/1 2>/dev/null | xargs cat 2>/dev/null; true"
    seen = qb("exec", *grants, "--", "sh", "-c", look, env=env)
    assert seen.returncode == 0 and b"quinebox-secret-API_TOKEN-" in seen.stdout
    assert REAL.encode() not in seen.stdout + seen.stderr


def test_a_placeholder_sent_to_another_host_is_refused_as_exfiltration(outside):
    subnet, _, env = outside
    leak = "import os, urllib.request\ntry: urllib.request.urlopen(urllib.request.Request('http://files.test:8000/', headers={'X-Leak': os.environ['API_TOKEN']}))\nexcept Exception as e: print(e.code)"
    done = qb("exec", "-g", f"net:{subnet}", "-g", "secret:API_TOKEN@api.test", "--", "python3", "-c", leak, env={**env, "API_TOKEN": REAL})
    assert (done.returncode, done.stdout) == (0, b"403\n"), done.stderr
    [line] = done.stderr.decode().splitlines()
    assert "the request carries the placeholder of secret API_TOKEN, which goes only to api.test: recorded as an exfiltration attempt" in line


TOOLS = textwrap.dedent(
    """
    set -e
    curl -sS http://files.test:8000/data | sha256sum | cut -c1-64
    curl -sS --proxytunnel http://files.test:8000/data | sha256sum | cut -c1-64
    env -u HTTP_PROXY -u http_proxy curl -sS http://files.test:8000/data | sha256sum | cut -c1-64  # through ALL_PROXY: SOCKS5
    pip install -q --no-cache-dir --disable-pip-version-check --break-system-packages --target /tmp/site --index-url http://pypi.test:8080/simple --trusted-host pypi.test tinypkg
    PYTHONPATH=/tmp/site python3 -c 'import tinypkg; print(tinypkg.VALUE)'
    git clone -q http://git.test:8080/repo.git /tmp/repo
    cat /tmp/repo/README
    """
)


def test_curl_pip_and_git_work_through_the_proxy_unchanged(outside, clients):
    subnet, _, env = outside
    done = qb("exec", "--image", clients, "-g", f"net:{subnet}", "--", "sh", "-c", TOOLS, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    digest = hashlib.sha256(BODY).hexdigest()
    assert done.stdout.splitlines() == [d.encode() for d in (digest, digest, digest, "installed from the index", "cloned through the proxy")], done.stdout[:600]


ASK = textwrap.dedent(
    """
    import socket, sys
    for target in sys.argv[1:]:
        proxy = socket.create_connection(("127.0.0.1", 3128))
        proxy.sendall(f"CONNECT {target} HTTP/1.1\\r\\n\\r\\n".encode())
        print(target, proxy.recv(4096).split(b"\\r\\n")[0].decode())
    """
)


def test_only_what_is_granted_is_reached_by_name_address_and_port(outside):
    _, address, env = outside
    targets = ["files.test:8000", "files.test:7000", f"{address}:8000", "10.255.255.1:80", "meta.test:80", "loop.test:80", "[::ffff:169.254.169.254]:80"]
    done = qb("exec", "-g", f"net:{address}/32:8000", "--", "python3", "-c", ASK, *targets, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().splitlines() == [
        "files.test:8000 HTTP/1.1 200 Connection established",
        "files.test:7000 HTTP/1.1 403 Forbidden",  # a port not granted
        f"{address}:8000 HTTP/1.1 200 Connection established",  # an address the CIDR grants
        "10.255.255.1:80 HTTP/1.1 403 Forbidden",  # one it does not
        "meta.test:80 HTTP/1.1 403 Forbidden",  # a name for the metadata address
        "loop.test:80 HTTP/1.1 403 Forbidden",  # a name for the host's loopback
        "[::ffff:169.254.169.254]:80 HTTP/1.1 403 Forbidden",  # the metadata address spelled as IPv6
    ]
    assert len(done.stderr.decode().splitlines()) == 5  # one line for each refusal


@pytest.mark.parametrize(
    "grant, why",
    [
        ("net:localhost:18089", "localhost is the box's own loopback inside the box, never the host's; "
                                "for a service on the host's loopback grant net:host-loopback:18089 and connect to host-loopback:18089"),
        ("net:127.0.0.1:18089", "127.0.0.1/32 reaches the host's own loopback, which no address grant may; "
                                "for one service on the host's loopback grant net:host-loopback:PORT and connect to host-loopback:PORT"),
        ("net:fe80::/10", "fe80::/10 is multicast, broadcast or IPv6 link-local: no connection through the host's proxy can go there"),
    ],
)
def test_a_grant_that_can_never_work_is_refused_before_any_box_starts(grant, why, tmp_path):
    for args in (["exec", "-g", grant, "--", "sh", "-c", f"touch {tmp_path}/ran"], ["run", "-q", "-m", "script:/nonexistent.yaml", "-g", grant, "try"]):
        done = qb(*args)
        assert (done.returncode, done.stdout, done.stderr) == (125, b"", f"quinebox: refused grant {grant!r}: {why}\n".encode()), args
    assert not (tmp_path / "ran").exists()


@pytest.fixture
def loopback_server():
    """A server on the host's loopback only, answering `hello from the host`."""

    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "19")
            self.end_headers()
            self.wfile.write(b"hello from the host")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


LOOPBACK_CLIENT = textwrap.dedent(
    """
    import sys, urllib.request
    for url in sys.argv[1:]:
        try:
            print(urllib.request.urlopen(url, timeout=10).read().decode())
        except Exception as e:
            print(getattr(e, "code", e))
    """
)


def test_host_loopback_reaches_one_port_by_name_and_each_refusal_is_one_line_and_one_record(loopback_server, tmp_path):
    port = loopback_server
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 loop.test\n")
    env = {**os.environ, "QUINEBOX_EGRESS_HOSTS": str(hosts)}
    urls = [f"http://host-loopback:{port}/", f"http://loop.test:{port}/", f"http://host-loopback:{port + 1}/", f"http://loop.test:{port}/",
            f"http://host-loopback:{port}/"]
    done = qb("exec", "-g", f"net:host-loopback:{port}", "--", "python3", "-c", LOOPBACK_CLIENT, *urls, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().splitlines() == ["hello from the host", "403", "403", "403", "hello from the host"]
    assert done.stderr.decode().splitlines() == [  # once per destination, on quinebox's stderr, never the box's stdout
        f"quinebox: egress to loop.test:{port} refused: 127.0.0.1 is the host's loopback, which no name or address reaches; "
        f"for port {port} there grant net:host-loopback:{port} and connect to host-loopback:{port}",
        f"quinebox: egress to host-loopback:{port + 1} refused: grant net:host-loopback:{port + 1}",
    ]
    records = list(AuditLog().records())
    [granted] = [r for r in records if r["kind"] == "host_loopback_granted" and r["facts"]["grants"] == [f"net:host-loopback:{port}"]]
    mine = [r["facts"] for r in records if r["session"] == granted["session"] and r["kind"] == "egress"]
    assert sorted((f.get("destination") or f["host"], f["allowed"], f.get("rule") or "") for f in mine) == sorted([
        (f"host-loopback:{port + 1}", False, ""), ("host-loopback", True, f"net:host-loopback:{port}"),
        ("host-loopback", True, f"net:host-loopback:{port}"), (f"loop.test:{port}", False, ""),
    ])  # each use of the loopback grant, and each refused destination once
    verified = qb("audit", "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_an_agents_refused_destination_is_one_line_on_the_runs_stderr(loopback_server, tmp_path):
    port = loopback_server
    fetch = f"python3 -c \"import urllib.request as u\ntry: u.urlopen('http://host-loopback:{port}/')\nexcept Exception as e: print(e.code)\" >&4"
    scripts(tmp_path, mission=[{"sh": f"{fetch}; {fetch}"}, {"exit": "success"}])
    done = qb("run", "-q", "-m", f"script:{tmp_path / 'mission.yaml'}", "-g", "net:example.com", "try")
    assert (done.returncode, done.stdout) == (0, b"403\n403\n"), done.stderr
    assert done.stderr.decode().splitlines() == [f"quinebox: egress to host-loopback:{port} refused: grant net:host-loopback:{port}"]
