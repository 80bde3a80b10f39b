"""`exec(..., user="root")` in a long-lived box: honored where the box has a user namespace of its own (runc, made by
root or rootless), whose 0 is no one outside and holds no capability; refused in one line where root would be the
host's (the Docker engine, gVisor).

In CI's rootless pass the runc cases run as a rootless box (its 0 is the caller), the others are deselected.
"""

import os
import time

import pytest
from commands import ROOTLESS, qb, wait_for

import quinebox
from quinebox.box.backends.oci import idmap
from quinebox.errors import GrantError, QuineboxError

#: The controls a root exec must still be under: no capability in any set, no-new-privs, our seccomp (filter mode).
STATUS = "grep -E '^(Uid|Gid|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status"


def host_status(box: quinebox.Sandbox, marker: str) -> dict[str, str]:
    """/proc/PID/status on the host of the box's process whose command line holds `marker`."""
    def found() -> dict[str, str] | None:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if marker.encode() not in f.read():
                        continue
                with open(f"/proc/{pid}/cgroup") as f:
                    if box.id not in f.read():
                        continue
                with open(f"/proc/{pid}/status") as f:
                    return dict(line.split(":\t", 1) for line in f.read().splitlines() if ":\t" in line)
            except OSError:
                continue
        return None
    return wait_for(found, timeout=10, every=0.02, what=f"the box's process {marker}")


@pytest.mark.parametrize("user", ["root", "0", "0:0"])
def test_root_in_a_runc_box_is_its_namespaces_root_with_no_capability(user):
    with quinebox.Sandbox(backend="oci", runtime="runc") as box:
        result = box.exec(["sh", "-c", f"id -u; id -g; {STATUS}"], user=user)
        assert result.returncode == 0, result
        lines = result.stdout.decode().splitlines()
        assert lines[:2] == ["0", "0"], lines
        status = dict(line.split(":\t", 1) for line in lines[2:])
        for caps in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
            assert status[caps] == "0000000000000000", status
        assert (status["NoNewPrivs"], status["Seccomp"]) == ("1", "2"), status
        # Seen from the host, the exec's uid is no one's: the box's slot's first id (idmap.py), or a rootless box's caller.
        marker = f"{os.urandom(4).hex()}"
        proc = box.Popen(["sh", "-c", f"sleep 30; : {marker}"], user=user, stdin=quinebox.DEVNULL)
        try:
            seen = host_status(box, marker)
        finally:
            proc.kill()
            proc.wait()
        uid, gid = int(seen["Uid"].split()[0]), int(seen["Gid"].split()[0])
        if ROOTLESS:
            assert (uid, gid) == (os.getuid(), os.getgid())
        else:
            ids = idmap.holding(uid)
            assert uid != 0 and ids is not None and uid == gid == ids.first, seen
        assert seen["CapEff"] == "0000000000000000" and seen["NoNewPrivs"] == "1", seen


@pytest.mark.root_only  # a rootless box's image is the host's root's, which its namespace does not map
def test_root_may_change_what_the_images_root_owns_in_a_writable_root_and_the_image_stays_as_it_was():
    with quinebox.Sandbox(backend="oci", runtime="runc", grants=["rootfs:rw"]) as box:
        root = box.exec(["sh", "-c", "echo x > /etc/x && cat /etc/x && mkdir -p /logs/verifier && stat -c '%u %U' /etc/x /logs/verifier /etc/passwd"], user="root")
        assert root.stdout == b"x\n0 root\n0 root\n0 root\n", root
        # The box's own user may not: the image's root owns /etc, and nobody holds a capability.
        agent = box.exec(["sh", "-c", "echo y > /etc/y"])
        assert agent.returncode != 0 and b"Permission denied" in agent.stderr, agent
    with quinebox.Sandbox(backend="oci", runtime="runc", grants=["rootfs:rw"]) as box:
        assert box.exec(["sh", "-c", "ls /etc/x /logs"]).returncode != 0  # nothing of the last box's


@pytest.mark.root_only  # a rootless box's mount points are its runtime's, made in its own namespace as its root
def test_the_boxs_root_owns_the_mount_points_made_for_grants_and_writes_beside_them(tmp_path):
    """Harbor mounts /logs/verifier and its agent makes /logs/agent as root: the directories quinebox makes on the
    way to a grant's mount point in a writable root are the box's root's, not the host's root's (nobody in the box)."""
    (tmp_path / "verifier").mkdir()
    (tmp_path / "note").write_text("n\n")
    grants = ["rootfs:rw", f"ro:{tmp_path / 'verifier'}=/logs/verifier", f"ro:{tmp_path / 'note'}=/srv/data/note"]
    with quinebox.Sandbox(backend="oci", runtime="runc", grants=grants) as box:
        made = box.exec(["sh", "-c", "stat -c '%u %g %a' /logs /srv/data && mkdir /logs/agent && touch /srv/data/other && cat /srv/data/note"], user="root")
        assert (made.returncode, made.stdout) == (0, b"0 0 755\n0 0 755\nn\n"), made
        # The image's own directories keep their owners, and the box's own user still may not write there.
        user = box.exec(["sh", "-c", "stat -c %u /srv; mkdir /logs/user"])
        assert (user.stdout, user.returncode) == (b"0\n", 1) and b"Permission denied" in user.stderr, user


