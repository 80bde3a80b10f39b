"""`rootfs:rw`: a box's root is writable in a layer of its own, bounded, gone with the box; the image cache never
written; every other control as it was. Without the grant the root stays read-only (EROFS).

On runc made by root and on gVisor; the Docker engine, which cannot bound its container layer, refuses the grant in
one line. In CI's rootless pass (a user who is not root) the runc case runs as a rootless box and the others are
deselected (tests/conftest.py).
"""

import glob
import hashlib
import os
import subprocess

import pytest
from commands import QUINEBOX, ROOTLESS
from live_boxes import soon

import quinebox
from quinebox.box.backends.oci.boxroot import BUNDLE_RECORD, SHM, _shared_memory_layer, bundle_of
from quinebox.box.policy_host import HOST_ROOT_LAYER

#: Where the box runs, as the rootless pass's deselection reads a case's parameter (tests/conftest.py).
WHERE = ["runc", "runsc", "docker"]
#: Where a box may hold `rootfs:rw`: a root-made box's layer is a tmpfs sized by `tmp:`, on runc and gVisor alike
#: (a rootless box's is bounded by its memory cgroup: docs/grants.md).
BOUNDED = ["runc", "runsc"]


def image_caches() -> list[str]:
    """Every unpacked image tree the boxes' roots may lie over: this test session's and the machine's shared one."""
    state = os.environ["QUINEBOX_STATE_DIR"]
    return sorted(glob.glob(f"{state}/images/*/rootfs") + glob.glob("/var/lib/quinebox/images/*/rootfs"))


def digest(trees: list[str]) -> str:
    """What each tree holds: every entry's path, type, mode, owner, size and mtime, and the bytes of its /etc and
    /var/tmp, where the boxes write."""
    h = hashlib.sha256()
    for tree in trees:
        for top, dirs, files in os.walk(tree):
            dirs.sort()
            for name in sorted(dirs + files):
                path = os.path.join(top, name)
                st = os.lstat(path)
                h.update(f"{os.path.relpath(path, tree)} {st.st_mode} {st.st_uid} {st.st_gid} {st.st_size} {st.st_mtime_ns}\n".encode())
                rel = os.path.relpath(path, tree)
                if os.path.isfile(path) and not os.path.islink(path) and rel.startswith(("etc/", "var/tmp/")) and st.st_size < 1 << 20:
                    try:
                        with open(path, "rb") as f:
                            h.update(f.read())
                    except PermissionError:
                        pass
    return h.hexdigest()


def leftovers(session: str) -> list[str]:
    """What the host still holds of a box's root: its bundle, a mount naming it, a rootless layer in /dev/shm."""
    found = [str(bundle_of(session))] if bundle_of(session).exists() else []
    with open("/proc/self/mountinfo") as f:
        found += [line.split()[4] for line in f if session in line]
    found += glob.glob(f"{SHM}/quinebox-*-{session}.oci-*")
    return found


@pytest.fixture(params=WHERE)
def where(request):
    """(backend, runtime) of each case."""
    return ("docker", None) if request.param == "docker" else ("oci", request.param)


@pytest.mark.parametrize("runtime", BOUNDED)
def test_the_write_lands_in_the_boxs_own_layer_and_goes_with_it(runtime):
    backend = "oci"
    with quinebox.Sandbox(backend=backend, runtime=runtime, grants=["rootfs:rw"]) as box:
        caches = image_caches()  # the box's image unpacked by now (on an OCI runtime), its writes still to come
        assert caches
        before = digest(caches)
        result = box.exec(["sh", "-c", "echo x > /var/tmp/x && cat /var/tmp/x && mkdir -p /opt/made/deep && touch /opt/made/deep/f 2>&1; echo $?"])
        assert result.stdout.split(b"\n")[0] == b"x", result
        assert box.exec(["cat", "/var/tmp/x"]).stdout == b"x\n"
        # Every other control as it was: no capability, no-new-privs, our seccomp, the box's user, not the host's root.
        status = box.exec(["sh", "-c", "grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status; id -u"]).stdout.decode()
        assert "CapEff:\t0000000000000000" in status and "CapBnd:\t0000000000000000" in status, status
        if runtime != "runsc":  # gVisor's /proc says neither: test_gvisor.py asks its kernel by prctl
            assert "NoNewPrivs:\t1" in status and "Seccomp:\t2" in status, status
        assert status.split()[-1] == ("0" if ROOTLESS else "1000"), status
        session = box.id
    # The box is gone and with it its layer: no bundle, no mount, no layer in /dev/shm.
    assert soon(lambda: leftovers(session)) == []
    # The image cache is as it was, and a new box of the same image sees nothing of what the last one wrote.
    assert digest(image_caches()) == before and caches == image_caches()
    with quinebox.Sandbox(backend=backend, runtime=runtime, grants=["rootfs:rw"]) as box:
        assert box.exec(["sh", "-c", "ls /var/tmp/x /opt/made"]).returncode != 0


@pytest.mark.root_only  # the Docker engine: the rootless pass's user has none
def test_the_engine_refuses_the_grant_in_one_line_and_starts_nothing(engine):
    """overlay2 over the host's disk takes no size: a writable root there would be unbounded, so it is refused."""
    marker = f"refused-{os.getpid()}"
    fill = f"dd if=/dev/zero of=/var/tmp/big bs=1M count=16; sleep 5 # {marker}"
    done = subprocess.run([QUINEBOX, "exec", "--backend", "docker", "-g", "rootfs:rw", "-g", "tmp:8m", "--", "sh", "-c", fill], capture_output=True, timeout=120)
    assert done.returncode == 125 and done.stdout == b"", done
    said = done.stderr.decode()
    assert said.count("\n") == 1 and "rootfs:rw" in said and said.endswith("use --backend oci\n"), said
    assert [c for c in engine.api.containers(all=True) if marker in c["Command"]] == []
    with pytest.raises(quinebox.QuineboxError, match="use --backend oci$"):
        quinebox.Sandbox(backend="docker", grants=["rootfs:rw"])


