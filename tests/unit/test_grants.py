"""The grant grammar, as tables: what parses to what, and what is refused with which words."""

import os

import pytest

from quinebox.errors import ErrorKind, GrantError
from quinebox.grants import Grants, Mount, attenuate, check_mount, format_duration, parse_duration, parse_grant, parse_size, read_only_all_the_way, resolve, submounts
from quinebox.netrules import NetRule

BAD_GRANT, REFUSED, NOT_FOUND = ErrorKind.BAD_GRANT, ErrorKind.REFUSED, ErrorKind.NOT_FOUND
G = 1 << 30
M = 1 << 20


@pytest.mark.parametrize(
    "text, expected",
    [("1", 1), ("512", 512), ("1k", 1024), ("128m", 128 * M), ("128M", 128 * M), ("2g", 2 * G), ("2G", 2 * G),
     ("1t", 1 << 40), ("64mb", 64 * M), ("64MiB", 64 * M), ("1.5g", int(1.5 * G)), ("0.5k", 512), (" 8m ", 8 * M)],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "m", "-1m", "0", "0m", "12x", "1.2.3m", "1 0m", "ten", "1e3"])
def test_parse_size_refuses(text):
    with pytest.raises(GrantError) as info:
        parse_size(text)
    assert (info.value.kind, dict(info.value.fields)) == (ErrorKind.BAD_GRANT, {"value": text})


@pytest.mark.parametrize(
    "text, expected",
    [("30", 30.0), ("30s", 30.0), ("5m", 300.0), ("1h", 3600.0), ("250ms", 0.25), ("1.5s", 1.5), ("0.5", 0.5), ("7d", 604800.0)],
)
def test_parse_duration(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "s", "-1", "0", "0s", "5w", "0d", "5 minutes", "1m30s", "abc"])
def test_parse_duration_refuses(text):
    with pytest.raises(GrantError) as info:
        parse_duration(text)
    assert (info.value.kind, dict(info.value.fields)) == (ErrorKind.BAD_GRANT, {"value": text})


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("ro:/data", Grants(mounts=(Mount("/data", "/data", False),))),
        ("rw:/data", Grants(mounts=(Mount("/data", "/data", True),))),
        ("ro:/data=/in", Grants(mounts=(Mount("/data", "/in", False),))),
        ("rw:/data/=/in/sub/", Grants(mounts=(Mount("/data", "/in/sub", True),))),
        ("ro:/a/./b/../c", Grants(mounts=(Mount("/a/c", "/a/c", False),))),
        ("ro:rel/dir", Grants(mounts=(Mount("/cwd/rel/dir", "/cwd/rel/dir", False),))),
        ("ro:.", Grants(mounts=(Mount("/cwd", "/cwd", False),))),
        ("net", Grants(net=frozenset({NetRule("public")}))),
        ("net:bridge", Grants(net=frozenset({NetRule("bridge")}))),
        ("net:example.com", Grants(net=frozenset({NetRule("host", "example.com", (80, 443))}))),
        ("secret:TOKEN@api.example.com", Grants(secrets=(("TOKEN", ("api.example.com",)),))),
        ("secret:TOKEN@b.example.com,A.example.com.", Grants(secrets=(("TOKEN", ("a.example.com", "b.example.com")),))),
        ("cpus:2", Grants(cpus=2.0)),
        ("cpus:0.5", Grants(cpus=0.5)),
        ("mem:128m", Grants(mem=128 * M)),
        ("tmp:1g", Grants(tmp=G)),
        ("world:2g", Grants(world=2 * G)),
        ("world:512m", Grants(world=512 * M)),
        ("pids:64", Grants(pids=64)),
        ("time:5m", Grants(time=300.0)),
        ("time:30", Grants(time=30.0)),
        ("env:FOO", Grants(env=(("FOO", None),))),
        ("env:FOO=bar", Grants(env=(("FOO", "bar"),))),
        ("env:FOO=", Grants(env=(("FOO", ""),))),
        ("env:FOO=a=b", Grants(env=(("FOO", "a=b"),))),
        ("spawn:10", Grants(spawn=10)),
        ("depth:3", Grants(depth=3)),
        ("tokens:100000", Grants(tokens=100000)),
        ("syscall:unshare", Grants(syscalls=frozenset({"unshare"}))),
        ("rootfs:rw", Grants(rootfs_rw=True)),
    ],
)
def test_parse_grant(spec, expected):
    assert parse_grant(spec, cwd="/cwd") == expected


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "ro",
        "ro:",
        "rw:=/x",
        "ro:/data=relative",
        "ro:/data=/a/../b",
        "net:",
        "secret:TOKEN",
        "secret:1TOKEN@api.example.com",
        "secret:TOKEN@*.example.com",
        "secret:TOKEN@",
        "net:exa mple.com",
        "cpus:0",
        "cpus:-1",
        "cpus:many",
        "mem:lots",
        "mem:0",
        "tmp:-5m",
        "world:0",
        "world:big",
        "time:forever",
        "pids:0",
        "pids:1.5",
        "pids:²",  # a digit to str.isdigit, not to int()
        "spawn:١",  # an Arabic-Indic one: ASCII digits only
        "net:example.com:²",
        "spawn:-1",
        "tokens:lots",
        "env:1BAD",
        "env:=x",
        "syscall:Mount!",
        "docker:sock",
        "RO:/data",
        "gpu:1",
        "rootfs:ro",
        "rootfs:RW",
        "rootfs:",
        "rootfs",
    ],
)
def test_parse_grant_refuses(spec):
    with pytest.raises(GrantError) as info:
        parse_grant(spec, cwd="/cwd")
    assert (info.value.kind, dict(info.value.fields)) == (ErrorKind.BAD_GRANT, {"grant": spec})
    assert "\n" not in str(info.value)


