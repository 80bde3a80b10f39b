"""A box made by a user who is not root, as tables: what the machine must allow (rootless.py) and how the same
box is rendered for the runtime (oci.policy.Rootless): a user namespace, its uid 0 the caller, no more."""

import pytest
from test_policy import spec
from test_policy_oci import oci

from quinebox.box.backends.oci.policy import Rootless
from quinebox.box.backends.probe import probe_config
from quinebox.box.backends.rootless import RUNSC, Refusal, delegated_name, no_cgroup, refusal, setup_user, subordinate, userns_refusal, v1_delegated, v1_hierarchies, v2_delegated
from quinebox.box.policy import DEFAULT_MEM, DEFAULT_PIDS
from quinebox.errors import ErrorKind, QuineboxError

SINGLE = Rootless(uid=1000, gid=1000, cgroup="/quinebox.user-1000")
RANGED = Rootless(uid=1000, gid=1000, cgroup="/quinebox.user-1000", subuid=(100000, 65536), subgid=(200000, 65536))


@pytest.mark.parametrize(
    "values, reason",
    [
        ({}, None),
        ({"max_user_namespaces": "15000", "unprivileged_userns_clone": "1", "apparmor_restrict_unprivileged_userns": "0"}, None),
        ({"max_user_namespaces": "0"}, "user namespaces are switched off (user.max_user_namespaces = 0)"),
        ({"unprivileged_userns_clone": "0"}, "unprivileged user namespaces are switched off (kernel.unprivileged_userns_clone = 0)"),
        ({"apparmor_restrict_unprivileged_userns": "1"}, "AppArmor keeps unprivileged programs from user namespaces"),
        ({"max_user_namespaces": "0", "apparmor_restrict_unprivileged_userns": "1"}, "user namespaces are switched off"),  # the first that says no
    ],
)
def test_what_keeps_a_user_from_user_namespaces(values, reason):
    found = userns_refusal(values.get)
    if reason is None:
        assert found is None
    else:
        assert found is not None and found.reason.startswith(reason), found
        assert found.fix.startswith("sudo sysctl") or "/etc/apparmor.d/runc" in found.fix


def _owners(table):
    return lambda path: table.get(path)


@pytest.mark.parametrize(
    "owned, cgroup",
    [
        ({f"{c}/quinebox.user-1000": 1000 for c in ("memory", "pids", "cpu")}, "/quinebox.user-1000"),
        ({f"{c}/quinebox.user-1000": 1000 for c in ("memory", "pids")}, None),  # no cpu: its limit could not be set
        ({"memory/quinebox.user-1000": 1000, "pids/quinebox.user-1000": 0, "cpu/quinebox.user-1000": 1000}, None),  # root's, not the user's
        ({f"{c}/quinebox.user-1001": 1001 for c in ("memory", "pids", "cpu")}, None),  # another user's
        ({}, None),
    ],
)
def test_a_v1_cgroup_is_delegated_only_when_each_needed_controller_is_the_users(owned, cgroup):
    assert v1_delegated(1000, _owners(owned)) == cgroup


SERVICE = "/user.slice/user-1000.slice/user@1000.service"


@pytest.mark.parametrize(
    "own, owned, controllers, cgroup",
    [
        (f"{SERVICE}/app.slice/term.scope", {SERVICE: 1000}, {SERVICE: {"cpu", "memory", "pids"}}, SERVICE),
        (f"{SERVICE}/app.slice/term.scope", {SERVICE: 1000}, {SERVICE: {"cpu", "memory"}}, None),  # no pids offered
        (f"{SERVICE}/app.slice/term.scope", {SERVICE: 0}, {SERVICE: {"memory", "pids"}}, None),  # not delegated
        ("/user.slice/user-1000.slice/session-3.scope", {}, {}, None),  # a login session's scope: not the manager's subtree
        ("/system.slice/ssh.service", {}, {}, None),
        (f"{SERVICE.replace('1000', '1001')}/app.slice/x.scope", {SERVICE.replace("1000", "1001"): 1001}, {SERVICE.replace("1000", "1001"): {"memory", "pids"}}, None),
        ("", {}, {}, None),
    ],
)
def test_a_v2_subtree_is_the_users_managers_when_it_is_delegated(own, owned, controllers, cgroup):
    assert v2_delegated(own, 1000, _owners(owned), lambda path: controllers.get(path, set())) == cgroup


