"""The shipped seccomp profile: stricter than Docker's default, in the ways docs/security.md promises."""

import pytest

from quinebox.box.spec import seccomp_base

DENIED = [
    "io_uring_setup", "io_uring_enter", "io_uring_register", "userfaultfd", "keyctl", "add_key", "request_key",
    "bpf", "perf_event_open", "ptrace", "process_vm_readv", "process_vm_writev", "unshare", "setns", "mount",
    "umount2", "pivot_root", "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "open_by_handle_at", "clock_settime", "settimeofday", "adjtimex", "clock_adjtime", "sethostname",
    "setdomainname", "fsopen", "fsmount", "move_mount", "open_tree", "chroot", "reboot", "swapon", "acct",
]
# Threads, processes and the basics a shell and python need.
ALLOWED = ["read", "write", "openat", "execve", "clone", "wait4", "futex", "mmap", "pidfd_open", "pipe2", "socket", "connect"]


def rules_for(name):
    return [r for r in seccomp_base()["syscalls"] if name in r["names"]]


@pytest.mark.parametrize("name", DENIED)
def test_denied_syscalls_fall_to_the_default_errno(name):
    assert rules_for(name) == []


@pytest.mark.parametrize("name", ALLOWED)
def test_everyday_syscalls_are_allowed(name):
    assert any(r["action"] == "SCMP_ACT_ALLOW" for r in rules_for(name))


def test_default_action_is_eperm():
    profile = seccomp_base()
    assert (profile["defaultAction"], profile["defaultErrnoRet"]) == ("SCMP_ACT_ERRNO", 1)


def test_clone3_answers_enosys_so_libc_falls_back_to_clone():
    [rule] = rules_for("clone3")
    assert (rule["action"], rule["errnoRet"]) == ("SCMP_ACT_ERRNO", 38)


def test_clone_may_not_create_namespaces():
    [rule] = rules_for("clone")
    assert rule["args"] == [{"index": 0, "value": 0x7E020000, "op": "SCMP_CMP_MASKED_EQ"}]


def test_socket_only_for_unix_inet_inet6_netlink():
    families = sorted(r["args"][0]["value"] for r in rules_for("socket"))
    assert families == [1, 2, 10, 16]  # AF_ALG (38), AF_VSOCK (40), AF_PACKET (17) fall to EPERM
    assert all(r["args"][0]["op"] == "SCMP_CMP_EQ" for r in rules_for("socket"))


#: Each call that takes a mode, and the index of its mode argument (x86-64's and arm64's alike).
MODES = {"chmod": 1, "fchmod": 1, "fchmodat": 2, "creat": 1, "mkdir": 1, "mkdirat": 2, "mknod": 1, "mknodat": 2, "open": 2, "openat": 3}


@pytest.mark.parametrize("name, index", sorted(MODES.items()))
def test_no_call_gives_a_set_uid_or_set_gid_bit(name, index):
    """Allowed only with S_ISUID and S_ISGID clear in its mode (open/openat also when it creates nothing); else EPERM."""
    rules = rules_for(name)
    assert all(r["action"] == "SCMP_ACT_ALLOW" and len(r["args"]) == 1 for r in rules), rules
    assert {"index": index, "value": 0o6000, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"} in [r["args"][0] for r in rules]
    creating = [r["args"][0] for r in rules if r["args"][0]["index"] != index]
    assert creating == ([{"index": index - 1, "value": 0o100 | 0o20000000, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}] if name in ("open", "openat") else [])


def test_openat2_answers_enosys_its_mode_out_of_seccomps_reach():
    [rule] = rules_for("openat2")
    assert (rule["action"], rule["errnoRet"]) == ("SCMP_ACT_ERRNO", 38)


#: (grants, world kind, whether the box writes a host path): a rw: grant, or a world that is the caller's own directory.
HOST_WRITES = [
    ([], None, False), ([], "dir", False), ([], "overlay", False), (["ro:/srv"], None, False), (["rootfs:rw"], "dir", False),
    (["rw:/srv"], None, True), (["ro:/srv", "rw:/data"], "dir", True), ([], "bind", True), (["rootfs:rw", "rw:/srv"], None, True),
]


@pytest.mark.parametrize("grants, world, writes", HOST_WRITES)
def test_set_id_bits_are_refused_exactly_where_the_box_writes_a_host_path(grants, world, writes):
    from quinebox.box.policy import seccomp_profile, writes_host_paths
    from quinebox.grants import Grants, parse_grant
    from quinebox.worlds.spec import WorldSpec

    held = Grants()
    for spec in grants:
        held = held.merge(parse_grant(spec))
    assert writes_host_paths(held, WorldSpec(kind=world, layer="/x") if world else None) is writes
    profile = seccomp_profile(seccomp_base(), held, "SCMP_ARCH_X86_64", setid=not writes)
    chmods = [r for r in profile["syscalls"] if "chmod" in r["names"]]
    assert chmods == ([{"names": ["chmod"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 1, "value": 0o6000, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]}]
                      if writes else [{"names": ["chmod"], "action": "SCMP_ACT_ALLOW"}])
    assert all("setid" not in rule and "comment" not in rule for rule in profile["syscalls"])  # ours, never the runtime's