def test_a_bad_grant_says_what_to_write():
    """The wording is the point here: the line is how a person learns the grammar."""
    with pytest.raises(GrantError, match=r"^bad grant 'cpus:0': cpus takes a number above zero \(e\.g\. cpus:1\.5\)$"):
        parse_grant("cpus:0")


def test_rootfs_rw_holds_once_granted_and_parses_back():
    assert Grants.parse(["rootfs:rw", "mem:1g"]).rootfs_rw
    assert Grants.parse(["mem:1g", "rootfs:rw", "rootfs:rw"]).format() == ["mem:1g", "rootfs:rw"]
    assert not Grants.parse(["mem:1g"]).rootfs_rw and "rootfs:rw" not in Grants.parse(["mem:1g"]).format()


@pytest.mark.parametrize(
    ("parent", "asked", "holds"),
    [
        (["spawn:1", "depth:1", "rootfs:rw"], ["rootfs:rw"], True),
        (["spawn:1", "depth:1", "rootfs:rw"], [], False),  # unstated: the default, a read-only root
        (["spawn:1", "depth:1"], [], False),
    ],
)
def test_a_child_holds_rootfs_rw_only_when_asked_and_its_parent_holds_it(parent, asked, holds):
    assert attenuate(Grants.parse(parent), Grants.parse(asked)).rootfs_rw is holds


def test_a_child_asking_rootfs_rw_of_a_parent_without_it_is_refused_in_one_line():
    with pytest.raises(GrantError) as info:
        attenuate(Grants.parse(["spawn:1", "depth:1"]), Grants.parse(["rootfs:rw"]))
    assert (info.value.kind, dict(info.value.fields)) == (ErrorKind.REFUSED, {"grant": "rootfs:rw"})
    assert "\n" not in str(info.value)


