"""What a box of `--image host` sees of the host's root: the pure rule, and where its mounts land among the box's."""

import pytest
from test_policy import ARCH, RUNTIME_DIR, spec

from quinebox.box.backends.oci.policy import oci_config
from quinebox.box.policy import HOST_SOCKET, RUNTIME, BoxMount
from quinebox.box.policy_host import ETC_SECRETS, HIDDEN_OPTIONS, OWN, SHOWN, host_view
from quinebox.box.spec import HOST_IMAGE, ImageInfo, seccomp_base

EMPTY = "/state/run/empty"
HOST = ImageInfo(name=HOST_IMAGE, id=HOST_IMAGE)


def hidden_dir(path: str) -> BoxMount:
    return BoxMount("tmpfs", path, options=HIDDEN_OPTIONS)


def emptied(path: str) -> BoxMount:
    return BoxMount("bind", path, EMPTY)


#: A host's root as `ls -l /` shows one: merged /usr, a developer's own top-level directories, a kernel link.
TYPICAL = [
    ("bin", "link"), ("boot", "dir"), ("dev", "dir"), ("etc", "dir"), ("home", "dir"), ("lib", "link"), ("lib64", "link"),
    ("lost+found", "dir"), ("media", "dir"), ("mnt", "dir"), ("opt", "dir"), ("proc", "dir"), ("root", "dir"), ("run", "dir"),
    ("sbin", "link"), ("srv", "dir"), ("sys", "dir"), ("tmp", "dir"), ("usr", "dir"), ("var", "dir"), ("vmlinuz", "link"),
    ("data", "dir"), ("work", "dir"), ("swapfile", "file"), ("container_info.json", "file"),
]


def test_a_typical_root_shows_its_system_directories_and_hides_everything_else():
    hidden = host_view(TYPICAL, [], EMPTY)
    assert hidden == [
        *(hidden_dir(f"/{name}") for name in ("boot",)),
        emptied("/container_info.json"),
        *(hidden_dir(f"/{name}") for name in ("data", "home", "lost+found", "media", "mnt", "root", "run", "srv")),
        emptied("/swapfile"),
        *(hidden_dir(f"/{name}") for name in ("var", "work")),
    ]


@pytest.mark.parametrize("name", sorted(SHOWN | OWN))
def test_a_system_directory_or_one_the_box_mounts_itself_is_left_as_it_is(name):
    assert host_view([(name, "dir")], [], EMPTY) == []


@pytest.mark.parametrize("name", ["home", "root", "var", "run", "srv", "mnt", "media", "boot", "backup", "data", "Users", "usr2", "etc.bak", "nix-old"])
def test_any_other_directory_is_hidden_however_it_is_named(name):
    assert host_view([(name, "dir")], [], EMPTY) == [hidden_dir(f"/{name}")]


@pytest.mark.parametrize("name", ["vmlinuz", "initrd.img", "home", "cdrom"])
def test_a_link_is_kept_as_what_it_leads_to_is_shown_or_hidden_by_the_same_rule(name):
    assert host_view([(name, "link")], [], EMPTY) == []


@pytest.mark.parametrize(
    "etc, expected",
    [
        ([("/etc/shadow", "file"), ("/etc/gshadow", "file"), ("/etc/shadow-", "file")], [emptied("/etc/gshadow"), emptied("/etc/shadow"), emptied("/etc/shadow-")]),
        ([("/etc/sudoers.d", "dir"), ("/etc/ssl/private", "dir")], [hidden_dir("/etc/ssl/private"), hidden_dir("/etc/sudoers.d")]),
        ([("/etc/ssh/ssh_host_ed25519_key", "file"), ("/etc/ssh/ssh_host_ed25519_key.pub", "file"), ("/etc/ssh/ssh_host_rsa_key", "file")],
         [emptied("/etc/ssh/ssh_host_ed25519_key"), emptied("/etc/ssh/ssh_host_rsa_key")]),
        ([("/etc/ssh/sshd_config", "file"), ("/etc/ssh/ssh_config.d", "dir"), ("/etc/ssh/moduli", "file")], []),
        ([("/etc/passwd", "file"), ("/etc/hosts", "file")], []),  # not secrets: only ETC_SECRETS and ssh's keys are
        ([("/etc/shadow", "link")], []),  # a link that leads nowhere holds nothing
        ([("/etc/ssl/private", "file")], [emptied("/etc/ssl/private")]),  # a link followed to a file: hidden as one
    ],
)
def test_the_secrets_kept_in_etc_are_emptied(etc, expected):
    assert host_view([], etc, EMPTY) == expected


