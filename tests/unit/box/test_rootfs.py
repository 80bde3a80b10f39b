"""Unpacked images with no engine: docker-save tarballs and OCI layouts built here, layer by layer."""

import gzip
import hashlib
import io
import json
import multiprocessing
import os
import stat
import tarfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from quinebox.box.images import archives, eviction, rootfs, seal
from quinebox.box.policy import native_machine
from quinebox.box.spec import ImageInfo
from quinebox.errors import EngineError, ImageError
from quinebox.processes import owner_tag

ROOT = os.geteuid() == 0


@pytest.fixture(autouse=True)
def state(tmp_path, monkeypatch):
    """A state dir per test, and no engine's table of names unless a test writes one."""
    monkeypatch.setenv("QUINEBOX_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(rootfs, "DOCKER_ROOT", str(tmp_path / "docker"))
    monkeypatch.setattr(rootfs, "DOCKER_CONFIG", str(tmp_path / "no-daemon.json"))
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    return tmp_path / "state"


# -- building images -----------------------------------------------------------------------


def entry(name, kind="file", data=b"", mode=None, uid=0, gid=0, target="", mtime=1_700_000_000):
    info = tarfile.TarInfo(name)
    info.mode = mode if mode is not None else 0o755 if kind == "dir" else 0o644
    info.uid, info.gid, info.mtime = uid, gid, mtime
    info.type = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "sym": tarfile.SYMTYPE, "link": tarfile.LNKTYPE, "chr": tarfile.CHRTYPE}[kind]
    info.linkname = target
    info.size = len(data) if kind == "file" else 0
    return info, data


def layer(*entries) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return out.getvalue()