def test_later_limits_override_and_collections_accumulate():
    grants = Grants.parse(["mem:1g", "ro:/a", "env:A=1", "mem:256m", "rw:/b", "env:A=2", "env:B=3", "syscall:x", "syscall:y", "net"], cwd="/")
    assert grants.mem == 256 * M
    assert grants.mounts == (Mount("/a", "/a", False), Mount("/b", "/b", True))
    assert dict(grants.env) == {"A": "2", "B": "3"}
    assert grants.syscalls == {"x", "y"}
    assert grants.net == frozenset({NetRule("public")})


def test_two_mounts_at_one_destination_are_refused():
    with pytest.raises(GrantError) as info:
        Grants.parse(["ro:/a=/in", "rw:/b=/in"])
    assert (info.value.kind, dict(info.value.fields)) == (ErrorKind.BAD_GRANT, {"dest": "/in"})


@pytest.mark.parametrize(
    "specs",
    [
        ["ro:/data", "rw:/src=/work", "net", "cpus:1.5", "mem:512m", "tmp:64m", "world:3g", "pids:32", "time:90s", "env:A=b", "env:C", "spawn:4", "depth:2", "tokens:1000", "syscall:ptrace"],
        ["rootfs:rw", "mem:1g"],
        ["time:250ms", "time:1h"],
        ["time:2d"],
        ["time:36h"],
        ["mem:1000"],
    ],
)
def test_format_round_trips(specs):
    grants = Grants.parse(specs, cwd="/")
    assert Grants.parse(grants.format(), cwd="/") == grants


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "file").write_text("x")
    (tmp_path / "state").mkdir()
    (tmp_path / "sock").write_text("")
    for name, target in [("to_etc", "/etc"), ("to_root", "/"), ("to_proc_self", "/proc/self"), ("to_state", tmp_path / "state"),
                         ("to_data", tmp_path / "data"), ("dangling", tmp_path / "nowhere"), ("to_sock", tmp_path / "sock")]:
        os.symlink(target, tmp_path / name)
    return tmp_path


def protected(tree):
    return [str(tree / "state"), str(tree / "sock")]


@pytest.mark.parametrize(
    "path, kind, what",
    [
        ("/", REFUSED, "/"),  # the host's root
        ("/etc", REFUSED, "/etc"),  # inside what is never granted
        ("/etc/passwd", REFUSED, "/etc"),
        ("/proc", REFUSED, "/proc"),
        ("/proc/1/root", REFUSED, "/proc"),
        ("/sys", REFUSED, "/sys"),
        ("/dev", REFUSED, "/dev"),
        ("/dev/null", REFUSED, "/dev"),
        ("/boot", REFUSED, "/boot"),
        ("{tree}/to_etc", REFUSED, "/etc"),
        ("{tree}/to_root", REFUSED, "/"),
        ("{tree}/to_proc_self", REFUSED, "/proc"),
        ("{tree}/state", REFUSED, "{tree}/state"),  # a protected path: never granted
        ("{tree}/state/..", REFUSED, "{tree}/state"),  # an ancestor of the state dir contains it
        ("{tree}/to_state", REFUSED, "{tree}/state"),
        ("{tree}/sock", REFUSED, "{tree}/sock"),
        ("{tree}/to_sock", REFUSED, "{tree}/sock"),
        ("{tree}/missing", NOT_FOUND, "{tree}/missing"),
        ("{tree}/dangling", NOT_FOUND, "{tree}/nowhere"),  # a symlink to nothing
    ],
)
def test_check_mount_refuses(tree, path, kind, what):
    path = path.format(tree=tree)
    if not os.path.exists("/boot") and path == "/boot":
        pytest.skip("this machine has no /boot")
    with pytest.raises(GrantError) as info:
        check_mount(Mount(path, path, False), protected=protected(tree))
    assert (info.value.kind, dict(info.value.fields)) == (kind, {"grant": f"ro:{path}", "path": what.format(tree=tree)})