@pytest.mark.parametrize(
    "text, found",
    [
        ("dev:100000:65536\n", (100000, 65536)),
        ("other:100000:65536\ndev:165536:65536\n", (165536, 65536)),
        ("1000:300000:10\n", (300000, 10)),  # by uid, as shadow-utils allows
        ("dev:100000:0\n", None),
        ("dev:x:65536\n", None),
        ("dev:100000\n", None),
        ("", None),
    ],
)
def test_subordinate_ranges(text, found):
    assert subordinate(text, "dev", 1000) == found


def test_only_mounted_v1_hierarchies_below_the_cgroup_root_are_delegated():
    mounts = "\n".join([
        "tmpfs /sys/fs/cgroup tmpfs rw 0 0",
        "cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0",
        "cgroup /sys/fs/cgroup/systemd cgroup rw,name=systemd 0 0",
        "cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0",
        "cgroup /elsewhere/cpu cgroup rw,cpu 0 0",
    ])  # fmt: skip
    assert [str(p) for p in v1_hierarchies(mounts)] == ["/sys/fs/cgroup/memory", "/sys/fs/cgroup/systemd"]


def test_the_delegated_cgroup_is_never_taken_for_a_box():
    assert not delegated_name(1000).startswith("quinebox-")  # gc sweeps `quinebox-*` as boxes' cgroups


@pytest.mark.parametrize(
    "runtime, who, refused",
    [
        ("runc", None, None),
        ("runsc", None, None),  # root: gVisor as ever
        ("runc", SINGLE, None),
        ("/usr/sbin/runc", SINGLE, None),
        ("runsc", SINGLE, RUNSC),
        ("/usr/bin/runsc", RANGED, RUNSC),
        ("runc", no_cgroup("dev", "hybrid"), no_cgroup("dev", "hybrid")),
    ],
)
def test_which_runtime_may_make_a_users_boxes(runtime, who, refused):
    assert refusal(runtime, who) == refused


def test_no_cgroup_names_the_fix_for_each_hierarchy():
    assert no_cgroup("dev", "hybrid").fix.startswith("sudo quinebox setup-user dev")
    assert "systemd" in no_cgroup("dev", "v2").reason and isinstance(no_cgroup("dev", "v2"), Refusal)


def rootless(box, who=SINGLE):
    from test_policy import AGENT_IMAGE, ARCH, RUNTIME_DIR
    from test_policy_oci import ROOTFS

    from quinebox.box.backends.oci.policy import oci_config
    from quinebox.box.spec import seccomp_base

    return oci_config(box, image=AGENT_IMAGE, runtime=RUNTIME_DIR, seccomp=seccomp_base(), arch=ARCH, rootfs=ROOTFS, rootless=who)


@pytest.mark.parametrize(
    "who, uids, gids",
    [
        (SINGLE, [{"containerID": 0, "hostID": 1000, "size": 1}], [{"containerID": 0, "hostID": 1000, "size": 1}]),
        (RANGED, [{"containerID": 0, "hostID": 1000, "size": 1}, {"containerID": 1, "hostID": 100000, "size": 65536}],
         [{"containerID": 0, "hostID": 1000, "size": 1}, {"containerID": 1, "hostID": 200000, "size": 65536}]),
    ],
)
def test_a_rootless_box_has_its_own_user_namespace_and_the_caller_is_its_uid_0(who, uids, gids):
    config = rootless(spec(), who)
    linux = config["linux"]
    assert [ns["type"] for ns in linux["namespaces"]] == ["user", "pid", "network", "ipc", "uts", "mount", "cgroup"]
    assert (linux["uidMappings"], linux["gidMappings"]) == (uids, gids)
    assert config["process"]["user"] == {"uid": 0, "gid": 0, "umask": 0o022}