def config(layers, env=("PATH=/usr/bin:/bin", "LANG=C.UTF-8"), arch=None, diff_ids=None) -> bytes:
    doc = {
        "architecture": arch or native_machine(),
        "os": "linux",
        "config": {"Env": list(env), "WorkingDir": "/home/agent", "Entrypoint": ["/bin/tool"], "Cmd": ["--help"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids or ["sha256:" + hashlib.sha256(data).hexdigest() for data in layers]},
    }
    return json.dumps(doc).encode()


def docker_save(path: Path, layers, tags=("quinebox-test-rootfs/img:1",), **kw) -> tuple[Path, str]:
    """A `docker save` tarball as Docker 20.10 writes one: <id>.json, <n>/layer.tar, manifest.json."""
    blob = config(layers, **kw)
    image_id = "sha256:" + hashlib.sha256(blob).hexdigest()
    files = {f"{image_id[7:]}.json": blob}
    for number, data in enumerate(layers):
        files[f"layer{number}/layer.tar"] = data
    manifest = [{"Config": f"{image_id[7:]}.json", "RepoTags": list(tags), "Layers": [f"layer{n}/layer.tar" for n in range(len(layers))]}]
    files["manifest.json"] = json.dumps(manifest).encode()
    with tarfile.open(path, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path, image_id


def oci_layout(path: Path, layers, *, compress=True, name="quinebox-test-rootfs/oci:2") -> tuple[Path, str]:
    blobs = path / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def put(data: bytes) -> dict:
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return {"digest": f"sha256:{digest}", "size": len(data)}

    blob = config(layers)
    manifest = {
        "schemaVersion": 2,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **put(blob)},
        "layers": [
            {"mediaType": "application/vnd.oci.image.layer.v1.tar" + ("+gzip" if compress else ""), **put(gzip.compress(data) if compress else data)}
            for data in layers
        ],
    }
    descriptor = {"mediaType": "application/vnd.oci.image.manifest.v1+json", **put(json.dumps(manifest).encode())}
    descriptor["annotations"] = {"org.opencontainers.image.ref.name": name}
    (path / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [descriptor]}))
    (path / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    return path, "sha256:" + hashlib.sha256(blob).hexdigest()


def layers_of_the_example():
    one = layer(
        entry("etc", "dir"),
        entry("etc/keep", data=b"one"),
        entry("etc/replaced", data=b"old"),
        entry("etc/deleted", data=b"gone"),
        entry("opaque", "dir"),
        entry("opaque/lower", data=b"x"),
        entry("opaque/sub", "dir"),
        entry("opaque/sub/deep", data=b"x"),
        entry("later", "dir"),
        entry("later/old", data=b"x"),
        entry("home", "dir"),
        entry("home/agent", "dir", mode=0o750, uid=1000, gid=1000),
        entry("home/agent/secret", data=b"s", mode=0o600, uid=1000, gid=1000),
        entry("bin", "dir"),
        entry("bin/tool", data=b"#!/bin/sh\n", mode=0o4755),
        entry("shared", data=b"same"),
        entry("shared-link", "link", target="shared"),
        entry("dir-to-file", "dir"),
        entry("dir-to-file/child", data=b"x"),
        entry("dev", "dir"),
        entry("dev/null", "chr", mode=0o666),
    )
    two = layer(
        entry("etc/replaced", data=b"new", mode=0o640),
        entry("etc/.wh.deleted"),
        entry("opaque/.wh..wh..opq"),
        entry("opaque/upper", data=b"y"),
        entry("etc/alias", "sym", target="/etc/keep"),
        entry("dir-to-file", data=b"now a file"),
        entry("tmp", "dir", mode=0o1777),
    )
    three = layer(
        entry("later/new", data=b"n"),
        entry("later/.wh..wh..opq"),
        entry("etc/fresh", data=b"f"),
        entry("etc/.wh.fresh"),
        entry("./ro", "dir", mode=0o555),
        entry("ro/inside", data=b"i", mode=0o444),
    )
    return [one, two, three]


EXPECTED = {
    "bin": ("d", 0o755, 0, None),
    "bin/tool": ("f", 0o755, 0, b"#!/bin/sh\n"),  # set-uid dropped
    "dev": ("d", 0o755, 0, None),  # device nodes skipped
    "dir-to-file": ("f", 0o644, 0, b"now a file"),
    "etc": ("d", 0o755, 0, None),
    "etc/alias": ("l", None, 0, "/etc/keep"),
    "etc/fresh": ("f", 0o644, 0, b"f"),  # a whiteout never hides its own layer's file
    "etc/keep": ("f", 0o644, 0, b"one"),
    "etc/replaced": ("f", 0o640, 0, b"new"),
    "home": ("d", 0o755, 0, None),
    "home/agent": ("d", 0o750, 1000, None),
    "home/agent/secret": ("f", 0o600, 1000, b"s"),
    "later": ("d", 0o755, 0, None),
    "later/new": ("f", 0o644, 0, b"n"),  # opaque after its own layer's child keeps the child
    "opaque": ("d", 0o755, 0, None),
    "opaque/upper": ("f", 0o644, 0, b"y"),
    "ro": ("d", 0o555, 0, None),
    "ro/inside": ("f", 0o444, 0, b"i"),
    "shared": ("f", 0o644, 0, b"same"),
    "shared-link": ("f", 0o644, 0, b"same"),
    "tmp": ("d", 0o1777, 0, None),  # as the image has it: the runtime gives its tmpfs /tmp this mode
}


def tree_of(root: Path) -> dict:
    found = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(top, name)
            st = path.lstat()
            kind = "d" if stat.S_ISDIR(st.st_mode) else "l" if stat.S_ISLNK(st.st_mode) else "f"
            body = None if kind == "d" else os.readlink(path) if kind == "l" else path.read_bytes()
            found[str(path.relative_to(root))] = (kind, None if kind == "l" else stat.S_IMODE(st.st_mode), st.st_uid if ROOT else 0, body)
    return found


def expected_tree() -> dict:
    return EXPECTED if ROOT else {k: (kind, mode, 0, body) for k, (kind, mode, _, body) in EXPECTED.items()}


# -- the tree ------------------------------------------------------------------------------


def test_a_docker_save_tarball_unpacks_into_exactly_its_layers_applied_in_order(tmp_path):
    archive, image_id = docker_save(tmp_path / "img.tar", layers_of_the_example())
    info = archives.from_docker_archive(archive)
    assert info.id == image_id and info.name == "quinebox-test-rootfs/img:1"
    assert info.env == (("PATH", "/usr/bin:/bin"), ("LANG", "C.UTF-8")) and info.workdir == "/home/agent"
    assert info.entrypoint == ("/bin/tool",) and info.cmd == ("--help",) and info.arch == native_machine()
    root = rootfs.unpacked(image_id)
    assert root == rootfs.images_root() / image_id[7:] / "rootfs"
    assert tree_of(root) == expected_tree()
    assert os.stat(root / "shared").st_ino == os.stat(root / "shared-link").st_ino
    assert os.stat(root / "etc/keep").st_mtime == 1_700_000_000
    assert json.loads((root.parent / "image.json").read_text()) == {**json.loads(json.dumps(asdict(info))), "source": "docker-archive"}
    assert sorted(p.name for p in rootfs.images_root().iterdir()) == [image_id[7:], "refs"]
    assert stat.S_IMODE(rootfs.images_root().stat().st_mode) == 0o700


@pytest.mark.parametrize("compress", [True, False])
def test_an_oci_layout_unpacks_into_the_same_tree(tmp_path, compress):
    layout, image_id = oci_layout(tmp_path / "layout", layers_of_the_example(), compress=compress)
    info = archives.from_oci_layout(layout)
    assert info.id == image_id and info.name == "quinebox-test-rootfs/oci:2"
    assert tree_of(rootfs.unpacked(image_id)) == expected_tree()
    assert rootfs.lookup("quinebox-test-rootfs/oci:2") == info


def test_the_same_image_from_a_tarball_and_a_layout_is_one_unpacked_tree(tmp_path):
    layers = layers_of_the_example()
    _, from_save = docker_save(tmp_path / "img.tar", layers)
    _, from_layout = oci_layout(tmp_path / "layout", layers)
    assert from_save == from_layout  # the id is the config's digest either way
    archives.from_docker_archive(tmp_path / "img.tar")
    archives.from_oci_layout(tmp_path / "layout")
    assert [p.name for p in rootfs.images_root().iterdir() if p.name != "refs"] == [from_save[7:]]


def test_a_gzipped_tarball_and_a_named_image_among_several(tmp_path):
    save, _ = docker_save(tmp_path / "img.tar", [layer(entry("a", data=b"a"))])
    (tmp_path / "img.tar.gz").write_bytes(gzip.compress(save.read_bytes()))
    assert rootfs.unpacked(archives.from_docker_archive(tmp_path / "img.tar.gz", "quinebox-test-rootfs/img:1").id)
    with pytest.raises(ImageError, match="holds no image named other:1: name one of quinebox-test-rootfs/img:1"):
        archives.from_docker_archive(save, "other:1")


# -- hostile images ------------------------------------------------------------------------


def refuse(tmp_path, layers, match):
    archive, image_id = docker_save(tmp_path / "bad.tar", layers, tags=())
    with pytest.raises(ImageError, match=match):
        archives.from_docker_archive(archive)
    assert rootfs.unpacked(image_id) is None
    assert [p.name for p in rootfs.images_root().iterdir()] == []  # no scratch directory left behind


def test_a_member_outside_the_root_refuses_the_image(tmp_path):
    refuse(tmp_path, [layer(entry("../escape", data=b"x"))], r"outside its root \('../escape'\)")
    refuse(tmp_path, [layer(entry("a/../../escape", data=b"x"))], "outside its root")
    assert not (tmp_path / "escape").exists() and not (tmp_path.parent / "escape").exists()


def test_an_absolute_member_lands_inside_the_root(tmp_path):
    name = f"/quinebox-test-rootfs-{os.getpid()}"
    archive, image_id = docker_save(tmp_path / "abs.tar", [layer(entry(name, data=b"inside"))])
    archives.from_docker_archive(archive)
    assert (rootfs.unpacked(image_id) / name.lstrip("/")).read_bytes() == b"inside"
    assert not os.path.lexists(name)


def test_a_path_through_a_planted_symlink_refuses_the_image(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    planted = [entry("etc", "sym", target=str(outside)), entry("etc/passwd", data=b"root::0:0::/:/bin/sh\n")]
    refuse(tmp_path, [layer(*planted)], "'etc/passwd' goes through 'etc', which is a symlink or a file")
    refuse(tmp_path, [layer(planted[0]), layer(planted[1])], "layer 2: 'etc/passwd' goes through 'etc'")
    refuse(tmp_path, [layer(entry("up", "sym", target="..")), layer(entry("up/escape", data=b"x"))], "goes through 'up'")
    assert list(outside.iterdir()) == [] and not (tmp_path / "escape").exists()


def test_a_hard_link_cannot_reach_outside_the_root(tmp_path):
    before = os.stat("/etc/passwd").st_nlink
    refuse(tmp_path, [layer(entry("passwd", "link", target="/etc/passwd"))], "hard link 'passwd' names '/etc/passwd', which is not in the image")
    refuse(tmp_path, [layer(entry("passwd", "link", target="../../../../etc/passwd"))], "outside its root")
    refuse(tmp_path, [layer(entry("d", "sym", target="/etc"), entry("passwd", "link", target="d/passwd"))], "goes through 'd'")
    assert os.stat("/etc/passwd").st_nlink == before


def test_an_upper_layer_replaces_a_lower_symlink_instead_of_writing_through_it(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    lower = layer(entry("x", "sym", target=str(victim)), entry("y", "sym", target=str(victim)))
    upper = layer(entry("x", data=b"mine"), entry("y", "link", target="x"))
    archive, image_id = docker_save(tmp_path / "img.tar", [lower, upper])
    archives.from_docker_archive(archive)
    root = rootfs.unpacked(image_id)
    assert (root / "x").read_bytes() == b"mine" and not (root / "x").is_symlink() and (root / "y").read_bytes() == b"mine"
    assert victim.read_text() == "untouched"


def test_layers_that_do_not_match_the_configs_digests_are_refused(tmp_path):
    layers = [layer(entry("a", data=b"a"))]
    archive, image_id = docker_save(tmp_path / "bad.tar", layers, diff_ids=["sha256:" + "0" * 64])
    with pytest.raises(ImageError, match="does not match its digest"):
        archives.from_docker_archive(archive)
    assert rootfs.unpacked(image_id) is None


def test_a_foreign_architecture_or_a_damaged_archive_is_one_clear_line(tmp_path):
    archive, _ = docker_save(tmp_path / "arm.tar", [layer()], arch="s390x")
    with pytest.raises(ImageError, match=f"is for s390x, and this machine runs {native_machine()}"):
        archives.from_docker_archive(archive)
    (tmp_path / "junk.tar").write_bytes(b"not a tar at all" * 100)
    with pytest.raises(ImageError, match="cannot read .*junk.tar as a `docker save` tarball"):
        archives.from_docker_archive(tmp_path / "junk.tar")
    with pytest.raises(ImageError, match="is not an OCI image layout"):
        archives.from_oci_layout(tmp_path)


# -- concurrent first use ------------------------------------------------------------------


def _unpack_in_a_process(archive: str) -> str:
    return archives.from_docker_archive(archive).id


def test_concurrent_first_uses_end_with_one_whole_tree_made_once_and_no_scratch(tmp_path, monkeypatch):
    archive, image_id = docker_save(tmp_path / "img.tar", layers_of_the_example())
    made = []
    make = rootfs._make
    monkeypatch.setattr(rootfs, "_make", lambda *args: made.append(args[0].id) or make(*args))
    with ThreadPoolExecutor(6) as threads:
        assert set(threads.map(lambda _: archives.from_docker_archive(archive).id, range(6))) == {image_id}
    assert made == [image_id]  # the others waited for the one that unpacked it
    assert sorted(p.name for p in rootfs.images_root().iterdir()) == [image_id[7:], "refs"]
    [image] = eviction.stale(set(), set())
    assert eviction.remove(image)
    eviction.tidy(set())
    assert list(rootfs.locks().iterdir()) == []  # a removed image's lock goes with it
    with ProcessPoolExecutor(4, mp_context=multiprocessing.get_context("fork")) as processes:
        assert set(processes.map(_unpack_in_a_process, [str(archive)] * 4)) == {image_id}
    assert sorted(p.name for p in rootfs.images_root().iterdir()) == [image_id[7:], "refs"]
    assert tree_of(rootfs.unpacked(image_id)) == expected_tree()


# -- names ---------------------------------------------------------------------------------


def test_familiar_names_are_dockers():
    assert rootfs.familiar("busybox") == "busybox:latest"
    assert rootfs.familiar("docker.io/library/busybox:1") == "busybox:1"
    assert rootfs.familiar("localhost:5000/a/b") == "localhost:5000/a/b:latest"
    assert rootfs.familiar("a@sha256:" + "1" * 64) == "a@sha256:" + "1" * 64


def engine_table(state: Path, names: dict) -> None:
    table = Path(rootfs.DOCKER_ROOT, "image", "overlay2", "repositories.json")
    table.parent.mkdir(parents=True, exist_ok=True)
    table.write_text(json.dumps({"Repositories": {name.split(":")[0]: {name: image_id} for name, image_id in names.items()}}))


def test_lookup_needs_no_engine_and_the_engines_own_table_wins(tmp_path, state):
    one = archives.from_docker_archive(docker_save(tmp_path / "1.tar", [layer(entry("v", data=b"1"))], tags=("t/img:1",))[0])
    two = archives.from_docker_archive(docker_save(tmp_path / "2.tar", [layer(entry("v", data=b"2"))], tags=("t/img:2",))[0])
    assert rootfs.lookup("t/img:1") == one and rootfs.lookup("docker.io/t/img:1") == replace(one, name="docker.io/t/img:1")
    assert rootfs.lookup(one.id) == one and rootfs.lookup("t/img:3") is None
    rootfs.remember(replace(one, name="t/engine:1"), "engine")
    assert rootfs.lookup("t/engine:1").id == one.id  # the engine's table cannot be read: refs/ it is
    engine_table(state, {"t/img:1": two.id})
    assert rootfs.lookup("t/img:1").id == two.id  # re-tagged in the engine
    assert rootfs.lookup("t/img:2").id == two.id  # a name loaded from a file, which the engine does not hold
    assert rootfs.lookup("t/engine:1") is None  # a name the engine has dropped
    engine_table(state, {"t/img:1": "sha256:" + "9" * 64})
    assert rootfs.lookup("t/img:1") is None  # the engine's image is not unpacked: the caller asks the engine
    os.environ["DOCKER_HOST"] = "tcp://elsewhere:2375"
    try:
        assert rootfs.lookup("t/img:1") == one  # another host's engine: its table is not this one
    finally:
        del os.environ["DOCKER_HOST"]


# -- gc ------------------------------------------------------------------------------------


def test_stale_images_are_exactly_the_unused_unnamed_ones_and_tidy_takes_dead_makers_scratch_and_their_names(tmp_path):
    made = [archives.from_docker_archive(docker_save(tmp_path / f"{n}.tar", [layer(entry("v", data=str(n).encode()))], tags=(f"t/img:{n}",))[0]) for n in range(3)]
    used, named, stale = made
    root = rootfs.images_root()
    dead = root / ".making-999999999-12345-abcd"
    (dead / "rootfs" / "ro").mkdir(parents=True)
    os.chmod(dead / "rootfs" / "ro", 0o555)
    alive = root / f".making-{owner_tag()}-efgh"
    alive.mkdir()
    rootfs.remember(replace(stale, name="t/also-stale:1"), "engine")
    assert eviction.stale({used.id}, {named.id}) == [root / stale.id[7:]]
    assert eviction.remove(root / stale.id[7:])
    eviction.tidy({named.id})
    assert sorted(p.name for p in root.iterdir()) == sorted([alive.name, "refs", used.id[7:], named.id[7:]])
    assert sorted(p.name for p in rootfs.locks().iterdir()) == sorted([used.id[7:], named.id[7:]])
    assert {r["name"] for _, r in rootfs.refs()} == {"t/img:0", "t/img:1"}
    assert rootfs.lookup("t/img:2") is None and eviction.stale({used.id}, {named.id}) == []


def test_evict_weighs_each_image_that_goes_and_says_why_and_a_dry_run_removes_nothing(tmp_path, monkeypatch):
    def load(name, tag, data):
        return archives.from_docker_archive(docker_save(tmp_path / f"{name}.tar", [layer(entry("f", data=data))], tags=(tag,))[0])

    replaced = load("replaced", "t/img:1", b"r" * 5000)
    load("current", "t/img:1", b"c" * 100)  # t/img:1 means this one now
    busy = load("busy", "t/busy:1", b"b" * 100)
    rootfs.remember(replace(busy, name="t/busy:1"), "engine")  # the engine named it, and has it no more
    idle = load("idle", "t/idle:1", b"i" * 3000)
    changed = load("changed", "t/changed:1", b"x" * 700)
    root = rootfs.images_root()
    (root / idle.id[7:] / "used").touch()
    long_ago = int(time.time()) - 3 * 86400
    os.utime(root / idle.id[7:] / "used", (long_ago, long_ago))
    (root / changed.id[7:] / "rootfs" / "f").write_bytes(b"y" * 700)  # as big as it was: its seal sees it all the same
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    (tmp_path / "config" / "quinebox").mkdir(parents=True)
    (tmp_path / "config" / "quinebox" / "config.yaml").write_text("retention: {images: 2d}\n")

    def held(image):
        directory = root / image.id[7:]
        return sum((directory / name).stat().st_size for name in ("rootfs/f", "image.json", "seal.json"))

    expected = sorted(
        [
            (replaced.id[7:], eviction.STALE, held(replaced)),
            (idle.id[7:], "no box has used it for 2d (retention: images in config.yaml)", held(idle)),
            (changed.id[7:], seal.changed(root / changed.id[7:], root / changed.id[7:] / "rootfs"), held(changed)),
        ]
    )
    before = sorted(p.name for p in root.iterdir())
    dry = eviction.evict({busy.id[7:]}, set(), dry=True)
    assert [(e.name, e.why, e.size) for e in dry] == expected and sorted(p.name for p in root.iterdir()) == before
    assert [e.used for e in dry if e.name == idle.id[7:]] == [long_ago]
    done = eviction.evict({busy.id[7:]}, set())
    assert done == dry
    assert sorted(p.name for p in root.iterdir()) == sorted(set(before) - {e.name for e in done})
    assert eviction.evict({busy.id[7:]}, set()) == []
    assert [e.name for e in eviction.evict(set(), set())] == [busy.id[7:]]  # once no box uses it


def test_current_ids_are_every_files_image_and_the_engines(tmp_path):
    loaded = archives.from_docker_archive(docker_save(tmp_path / "1.tar", [layer()], tags=("t/img:1",))[0])
    engine = ImageInfo(name="t/engine:1", id="sha256:" + "e" * 64)
    rootfs.remember(engine, "engine")
    assert eviction.current_ids({"sha256:" + "f" * 64}) == {loaded.id, "sha256:" + "f" * 64}
    assert eviction.current_ids(None) == {loaded.id, engine.id}


# -- the engine's stream has a deadline ----------------------------------------------------


def test_an_engine_that_stops_sending_mid_export_is_an_engine_error_and_leaves_nothing(tmp_path):
    import socketserver
    from http.server import BaseHTTPRequestHandler

    import docker

    from quinebox.box.backends.docker.engine import DockerBackend

    seen = []

    class Stalling(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def reply(self, status, body=b"", length=None):
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body) if length is None else length))
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()

        def do_POST(self):
            seen.append(("POST", self.path.split("?")[0]))
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.reply(201, b'{"Id": "fake"}')

        def do_GET(self):
            seen.append(("GET", self.path))
            self.reply(200, layer(entry("a", data=b"a" * 10_000))[:4096], length=1 << 20)
            time.sleep(5)

        def do_DELETE(self):
            seen.append(("DELETE", self.path.split("?")[0]))
            self.reply(204)

    class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = True

    sock = str(tmp_path / "engine.sock")
    server = Server(sock, Stalling)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        backend = DockerBackend(docker.APIClient(base_url=f"unix://{sock}", version="1.41", timeout=1))
        started = time.monotonic()
        with pytest.raises(EngineError, match="stopped sending image .* mid-way"):
            rootfs.from_engine(backend, ImageInfo(name="stalled", id="sha256:" + "a" * 64))
        assert time.monotonic() - started < 4
    finally:
        server.shutdown()
        server.server_close()
    assert [s for s in seen if s[0] != "GET"] == [("POST", "/v1.41/containers/create"), ("DELETE", "/v1.41/containers/fake")]
    assert rootfs.unpacked("sha256:" + "a" * 64) is None and [p.name for p in rootfs.images_root().iterdir()] == []