@pytest.mark.parametrize("dest", ["/", "/proc", "/proc/x", "/sys/fs", "/dev", "/dev/shm", "/run/quinebox", "/run/quinebox/host.sock"])
def test_check_mount_refuses_reserved_destinations(tree, dest):
    with pytest.raises(GrantError) as info:
        check_mount(Mount(str(tree / "data"), dest, False), protected=protected(tree))
    assert (info.value.kind, dict(info.value.fields)) == (REFUSED, {"grant": f"ro:{tree / 'data'}", "path": dest})


def test_check_mount_resolves_symlinks_to_their_target(tree):
    mount = check_mount(Mount(str(tree / "to_data"), "/in", True), protected=protected(tree))
    assert mount == Mount(str(tree / "data"), "/in", True)


def test_resolve_fills_env_from_the_caller_and_refuses_missing_names(tree):
    grants = Grants.parse(["env:HOME_DIR", "env:FIXED=1"])
    assert dict(resolve(grants, environ={"HOME_DIR": "/h"}, protected=[]).env) == {"HOME_DIR": "/h", "FIXED": "1"}
    with pytest.raises(GrantError) as info:
        resolve(grants, environ={}, protected=[])
    assert (info.value.kind, dict(info.value.fields)) == (NOT_FOUND, {"grant": "env:HOME_DIR", "name": "HOME_DIR"})


# -- read-only all the way down ----------------------------------------------------------

MOUNTINFO = "\n".join(
    [
        "22 27 0:21 / /proc rw,relatime - proc proc rw",
        "27 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw",
        "40 27 0:39 / /data/inner rw,relatime - tmpfs none rw",
        "41 40 0:40 / /data/inner/deeper rw,relatime - tmpfs none rw",
        "42 27 0:41 / /data/with\\040space rw,relatime - tmpfs none rw",
        "43 27 0:42 / /database rw,relatime - tmpfs none rw",  # a sibling that only starts like /data
        "44 27 0:43 / /data rw,relatime - tmpfs none rw",  # the granted path itself
    ]
)


def test_submounts_are_those_strictly_below_parents_first_unescaped():
    assert submounts(MOUNTINFO, "/data") == ["/data/inner", "/data/with space", "/data/inner/deeper"]
    assert submounts(MOUNTINFO, "/data/inner") == ["/data/inner/deeper"]
    assert submounts(MOUNTINFO, "/elsewhere") == []


@pytest.mark.parametrize(
    "granted, added",
    [
        # ro: every submount becomes a read-only mount of its own, at the same place under DEST
        ([Mount("/data", "/data", False)], [("/data/inner", "/data/inner"), ("/data/with space", "/data/with space"), ("/data/inner/deeper", "/data/inner/deeper")]),
        ([Mount("/data", "/in", False)], [("/data/inner", "/in/inner"), ("/data/with space", "/in/with space"), ("/data/inner/deeper", "/in/inner/deeper")]),
        # rw: the engine's recursive bind keeps each submount's own mode; nothing to add
        ([Mount("/data", "/data", True)], []),
        # a grant that names a submount more exactly decides for it and below it
        ([Mount("/data", "/data", False), Mount("/data/inner", "/data/inner", True)], [("/data/with space", "/data/with space")]),
    ],
)
def test_read_only_reaches_every_submount(granted, added):
    mounts = read_only_all_the_way(tuple(granted), MOUNTINFO)
    assert mounts[: len(granted)] == tuple(granted)
    assert [(m.source, m.dest) for m in mounts[len(granted) :]] == added
    assert not any(m.writable for m in mounts[len(granted) :])


def test_secrets_accumulate_by_name_and_format_back():
    grants = Grants.parse(["secret:T@a.example.com", "secret:U@u.example.com", "secret:T@b.example.com"])
    assert grants.secrets == (("T", ("a.example.com", "b.example.com")), ("U", ("u.example.com",)))
    assert Grants.parse(grants.format()) == grants


