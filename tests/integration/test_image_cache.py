"""What one box was granted is no later box's business: the image every box starts from never changes, on every
backend (runc, gVisor's runsc, bubblewrap, the engine), and `gc` removes an unpacked image that something else changed."""

import json
import os
import shutil
import socket
from pathlib import Path

import pytest
from commands import qb

import quinebox
from quinebox.box.backends.oci import boxroot
from quinebox.box.configure import unpacked_image
from quinebox.box.images import rootfs, seal
from quinebox.box.policy import LABEL_OWNER
from quinebox.box.spec import DEFAULT_IMAGE
from quinebox.processes import process_start_ticks
from quinebox.state import run_dir, state_dir

BACKENDS = {"runc": ("oci", "runc"), "runsc": ("oci", "runsc"), "bwrap": ("bwrap", ""), "engine": ("docker", "")}
#: What a later box finds where the earlier box's grants were.
PROBE = "import json, os; print(json.dumps({p: os.path.lexists(p) for p in ('/notes.txt', '/tmp/x', '/opt/newdir')}))"
NO_TRACE = b'{"/notes.txt": false, "/tmp/x": false, "/opt/newdir": false}\n'


@pytest.fixture(params=sorted(BACKENDS))
def backend(request, monkeypatch, engine):
    kind, runtime = BACKENDS[request.param]
    monkeypatch.setenv("QUINEBOX_BACKEND", kind)
    if runtime:
        monkeypatch.setenv("QUINEBOX_RUNTIME", runtime)
    else:
        monkeypatch.delenv("QUINEBOX_RUNTIME", raising=False)
    return request.param


def image_tree() -> Path:
    """The agent image's unpacked tree, unpacked first if it is not, as the OCI backend unpacks it."""
    return Path(unpacked_image(DEFAULT_IMAGE, pull="never")[1])


def mounts_of_the_state_dir() -> list[str]:
    with open("/proc/self/mountinfo") as table:
        return [line.split()[4] for line in table if line.split()[4].startswith(str(state_dir()))]


def test_a_later_box_sees_no_trace_of_an_earlier_boxs_grants(backend, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_bytes(b"for the first box only\n")
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    deep = tmp_path / "deep"
    deep.mkdir()
    (deep / "f").write_bytes(b"deep down\n")
    tree = image_tree()
    sealed = (tree.parent / seal.SEAL).read_text()
    grants = [f"ro:{notes}=/notes.txt", f"rw:{shared}=/tmp/x", f"ro:{deep}=/opt/newdir/deep"]
    first = quinebox.exec(["sh", "-c", "cat /notes.txt /opt/newdir/deep/f && echo written > /tmp/x/w"], grants=grants)
    assert (first.returncode, first.stdout) == (0, b"for the first box only\ndeep down\n"), first.stderr
    assert (shared / "w").read_bytes() == b"written\n"
    later = quinebox.exec(["python3", "-c", PROBE])
    assert (later.returncode, later.stdout) == (0, NO_TRACE), later.stderr
    # The cache is what it was at its unpack, entry for entry, and the host holds no box's root mounted.
    assert seal.changed(tree.parent, tree) is None and (tree.parent / seal.SEAL).read_text() == sealed
    assert not any(os.path.lexists(tree / p) for p in ("notes.txt", "opt/newdir", "tmp/x"))
    assert mounts_of_the_state_dir() == []


def test_gc_removes_an_unpacked_image_that_was_changed_and_the_next_box_has_it_whole(monkeypatch, engine):
    monkeypatch.setenv("QUINEBOX_BACKEND", "oci")
    monkeypatch.setenv("QUINEBOX_RUNTIME", "runc")
    tree = image_tree()
    entries, _ = seal.digest(tree)
    name = tree.parent.name
    (tree / "usr" / "share" / "planted").write_bytes(b"not the image's\n")
    gc = qb("gc")
    assert gc.returncode == 0, gc.stderr
    said = f"quinebox: removed unpacked image {name[:12]}: it holds {entries + 1} entries, {entries} when it was unpacked; the next box of it unpacks it afresh\n"
    assert said.encode() in gc.stderr
    assert not tree.exists() and not [p for p in rootfs.images_root().iterdir() if p.name.startswith(rootfs.SCRATCH)]
    box = quinebox.exec(["sh", "-c", "test ! -e /usr/share/planted && echo whole"])
    assert (box.returncode, box.stdout) == (0, b"whole\n"), box.stderr
    assert seal.changed(tree.parent, tree) is None and seal.digest(tree)[0] == entries
    again = qb("gc")
    assert again.returncode == 0 and b"unpacked image" not in again.stderr and tree.is_dir()



def test_gc_detaches_and_removes_a_boxs_root_its_dead_owner_left_mounted(engine):
    """What an owner and its keeper both killed between mounting a box's root and starting its box leave behind;
    a live owner's bundle is its own."""
    tree = image_tree()
    run_dir().mkdir(parents=True, exist_ok=True)
    host = socket.gethostname()
    owners = {"0000deadbeef": f"{host}:999999999:1", "0000a11ve000": f"{host}:{os.getpid()}:{process_start_ticks(os.getpid())}"}
    for session, owner in owners.items():
        bundle = run_dir() / f"{session}.oci"
        bundle.mkdir()
        (bundle / "config.json").write_text(json.dumps({"annotations": {LABEL_OWNER: owner}}))
        boxroot.layered(str(tree), bundle)
    alive = run_dir() / "0000a11ve000.oci"
    try:
        gc = qb("gc")
        assert gc.returncode == 0, gc.stderr
        assert not (run_dir() / "0000deadbeef.oci").exists()
        assert mounts_of_the_state_dir() == [str(alive / boxroot.ROOT)]
    finally:
        boxroot.detach(alive)
        shutil.rmtree(alive)
    assert seal.changed(tree.parent, tree) is None


def test_a_box_started_under_a_tight_umask_can_still_enter_its_root(monkeypatch):
    """The merged root takes its upper layer's mode: made under umask 077, `/` would shut the box's user out."""
    monkeypatch.setenv("QUINEBOX_BACKEND", "oci")
    old = os.umask(0o077)
    try:
        result = quinebox.exec(["sh", "-c", "ls / >/dev/null && stat -c %a /"])
    finally:
        os.umask(old)
    assert (result.returncode, result.stdout, result.stderr) == (0, b"755\n", b"")
