"""A root-made box's own user namespace (backends/oci/idmap.py), as tables: the span of host ids it maps, how the
policy renders it beside every other control, how a shape leaves it out, and the slots claimed on real files."""

import os
import subprocess
import sys
from dataclasses import replace

import pytest
from test_policy import spec
from test_policy_oci import oci

from quinebox.box.backends.oci import idmap
from quinebox.box.backends.oci.boxroot import mount_points
from quinebox.box.backends.oci.policy import oci_config
from quinebox.box.shape import oci_shape_of, own_ids, shape_key, warm_oci_config
from quinebox.box.spec import seccomp_base

OWN = (idmap.BASE + 7 * idmap.SPAN, idmap.SPAN)


def owned(box, userns=OWN):
    from test_policy import AGENT_IMAGE, ARCH, RUNTIME_DIR
    from test_policy_oci import ROOTFS

    return oci_config(box, image=AGENT_IMAGE, runtime=RUNTIME_DIR, seccomp=seccomp_base(), arch=ARCH, rootfs=ROOTFS, userns=userns)


@pytest.mark.parametrize(
    "slot, first, user",
    [
        (0, 1 << 30, (1 << 30) + 1000),
        (1, (1 << 30) + 65536, (1 << 30) + 65536 + 1000),
        (4095, (1 << 30) + 4095 * 65536, (1 << 30) + 4095 * 65536 + 1000),
    ],
)
def test_a_slot_is_a_span_of_host_ids_no_account_has(slot, first, user):
    ids = idmap.IdRange(slot)
    assert ids.first == first and ids.host(1000) == user and ids.host(0) == first
    assert idmap.holding(first) == idmap.holding(first + 65535) == ids and idmap.holding(first + 65536) != ids and idmap.holding(first - 1) != ids
    assert ids.first + ids.span - 1 < 1 << 31  # never read as negative by what reads ids signed
    assert idmap.range_of([{"containerID": 0, "hostID": first, "size": 65536}]) == ids


@pytest.mark.parametrize("inside", [-1, 65536, 1 << 20])
def test_an_id_outside_the_namespace_has_no_host_id(inside):
    with pytest.raises(ValueError, match="outside a box's namespace"):
        idmap.IdRange(3).host(inside)


@pytest.mark.parametrize(
    "mappings",
    [
        None,
        [],
        [{"containerID": 0, "hostID": 100000, "size": 65536}],  # not our range: a rootless box's subordinate ids
        [{"containerID": 0, "hostID": idmap.BASE + 5, "size": 65536}],  # not a slot's first id
        [{"containerID": 0, "hostID": idmap.BASE, "size": 1000}],  # not a whole span
        [{"containerID": 0, "hostID": idmap.BASE + idmap.SLOTS * idmap.SPAN, "size": 65536}],  # past the last slot
        [{"containerID": 0, "hostID": idmap.BASE, "size": 65536}, {"containerID": 65536, "hostID": 1, "size": 1}],
        ["nonsense"],
    ],
)
def test_only_our_own_spans_are_read_back_as_ours(mappings):
    assert idmap.range_of(mappings) is None


@pytest.mark.parametrize(
    "text, other",
    [
        ("", None),
        ("cloudsdk:100000:65536\nquinebox-rootless:300000:65536\n", None),
        (f"quinebox:{idmap.BASE}:{idmap.SLOTS * idmap.SPAN}\n", None),  # ours already
        (f"someone:{idmap.BASE + 10}:5\n", f"someone:{idmap.BASE + 10}:5"),
        (f"someone:{idmap.BASE - 10}:11\n", f"someone:{idmap.BASE - 10}:11"),  # its last id is our first
        (f"someone:{idmap.BASE - 10}:10\n", None),  # ends just below
        (f"someone:{idmap.BASE + idmap.SLOTS * idmap.SPAN}:10\n", None),  # starts just above
        ("broken line\nalso:broken\n", None),
    ],
)
def test_another_users_subordinate_ids_inside_our_range_are_found(text, other):
    assert idmap.overlap(text) == other


def test_a_root_made_box_has_a_user_namespace_of_its_own_and_every_other_control_unchanged():
    box = spec("mem:64m", "pids:20", "cpus:0.5")
    made, mine = oci(box), owned(box)
    assert [ns["type"] for ns in mine["linux"]["namespaces"]] == ["user", "pid", "network", "ipc", "uts", "mount", "cgroup"]
    assert mine["linux"]["uidMappings"] == mine["linux"]["gidMappings"] == [{"containerID": 0, "hostID": OWN[0], "size": 65536}]
    assert mine["process"]["user"] == made["process"]["user"] == {"uid": 1000, "gid": 1000, "umask": 0o022}
    for key in ("capabilities", "noNewPrivileges", "rlimits", "args", "env"):
        assert mine["process"][key] == made["process"][key], key
    for key in ("seccomp", "resources", "maskedPaths", "readonlyPaths", "cgroupsPath"):
        assert mine["linux"][key] == made["linux"][key], key  # the devices cgroup too: root writes it
    assert mine["mounts"] == made["mounts"] and mine["root"] == made["root"]