def test_a_secret_must_be_set_where_quinebox_runs():
    with pytest.raises(GrantError) as info:
        resolve(Grants.parse(["secret:T@a.example.com"]), environ={}, protected=[])
    assert (info.value.kind, dict(info.value.fields)) == (NOT_FOUND, {"grant": "secret:T", "name": "T"})
    assert resolve(Grants.parse(["secret:T@a.example.com"]), environ={"T": "v"}, protected=[]).secrets == (("T", ("a.example.com",)),)


@pytest.mark.parametrize(
    "spec, line",
    [
        ("net:localhost:18089", "refused grant 'net:localhost:18089': localhost is the box's own loopback inside the box, never the host's; "
                                "for a service on the host's loopback grant net:host-loopback:18089 and connect to host-loopback:18089"),
        ("net:127.0.0.1:18089", "refused grant 'net:127.0.0.1:18089': 127.0.0.1/32 reaches the host's own loopback, which no address grant may; "
                                "for one service on the host's loopback grant net:host-loopback:PORT and connect to host-loopback:PORT"),
        ("net:[::1]", "refused grant 'net:[::1]': ::1/128 reaches the host's own loopback, which no address grant may; "
                      "for one service on the host's loopback grant net:host-loopback:PORT and connect to host-loopback:PORT"),
        ("net:fe80::/10", "refused grant 'net:fe80::/10': fe80::/10 is multicast, broadcast or IPv6 link-local: no connection through the host's proxy can go there"),
        ("net:host-loopback", "bad grant 'net:host-loopback': name the one port of the host's loopback the box may reach, as net:host-loopback:8080"),
    ],
)
def test_a_net_grant_that_can_never_work_is_refused_in_one_line_saying_what_to_grant(spec, line):
    with pytest.raises(GrantError) as info:
        Grants.parse(["ro:/data", spec], cwd="/cwd")
    assert str(info.value) == line  # the wording is the point: it says what to grant instead
    assert (info.value.kind, dict(info.value.fields)) == (BAD_GRANT if line.startswith("bad") else REFUSED, {"grant": spec})


def test_a_deny_rule_may_name_what_no_grant_may_and_an_ask_rule_may_not():
    from quinebox.audit.asks import Asks

    asks = Asks.parse(deny=["net:127.0.0.0/8", "net:localhost", "net:fe80::/10"], cwd="/cwd")
    assert asks.deny.format() == ["net:127.0.0.0/8", "net:fe80::/10", "net:localhost"]
    with pytest.raises(GrantError) as info:
        Asks.parse(ask=["net:127.0.0.1:80"], cwd="/cwd")
    assert (info.value.kind, dict(info.value.fields)) == (REFUSED, {"option": "--ask", "grant": "net:127.0.0.1:80"})
    assert Asks.parse(ask=["net:host-loopback:80"], cwd="/cwd").ask.format() == ["net:host-loopback:80"]


def test_host_loopback_parses_formats_back_and_a_child_holds_it_only_as_its_parent_does():
    parent = Grants.parse(["net:host-loopback:8080", "spawn:1", "depth:1"])
    assert parent.format()[0] == "net:host-loopback:8080" and Grants.parse(parent.format()) == parent
    assert attenuate(parent, Grants.parse(["net:host-loopback:8080"])).net == parent.net
    with pytest.raises(GrantError) as info:
        attenuate(parent, Grants.parse(["net:host-loopback:9090"]))
    assert (info.value.kind, dict(info.value.fields)) == (REFUSED, {"grant": "net:host-loopback:9090"})


@pytest.mark.parametrize(
    ("seconds", "said"),
    [(86400, "1d"), (30 * 86400, "30d"), (129600, "36h"), (3600, "1h"), (5400, "90m"), (90, "90s"), (1, "1s"), (0.25, "250ms")],
)
def test_a_duration_is_said_in_its_largest_whole_unit(seconds, said):
    assert format_duration(seconds) == said
    assert parse_duration(said) == seconds