@pytest.mark.parametrize("runtime", BOUNDED)
def test_the_hosts_own_root_is_never_a_writable_one(runtime):
    """`--image host`: rootless, the root would be a directory of the bundle's on the state dir's disk, unbounded;
    made by root, an idmapped view of the host's `/` (its secrets the box root's). Refused by rule, nothing made."""
    before = sorted(glob.glob(f"{os.environ['QUINEBOX_STATE_DIR']}/run/*.oci")), sorted(glob.glob(f"{SHM}/quinebox-{os.getuid()}-*"))
    done = subprocess.run([QUINEBOX, "exec", "--backend", "oci", "--runtime", runtime, "--image", "host", "-g", "rootfs:rw", "-g", "tmp:8m", "--",
                           "sh", "-c", "dd if=/dev/zero of=/var/tmp/big bs=1M count=16"], capture_output=True, timeout=120)
    assert (done.returncode, done.stdout) == (125, b""), done
    assert done.stderr == f"quinebox: {HOST_ROOT_LAYER}\n".encode(), done.stderr
    assert (sorted(glob.glob(f"{os.environ['QUINEBOX_STATE_DIR']}/run/*.oci")), sorted(glob.glob(f"{SHM}/quinebox-{os.getuid()}-*"))) == before


def test_without_the_grant_the_root_is_read_only(where):
    backend, runtime = where
    with quinebox.Sandbox(backend=backend, runtime=runtime) as box:
        result = box.exec(["sh", "-c", "echo x > /var/tmp/x"])
        assert result.returncode != 0 and b"Read-only file system" in result.stderr, result


@pytest.mark.root_only  # a rootless box's layer, in /dev/shm, is bounded by its memory cgroup instead (docs/grants.md)
@pytest.mark.parametrize("runtime", BOUNDED)
def test_the_layer_holds_what_tmp_grants_and_no_more(runtime):
    with quinebox.Sandbox(backend="oci", runtime=runtime, grants=["rootfs:rw", "tmp:8m"]) as box:
        result = box.exec(["sh", "-c", "dd if=/dev/zero of=/var/tmp/big bs=1M count=16 2>&1; echo status $?"])
        assert b"No space left on device" in result.stdout and not result.stdout.endswith(b"status 0\n"), result
        assert box.exec(["sh", "-c", "rm /var/tmp/big && echo fits > /var/tmp/small && cat /var/tmp/small"]).stdout == b"fits\n"


def test_quinebox_exec_takes_the_grant_on_the_command_line():
    done = subprocess.run([QUINEBOX, "exec", "-g", "rootfs:rw", "--", "sh", "-c", "echo x > /var/tmp/x; cat /var/tmp/x"], capture_output=True, timeout=120)
    assert (done.returncode, done.stdout) == (0, b"x\n"), done.stderr
    done = subprocess.run([QUINEBOX, "exec", "--", "sh", "-c", "echo x > /var/tmp/x"], capture_output=True, timeout=120)
    assert done.returncode == 2 and b"Read-only file system" in done.stderr, done.stderr


@pytest.mark.parametrize("runtime", ["runsc"])  # where quinebox takes snapshots
def test_a_snapshot_of_a_writable_root_is_refused_before_anything_stops(runtime):
    with quinebox.Sandbox(backend="oci", runtime=runtime, grants=["rootfs:rw"]) as box:
        box.exec(["sh", "-c", "echo x > /var/tmp/x"])
        with pytest.raises(quinebox.QuineboxError, match=r"holds rootfs:rw: what it wrote to its root is in a layer of its own on the host, which a snapshot cannot carry$"):
            box.checkpoint()
        assert box.exec(["cat", "/var/tmp/x"]).stdout == b"x\n"  # the box goes on as it was


def test_gc_sweeps_a_rootless_layer_whose_bundle_went_without_it(tmp_path):
    """A rootless box's layer lives in /dev/shm, found by its bundle's link: one whose bundle went with its state dir
    (CI's rootless pass removes its own) held what its box wrote in RAM for good. Each records its bundle; `gc`
    removes those whose bundle is gone, and leaves one whose bundle is there or that records none."""
    gone, kept = tmp_path / "gone.oci", tmp_path / "kept.oci"
    gone.mkdir()
    kept.mkdir()
    orphan, held = _shared_memory_layer(gone), _shared_memory_layer(kept)
    unrecorded = _shared_memory_layer(tmp_path)  # as one made before records were (or being made this instant)
    try:
        assert str(orphan).startswith(f"{SHM}/quinebox-{os.getuid()}-gone.oci-") and (orphan / BUNDLE_RECORD).read_text() == str(gone)
        (orphan / "upper").mkdir()
        (orphan / "upper" / "big").write_bytes(b"x" * 4096)
        (unrecorded / BUNDLE_RECORD).unlink()
        (gone / "layer").unlink()
        gone.rmdir()  # the state dir removed, the layer left behind
        done = subprocess.run([QUINEBOX, "gc"], capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert not orphan.exists() and held.is_dir() and unrecorded.is_dir()
    finally:
        for layer in (orphan, held, unrecorded):
            subprocess.run(["rm", "-rf", str(layer)], timeout=30)