def test_every_secret_is_hidden_whether_a_file_or_a_directory():
    assert host_view([], [(path, "file") for path in ETC_SECRETS], EMPTY) == [emptied(path) for path in sorted(ETC_SECRETS)]
    assert host_view([], [(path, "dir") for path in ETC_SECRETS], EMPTY) == [hidden_dir(path) for path in sorted(ETC_SECRETS)]


@pytest.mark.parametrize("entry", [("a/b", "dir"), ("", "dir"), (".", "dir"), ("..", "dir"), ("home", "socket"), ("home", "")])
def test_an_entry_that_cannot_be_in_a_root_is_refused_not_skipped(entry):
    with pytest.raises(ValueError):
        host_view([entry], [], EMPTY)


def test_a_bad_kind_in_etc_is_refused():
    with pytest.raises(ValueError):
        host_view([], [("/etc/shadow", "fifo")], EMPTY)


def test_hidden_directories_are_empty_and_hold_nothing_that_runs():
    assert {"nosuid", "nodev", "noexec"} <= set(HIDDEN_OPTIONS) and "mode=0755" in HIDDEN_OPTIONS


def oci_mounts(box, hidden) -> list[dict]:
    cfg = oci_config(box, image=HOST, runtime=RUNTIME_DIR, seccomp=seccomp_base(), arch=ARCH, rootfs="/", hidden=hidden)
    assert cfg["root"] == {"path": "/", "readonly": True}
    return [m for m in cfg["mounts"] if m["destination"] not in ("/proc", "/dev", "/dev/pts", "/dev/shm", "/dev/mqueue", "/sys", "/sys/fs/cgroup")]


def test_a_grant_inside_a_hidden_directory_lands_on_it_and_the_box_starts_there():
    hidden = host_view(TYPICAL, [("/etc/shadow", "file")], EMPTY)
    box = spec("rw:/home/u/proj", "ro:/home=/home", cwd="/home/u/proj")
    mounts = oci_mounts(box, hidden)
    destinations = [m["destination"] for m in mounts]
    assert destinations.index("/home") < destinations.index("/home/u/proj")
    home = [m for m in mounts if m["destination"] == "/home"]
    assert [m["type"] for m in home] == ["tmpfs", "bind"]  # a grant of /home itself lands on the hidden one, not under it
    assert destinations.index("/run") < destinations.index(HOST_SOCKET)  # the lifeline shows through the hidden /run
    assert {"destination": "/etc/shadow", "type": "bind", "source": EMPTY, "options": ["rbind", "rprivate", "ro", "rro"]} in mounts
    assert [m for m in mounts if m["destination"] == RUNTIME] == [{"destination": RUNTIME, "type": "bind", "source": RUNTIME_DIR, "options": ["rbind", "rprivate", "ro", "rro"]}]
    cfg = oci_config(box, image=HOST, runtime=RUNTIME_DIR, seccomp=seccomp_base(), arch=ARCH, rootfs="/", hidden=hidden)
    assert cfg["process"]["cwd"] == "/home/u/proj"


def test_without_hidden_mounts_a_box_is_as_before():
    box = spec("ro:/data")
    assert oci_mounts(box, []) == oci_mounts(box, ())
    assert "/home" not in [m["destination"] for m in oci_mounts(box, [])]
