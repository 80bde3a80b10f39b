"""Images from a registry with no engine to ask: a real registry on loopback (Debian's docker-registry), skopeo.

The images are pushed from the engine into a registry these tests start on a free loopback port. Then every
box runs with DOCKER_HOST pointing nowhere, so the registry is the only place an image can come from.
"""

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from commands import qb
from images import BUSYBOX, STATIC

NO_ENGINE = "unix:///nonexistent/docker.sock"


class Registry:
    """`docker-registry serve` on 127.0.0.1, its storage in `root`; ended by its PID."""

    def __init__(self, root: Path):
        binary = shutil.which("docker-registry")
        assert binary, "Debian's docker-registry is missing: scripts/setup.sh installs it (apt-get install docker-registry)"
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        config = root / "config.yml"
        config.write_text(json.dumps({"version": 0.1, "log": {"level": "error"}, "storage": {"filesystem": {"rootdirectory": str(root / "data")}},
                                      "http": {"addr": f"127.0.0.1:{self.port}"}}))
        self.proc = subprocess.Popen([binary, "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        until = time.monotonic() + 30
        while time.monotonic() < until:
            with socket.socket() as conn:
                if conn.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            assert self.proc.poll() is None, self.proc.stderr.read()
            time.sleep(0.1)
        self.stop()
        raise AssertionError("the registry did not listen within 30 s")

    def push(self, image: str, as_name: str) -> str:
        """Copy `image` from the engine to `as_name` here; the name a box asks for."""
        name = f"127.0.0.1:{self.port}/{as_name}"
        done = subprocess.run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false", f"docker-daemon:{image}", f"docker://{name}"], capture_output=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return name

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def registry(tmp_path, test_images):
    served = Registry(tmp_path / "registry")
    yield served
    served.stop()


@pytest.fixture
def engineless(tmp_path):
    """A state dir whose agent image was unpacked once (with the engine), then an environment with no engine."""
    state = tmp_path / "state"
    env = {**os.environ, "QUINEBOX_STATE_DIR": str(state), "QUINEBOX_BACKEND": "oci", "QUINEBOX_SERVE": "off"}
    first = qb("exec", "--", "true", env=env)
    assert first.returncode == 0, first.stderr
    return {**env, "DOCKER_HOST": NO_ENGINE}


def test_an_image_named_on_the_command_line_comes_from_its_registry_with_no_engine(registry, engineless):
    name = registry.push(STATIC.name, "test/static:1")
    done = qb("exec", "--image", name, env=engineless)
    assert (done.returncode, done.stdout, done.stderr) == (0, b"the image's own command\n", b"ran\n")
    refs = [json.loads(p.read_text()) for p in (Path(engineless["QUINEBOX_STATE_DIR"]) / "images" / "refs").glob("*.json")]
    assert {"name": name, "source": "registry"}.items() <= next(r for r in refs if r["name"] == name).items()
    registry.stop()  # once it is here, a box of it needs neither the engine nor the registry
    again = qb("exec", "--image", name, env=engineless)
    assert (again.returncode, again.stdout) == (0, b"the image's own command\n"), again.stderr


def test_a_shell_image_runs_a_command(registry, engineless):
    name = registry.push(BUSYBOX.name, "test/busybox:1")
    done = qb("exec", "--image", name, "--", "sh", "-c", "echo hello from $0", env=engineless)
    assert (done.returncode, done.stdout) == (0, b"hello from sh\n"), done.stderr


def test_a_name_pinned_to_another_digest_is_refused_in_one_line(registry, engineless):
    name = registry.push(STATIC.name, "test/static:1")
    pinned = name.rsplit(":", 1)[0] + "@sha256:" + "0" * 64
    done = qb("exec", "--image", pinned, env=engineless)
    assert done.returncode == 125 and done.stdout == b""
    said = done.stderr.decode()
    assert said.count("\n") == 1 and said.startswith(f"quinebox: cannot pull {pinned} (is a registry reachable?): skopeo, pulling from 127.0.0.1:{registry.port}"), said
    assert not list((Path(engineless["QUINEBOX_STATE_DIR"]) / "images").glob(".making-*"))  # its scratch layout is gone


def test_a_damaged_blob_is_refused_and_nothing_is_unpacked(registry, engineless):
    name = registry.push(STATIC.name, "test/static:1")
    blobs = sorted((registry.root / "data").rglob("blobs/sha256/*/*/data"), key=lambda p: p.stat().st_size)
    biggest = blobs[-1]  # the layer that holds the static binary
    damaged = bytearray(biggest.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    biggest.write_bytes(bytes(damaged))
    images = Path(engineless["QUINEBOX_STATE_DIR"]) / "images"
    before = sorted(p.name for p in images.iterdir())
    done = qb("exec", "--image", name, env=engineless)
    assert done.returncode == 125 and done.stdout == b""
    assert done.stderr.decode().count("\n") == 1 and "cannot pull" in done.stderr.decode(), done.stderr
    assert sorted(p.name for p in images.iterdir()) == before


def test_an_image_not_in_the_registry_says_so_and_names_the_missing_engine(registry, engineless):
    name = f"127.0.0.1:{registry.port}/test/absent:1"
    done = qb("exec", "--image", name, env=engineless)
    assert done.returncode == 125
    said = done.stderr.decode()
    assert said.count("\n") == 1 and f"cannot pull {name} (is a registry reachable?): skopeo, pulling from 127.0.0.1:{registry.port} without the engine (" in said, said


def test_pull_never_with_no_engine_asks_no_registry(registry, engineless):
    name = registry.push(STATIC.name, "test/static:1")
    done = qb("exec", "--pull", "never", "--image", name, env=engineless)
    assert done.returncode == 125 and b"cannot pull" not in done.stderr, done.stderr
