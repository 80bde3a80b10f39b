"""Boxes made by a user who is not root and may not use the engine: CI's rootless pass alone collects this file
(tests/conftest.py), as that user.

What the kernel holds each such box to, read from inside it and from the host: its own user namespace whose uid
0 is the caller, no capability, a read-only root, only `lo`, its limits in the user's delegated cgroup, an OOM
kill told as one; the image's tree never written; nothing left once it ends; gVisor refused in one line.
"""

import glob
import hashlib
import json
import os
import subprocess
from pathlib import Path

from commands import QUINEBOX, qb


def in_box(script: str, *grants: str, image: str | None = None) -> subprocess.CompletedProcess:
    return qb("exec", *(["--image", image] if image else []), *(a for g in grants for a in ("-g", g)), "--", "sh", "-c", script, timeout=120)


def test_the_callers_uid_is_the_boxs_0_and_it_holds_nothing():
    done = in_box("cat /proc/self/uid_map; grep -E '^Cap(Eff|Prm|Bnd)|^NoNewPrivs' /proc/self/status")
    assert done.returncode == 0, done.stderr
    first = done.stdout.decode().splitlines()[0].split()
    assert first == ["0", str(os.getuid()), "1"]  # never the host's root: the caller, once
    status = done.stdout.decode()
    assert "CapEff:\t0000000000000000" in status and "CapPrm:\t0000000000000000" in status and "CapBnd:\t0000000000000000" in status
    assert "NoNewPrivs:\t1" in status


def test_what_the_kernel_refuses_a_rootless_box():
    done = in_box("touch /usr/x 2>&1; mount -t tmpfs t /mnt 2>&1; ls /sys/class/net; unshare -U true 2>&1; echo end")
    said = done.stdout.decode()
    assert "Read-only file system" in said and "permission denied" in said.lower()
    assert "\nlo\n" in said and "eth0" not in said
    assert said.endswith("end\n")


def test_limits_are_in_the_users_delegated_cgroup_and_an_oom_kill_is_told():
    done = in_box("cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/pids/pids.max", "mem:64m", "pids:20")
    assert (done.returncode, done.stdout) == (0, b"67108864\n20\n"), done.stderr
    oom = in_box("python3 -c 'b = bytearray(256 << 20)'", "mem:64m")
    assert oom.returncode == 137 and b"out of memory" in oom.stderr


def test_a_box_leaves_no_cgroup_bundle_or_layer_behind(tmp_path):
    proc = subprocess.Popen([QUINEBOX, "exec", "--json", "--", "true"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    session = json.loads(err.decode().splitlines()[-1])["session"]
    assert not glob.glob(f"/sys/fs/cgroup/*/quinebox.user-{os.getuid()}/quinebox-{session}")
    assert not glob.glob(f"/dev/shm/quinebox-{os.getuid()}-{session}*")
    assert not list(Path(os.environ["QUINEBOX_STATE_DIR"], "run").glob(f"{session}*"))


def test_the_image_tree_is_never_written_by_a_box(tmp_path):
    note = tmp_path / "note.txt"
    note.write_text("granted")
    images = Path(os.environ["QUINEBOX_STATE_DIR"], "images")
    assert in_box("true").returncode == 0  # the image in this user's cache

    def digest() -> str:
        listing = sorted(str(p.relative_to(images)) for p in images.rglob("*") if "/rootfs/" in str(p))
        return hashlib.sha256("\n".join(listing).encode()).hexdigest()

    before = digest()
    done = in_box("cat /opt/new/deep/note.txt", f"ro:{note}=/opt/new/deep/note.txt")
    assert (done.returncode, done.stdout) == (0, b"granted"), done.stderr
    assert digest() == before


def test_files_a_box_makes_in_a_granted_directory_are_the_callers(tmp_path):
    done = in_box(f"echo made > {tmp_path}/made", f"rw:{tmp_path}")
    assert done.returncode == 0, done.stderr
    made = (tmp_path / "made").stat()
    assert (made.st_uid, made.st_gid) == (os.getuid(), os.getgid())


def test_the_hosts_own_tools_and_none_of_its_data():
    done = in_box("command -v python3 >/dev/null && echo tools; find /home /root /var -mindepth 1 | wc -l; wc -c < /etc/shadow", image="host")
    assert (done.returncode, done.stdout) == (0, b"tools\n0\n0\n"), done.stderr


def test_gvisor_is_refused_in_one_line_and_starts_nothing():
    done = qb("exec", "--runtime", "runsc", "--", "true")
    assert done.returncode == 125 and done.stderr.count(b"\n") == 1
    assert b"runsc" in done.stderr and b"use runc" in done.stderr


def test_doctor_says_boxes_run_rootless_on_runc():
    said = qb("doctor").stderr
    assert b"ok   runc: runs boxes here" in said and b"ok   default: boxes run on the OCI runtime runc" in said, said
    assert b"not root, and gVisor's runsc" in said