@pytest.mark.root_only  # as above: the image's root-owned tree
@pytest.mark.parametrize("attached", [False, True])
def test_files_go_in_and_out_as_root_where_root_is_honored(attached):
    """What Harbor does with /solution and /tests: a tree unpacked at the top of the box's root by its root, owned by
    root; the box's own user may not make it there. Through the box's owner (attached) as well as in-process."""
    import io
    import tarfile

    def tree() -> io.BytesIO:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo("solve.sh")
            info.size, info.mode = 10, 0o755
            tar.addfile(info, io.BytesIO(b"echo done\n"))
        buf.seek(0)
        return buf

    made = quinebox.Sandbox.detached(backend="oci", runtime="runc", grants=["rootfs:rw"], ttl="5m") if attached else None
    with quinebox.Sandbox.connect(made.id) if made else quinebox.Sandbox(backend="oci", runtime="runc", grants=["rootfs:rw"]) as box:
        try:
            with pytest.raises(PermissionError):
                box.put_tar("/solution", tree())
            box.put_tar("/solution", tree(), user="root")
            assert box.read_file("/solution/solve.sh") == b"echo done\n"
            info = box.stat("/solution/solve.sh", user="0")
            assert (info.type, info.mode & 0o777) == ("file", 0o755), info
            assert box.exec(["stat", "-c", "%u %g", "/solution", "/solution/solve.sh"]).stdout == b"0 0\n0 0\n"
            box.remove("/solution", recursive=True, user="root")
            assert box.exec(["test", "-e", "/solution"]).returncode == 1
        finally:
            if made:
                made.destroy()


@pytest.mark.parametrize("where", ["docker", "runsc"])
def test_root_is_refused_in_one_line_where_the_box_has_no_user_namespace_of_its_own(where):
    backend, runtime = ("docker", None) if where == "docker" else ("oci", "runsc")
    with quinebox.Sandbox(backend=backend, runtime=runtime) as box:
        for user in ("root", "0", "1000:0"):
            with pytest.raises(GrantError) as refused:
                box.exec(["id"], user=user)
            said = str(refused.value)
            assert isinstance(refused.value, QuineboxError) and "\n" not in said
            assert said.startswith(f"refused user {user!r}: nothing in a box runs as root (uid or gid 0) but in a user namespace of its own that maps it"), said
        assert box.exec(["id", "-u"], user="4242").stdout == b"4242\n"  # any other user still


@pytest.mark.parametrize("where", ["runc", "docker"])
def test_exec_in_with_user_root_on_the_command_line(where):
    made = qb("box", "create", *(["--backend", "docker"] if where == "docker" else ["--backend", "oci", "--runtime", "runc"]), "--ttl", "5m")
    assert made.returncode == 0, made.stderr
    box = made.stdout.decode().strip()
    try:
        done = qb("exec", "--in", box, "--user", "root", "--", "id", "-u")
        if where == "docker":
            assert done.returncode == 125 and done.stdout == b"", done
            assert done.stderr.count(b"\n") == 1 and b"nothing in a box runs as root" in done.stderr, done.stderr
        else:
            assert (done.returncode, done.stdout) == (0, b"0\n"), done.stderr
    finally:
        qb("box", "rm", box)
        until = time.monotonic() + 30
        while qb("box", "ls").stdout.find(box.encode()) >= 0 and time.monotonic() < until:
            time.sleep(0.1)


@pytest.mark.parametrize("user", ["⁰", "1000:²"])
def test_a_user_in_other_digits_is_a_bad_user_and_the_boxs_owner_goes_on(user):
    """'⁰' is a digit to str.isdigit and not to int(): it once killed the owner's exec handler (review 49, finding 8)."""
    made = qb("box", "create", "--backend", "oci", "--runtime", "runc", "--ttl", "5m")
    assert made.returncode == 0, made.stderr
    box = made.stdout.decode().strip()
    try:
        done = qb("exec", "--in", box, "--user", user, "--", "id", "-u")
        assert done.returncode == 125 and done.stdout == b"", done
        assert done.stderr.count(b"\n") == 1 and done.stderr.startswith(f"quinebox: bad user {user!r}".encode()), done.stderr
        assert qb("exec", "--in", box, "--", "true").returncode == 0
    finally:
        qb("box", "rm", box)