def test_a_shape_holds_no_boxs_own_ids_and_each_warm_box_gets_its_own():
    box = replace(spec(), caller=0)
    first = oci_shape_of(box, owned(box), "runc")
    other = oci_shape_of(box, owned(box, (idmap.BASE, idmap.SPAN)), "runc")
    assert first is not None and other is not None
    assert shape_key(first) == shape_key(other) and own_ids(first)
    assert "uidMappings" not in first["config"]["linux"]
    warm = warm_oci_config(first, box="b1", lifeline="/l", world=None, owner="o", created="c", userns=(idmap.BASE + idmap.SPAN, idmap.SPAN))
    assert warm["linux"]["uidMappings"] == [{"containerID": 0, "hostID": idmap.BASE + idmap.SPAN, "size": 65536}]
    assert not own_ids({"config": warm})
    with pytest.raises(ValueError, match="host ids of the box's own"):
        warm_oci_config(first, box="b2", lifeline="/l", world=None, owner="o", created="c")


@pytest.fixture
def slots(tmp_path, monkeypatch):
    """The machine's slots in a directory of the test's own (root's /run/quinebox holds the live boxes')."""
    monkeypatch.setattr(idmap, "RUN", tmp_path / "run")
    monkeypatch.setattr(idmap, "BOXES", tmp_path / "run" / "boxes")
    monkeypatch.setattr(idmap, "register", lambda: None)
    return tmp_path / "run" / "boxes"


@pytest.mark.skipif(os.geteuid() != 0, reason="slots are root's (a plain user's boxes map its own ids)")
def test_claims_are_one_box_each_root_reachable_and_freed_with_the_box(slots):
    taken = [idmap.claim(f"s{i}") for i in range(20)]
    assert len({ids.slot for ids in taken}) == 20
    for i, ids in enumerate(taken):
        st = os.stat(ids.dir)
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, 0, 0o711)  # root's; each box's root in it is its own
        assert idmap.claimants(ids) == [f"s{i}"] and not idmap.stale(ids)  # this process holds them
    assert os.stat(slots).st_mode & 0o777 == 0o711 and os.stat(slots.parent).st_mode & 0o777 == 0o711
    idmap.join(taken[0], "child")  # a child shares its parent's slot, with a claim of its own
    (taken[0].root_for("child")).mkdir()
    idmap.settle(taken[0], "child", os.getpid())
    assert sorted(idmap.claimants(taken[0])) == ["child", "s0"]
    idmap.release(taken[0], "s0")  # the parent goes first: the child still holds the slot
    assert taken[0].dir.exists() and idmap.claimants(taken[0]) == ["child"] and not idmap.stale(taken[0])
    idmap.release(taken[0], "child")  # the last box in it: the slot is free
    assert not taken[0].dir.exists()
    idmap.release(taken[0], "child")  # again, or for a slot gone: nothing, never an error


@pytest.mark.skipif(os.geteuid() != 0, reason="slots are root's")
def test_a_slot_whose_holder_died_is_swept_and_one_whose_box_lives_is_not(slots):
    held = idmap.claim("kept")
    gone = idmap.claim("lost")
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    idmap.settle(held, "kept", child.pid)  # the box's init, alive
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    (gone.dir / f"{idmap.CLAIM}.lost").write_text(f"{dead.stdout.strip()} 1\n")  # its maker died before the box started
    try:
        assert idmap.stale(gone) and not idmap.stale(held)
        assert idmap.sweep() == 1
        assert held.dir.exists() and not gone.dir.exists()
    finally:
        child.stdin.close()
        child.wait()
    assert idmap.stale(held)  # its init gone: free for the next


def test_mount_points_are_made_in_the_root_without_following_its_links(tmp_path):
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    (root / "run").mkdir(parents=True)
    outside.mkdir()
    (root / "var").symlink_to(outside)  # an image's link out of its root: never followed by the host
    sock = tmp_path / "host.sock"
    sock.write_text("")
    mounts = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/proc/sys", "type": "bind", "source": "/proc/sys"},  # inside another mount: the runtime's
        {"destination": "/world", "type": "bind", "source": str(tmp_path)},
        {"destination": "/run/quinebox/host.sock", "type": "bind", "source": str(sock)},
        {"destination": "/var/lib/x", "type": "bind", "source": str(tmp_path)},
        {"destination": "/opt/a/b", "type": "tmpfs", "source": "tmpfs"},
    ]
    mount_points(str(root), mounts)
    assert (root / "proc").is_dir() and not (root / "proc" / "sys").exists()
    assert (root / "world").is_dir() and (root / "opt" / "a" / "b").is_dir()
    assert (root / "run" / "quinebox" / "host.sock").is_file()
    assert os.listdir(outside) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="slots are root's")
def test_a_resumed_session_gets_its_last_slot_back_when_it_is_free(slots):
    first = idmap.claim("s1")
    idmap.release(first, "s1")
    again = idmap.claim("s1", prefer=first)
    assert again == first  # what its boxes wrote to its grants is still its own
    other = idmap.claim("s2", prefer=first)  # taken meanwhile: another slot, never a shared one
    assert other != first and idmap.claimants(first) == ["s1"]