def test_a_rootless_box_keeps_every_other_control_of_a_root_made_one():
    box = spec("mem:64m", "pids:20", "cpus:0.5")
    made, mine = oci(box), rootless(box)
    assert mine["process"]["capabilities"] == made["process"]["capabilities"] == {k: [] for k in ("bounding", "effective", "inheritable", "permitted", "ambient")}
    assert mine["process"]["noNewPrivileges"] is True
    assert mine["root"] == made["root"] and mine["root"]["readonly"] is True
    assert mine["linux"]["seccomp"] == made["linux"]["seccomp"]
    assert mine["linux"]["maskedPaths"] == made["linux"]["maskedPaths"] and mine["linux"]["readonlyPaths"] == made["linux"]["readonlyPaths"]
    assert mine["linux"]["resources"] == {k: v for k, v in made["linux"]["resources"].items() if k != "devices"}
    assert mine["linux"]["resources"]["memory"]["limit"] == 64 << 20 and mine["linux"]["resources"]["pids"]["limit"] == 20
    assert "cpu" in mine["linux"]["resources"]
    assert mine["linux"]["cgroupsPath"] == f"/quinebox.user-1000{made['linux']['cgroupsPath']}"


def test_defaults_are_the_same_limits_rootless():
    resources = rootless(spec())["linux"]["resources"]
    assert (resources["memory"]["limit"], resources["pids"]["limit"]) == (DEFAULT_MEM, DEFAULT_PIDS)


def test_owners_the_namespace_cannot_map_are_left_out_of_mount_options():
    single = {m["destination"]: m for m in rootless(spec())["mounts"]}
    ranged = {m["destination"]: m for m in rootless(spec(), RANGED)["mounts"]}
    assert "gid=5" not in single["/dev/pts"]["options"] and "gid=5" in ranged["/dev/pts"]["options"]
    assert {k: v for k, v in single["/dev/pts"].items() if k != "options"} == {k: v for k, v in ranged["/dev/pts"].items() if k != "options"}


def test_a_rootless_world_is_its_namespaces_uid_0s():
    box = spec()
    world = next(m for m in rootless(box)["mounts"] if m["destination"] == "/world")
    assert "uid=0" in world["options"] and "gid=0" in world["options"]
    assert box.uid != 0  # the spec itself still names the caller: the host makes its world theirs


def test_the_probe_is_made_as_the_user_makes_boxes():
    made, mine = probe_config("/r", "/quinebox-probe-1"), probe_config("/r", "/quinebox-probe-1", SINGLE)
    assert "uidMappings" not in made["linux"] and made["process"]["user"] == {"uid": 1000, "gid": 1000}
    assert mine["process"]["user"] == {"uid": 0, "gid": 0}
    assert mine["linux"]["namespaces"][0] == {"type": "user"} and mine["linux"]["cgroupsPath"] == "/quinebox.user-1000/quinebox-probe-1"
    assert mine["linux"]["resources"] == made["linux"]["resources"]


@pytest.mark.parametrize(
    "name, kind, said",
    [
        ("quinebox-no-such-user", ErrorKind.NOT_FOUND, "no user named 'quinebox-no-such-user' on this machine (`getent passwd quinebox-no-such-user`)"),
        ("root", ErrorKind.BAD_INPUT, "root needs no delegated cgroup: its boxes are made by root"),
    ],
)
def test_setup_user_refuses_with_a_quinebox_error_of_its_kind(name, kind, said):
    """Errors as data: a refusal of setup-user is a QuineboxError with a kind (the CLI says it in one line), not a bare ValueError."""
    with pytest.raises(QuineboxError) as refused:
        setup_user(name, "v2")
    assert (refused.value.kind, str(refused.value), refused.value.fields["user"]) == (kind, said, name)
