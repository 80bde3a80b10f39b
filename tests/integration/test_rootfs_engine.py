"""The agent image unpacked from the real engine, once; after that, no engine call at all."""

import json
import os
import stat
from dataclasses import asdict
from pathlib import Path

import pytest

from quinebox.box.backends.docker.engine import DockerBackend
from quinebox.box.images import archives, rootfs
from quinebox.box.images.lookup import resolve_image
from quinebox.box.policy import LABEL_OWNER, LABEL_SESSION
from quinebox.box.spec import DEFAULT_IMAGE
from quinebox.processes import owner_id

#: What the engine's never-started container adds to an image (its init layer), beside the image's own files.
INIT_LAYER = {".dockerenv", "etc/hostname", "etc/hosts", "etc/resolv.conf", "etc/mtab", "dev/console", "dev/pts", "dev/shm"}


class NoEngine:
    """A backend for a frozen or stopped engine: any call fails the test."""

    def __getattr__(self, name):
        raise AssertionError(f"an engine call ({name}) for an image already unpacked")


@pytest.fixture(scope="module")
def state(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        path = tmp_path_factory.mktemp("rootfs-state")
        patch.setenv("QUINEBOX_STATE_DIR", str(path))
        yield path


@pytest.fixture(scope="module")
def agent(state):
    backend = DockerBackend.connect()
    info = resolve_image(backend, DEFAULT_IMAGE, pull="never")
    return info, rootfs.from_engine(backend, info)


def listing(root: Path) -> dict:
    found = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(top, name)
            st = path.lstat()
            target = os.readlink(path) if stat.S_ISLNK(st.st_mode) else None
            size = st.st_size if stat.S_ISREG(st.st_mode) else None
            found[str(path.relative_to(root))] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, size, target, int(st.st_mtime))
    return found


def test_the_agent_image_unpacks_from_the_engine_with_its_runtime_and_config(agent, state):
    info, root = agent
    assert root == state / "images" / info.id.split(":")[1] / "rootfs"
    assert (root / ".quinebox" / "lib" / "ld.so").is_file()
    assert os.path.lexists(root / "bin" / "sh") and (root / "usr" / "bin" / "sh").exists()
    assert json.loads((root.parent / "image.json").read_text()) == {**json.loads(json.dumps(asdict(info))), "source": "engine"}
    assert rootfs.image_info(info.id) == info
    assert not list((state / "images").glob(".making-*"))
    world = (root / "world").lstat()
    assert (world.st_uid, world.st_gid) == (1000, 1000)  # the image's owners are kept
    assert not any(m[1] & 0o6000 for m in listing(root).values() if m[0] == stat.S_IFREG)


def test_a_second_use_makes_no_engine_call(agent):
    info, root = agent
    assert rootfs.from_engine(NoEngine(), info) == root  # type: ignore[arg-type]
    assert rootfs.unpacked(info.id) == root
    assert rootfs.lookup(DEFAULT_IMAGE) == info


def test_no_container_is_left_behind(agent, engine):
    left = engine.containers.list(all=True, filters={"label": [f"{LABEL_SESSION}=image-export", f"{LABEL_OWNER}={owner_id()}"]})
    assert left == []


def test_the_agent_images_docker_save_tarball_unpacks_into_the_same_tree(agent, engine, tmp_path, monkeypatch):
    """The engine's flattening and our own layer applier agree on a real image's layers."""
    info, exported = agent
    tarball = tmp_path / "agent.tar"
    with open(tarball, "wb") as out:
        for chunk in engine.images.get(DEFAULT_IMAGE).save(named=True):
            out.write(chunk)
    monkeypatch.setenv("QUINEBOX_STATE_DIR", str(tmp_path / "state"))
    loaded = archives.from_docker_archive(tarball)
    assert loaded.id == info.id
    assert (loaded.env, loaded.workdir, loaded.entrypoint, loaded.cmd, loaded.arch) == (info.env, info.workdir, info.entrypoint, info.cmd, info.arch)
    def comparable(found: dict) -> dict:  # the init layer's files changed their directories' mtimes
        return {p: m[:-1] if p in {"dev", "etc"} else m for p, m in found.items() if p not in INIT_LAYER}

    assert comparable(listing(rootfs.unpacked(info.id))) == comparable(listing(exported))
