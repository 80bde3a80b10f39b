"""Images that are not quinebox's, built here from Debian's packages with no registry.

    busybox    FROM scratch: a static busybox (Debian's busybox-static) and its applets, and the probe
    musl       FROM scratch: musl's loader (Debian's musl) and busybox; the probe linked against musl
    nopython   the agent image with Python, the baked runtime and the in-box quinebox removed; its own
               ENV (PYTHONHOME and PYTHONPATH pointing nowhere, a GREETING) and WORKDIR /srv
    static     FROM scratch: the static probe alone, as its CMD; no shell, no libc
    foreign    an image whose config says arm64 (loaded from a hand-made archive): to be refused

`probe` (probe.c) is the same tool in each, so a test can ask every
image for the same things: copy stdin, exit with a code, eat memory, make
forbidden system calls.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from quinebox.box.spec import DEFAULT_IMAGE

SOURCE = Path(__file__).parent / "probe.c"
APPLETS = ("sh", "cat", "echo", "sleep", "head", "tr", "wc", "stty", "test", "ls", "id", "env", "pwd", "true", "printf", "kill")


@dataclass(frozen=True)
class TestImage:
    name: str
    probe: str  # where the probe is, as a path in the box
    shell: bool


BUSYBOX = TestImage("quinebox-test/busybox:1", "/bin/probe", True)
MUSL = TestImage("quinebox-test/musl:1", "/bin/probe", True)
NOPYTHON = TestImage("quinebox-test/nopython:1", "/usr/local/bin/probe", True)
STATIC = TestImage("quinebox-test/static:1", "/probe", False)
ALL = (BUSYBOX, MUSL, NOPYTHON, STATIC)
FOREIGN = "quinebox-test/foreign:1"


def _compile(compiler: str, out: Path, *flags: str) -> Path:
    if not shutil.which(compiler):
        raise RuntimeError(f"{compiler} is missing: scripts/setup.sh installs it (build-essential, musl-tools)")
    subprocess.run([compiler, "-O2", *flags, "-o", str(out), str(SOURCE)], check=True)
    return out


def _context(dockerfile: str, files: dict[str, Path], links: dict[str, str] = {}) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = dockerfile.encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        for name, path in files.items():
            tar.add(str(path.resolve()), arcname=name)  # a link's target, under the link's name
        for name, target in links.items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    buf.seek(0)
    return buf


def _busybox_links(prefix: str) -> dict[str, str]:
    return {f"{prefix}/{applet}": "busybox" for applet in APPLETS}


def load_foreign(client) -> str:
    """`docker load` of an image for another CPU: one empty layer, and a config that says arm64."""
    import hashlib
    import json

    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        info = tarfile.TarInfo("hello")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"hello"))
    diff_id = "sha256:" + hashlib.sha256(layer.getvalue()).hexdigest()
    config = json.dumps({"architecture": "arm64", "os": "linux", "config": {"Cmd": ["/hello"]}, "rootfs": {"type": "layers", "diff_ids": [diff_id]}}).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [FOREIGN], "Layers": ["layer/layer.tar"]}]).encode()
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for name, data in ((config_name, config), ("layer/layer.tar", layer.getvalue()), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    client.images.load(archive.getvalue())
    return FOREIGN


def build_all(client) -> tuple[TestImage, ...]:
    """Build (or find in the engine's cache) every test image."""
    busybox = Path(shutil.which("busybox") or "/bin/busybox")
    musl_loader = Path("/lib/ld-musl-x86_64.so.1")
    with tempfile.TemporaryDirectory() as scratch:
        static = _compile("gcc", Path(scratch) / "probe-static", "-static")
        musl = _compile("musl-gcc", Path(scratch) / "probe-musl")
        contexts = {
            BUSYBOX: _context("FROM scratch\nCOPY bin /bin\n", {"bin/busybox": busybox, "bin/probe": static}, _busybox_links("bin")),
            MUSL: _context(
                "FROM scratch\nCOPY lib /lib\nCOPY bin /bin\n",
                {"lib/ld-musl-x86_64.so.1": musl_loader, "bin/busybox": busybox, "bin/probe": musl},
                _busybox_links("bin"),
            ),
            NOPYTHON: _context(
                f"FROM {DEFAULT_IMAGE}\nUSER 0\n"
                "RUN rm -rf /usr/bin/python3* /usr/lib/python3* /.quinebox /usr/local/bin/quinebox && mkdir -p /srv && chmod 1777 /srv\n"
                "COPY probe /usr/local/bin/probe\n"
                "ENV PYTHONHOME=/nowhere PYTHONPATH=/nowhere GREETING=hello-from-the-image\n"
                "WORKDIR /srv\nUSER 1000:1000\n",
                {"probe": static},
            ),
            STATIC: _context('FROM scratch\nCOPY probe /probe\nCMD ["/probe", "say", "the image\'s own command", "ran"]\n', {"probe": static}),
        }
        for image, context in contexts.items():
            client.images.build(fileobj=context, custom_context=True, tag=image.name, rm=True)
    return ALL
