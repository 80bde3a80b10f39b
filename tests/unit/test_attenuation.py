"""Attenuation as a table: a child gets a subset of its parent's grants, or a clear refusal."""

import pytest

from quinebox.errors import ErrorKind, GrantError
from quinebox.grants import Grants, Mount, attenuate
from quinebox.netrules import NetRule

REFUSED, LIMIT = ErrorKind.REFUSED, ErrorKind.LIMIT

M = 1 << 20
PARENT = Grants(
    mounts=(Mount("/host/src", "/src", True), Mount("/host/docs", "/docs", False), Mount("/host/src/vendor", "/src/vendor", False)),
    net=frozenset({NetRule("public")}),
    cpus=2.0,
    mem=512 * M,
    pids=100,
    tmp=256 * M,
    world=1024 * M,
    time=60.0,
    env=(("LANG", "C"), ("TOKEN", "t")),
    spawn=5,
    depth=2,
    tokens=1000,
    syscalls=frozenset({"ptrace"}),
)


def child(*specs: str) -> Grants:
    return Grants.parse(specs, cwd="/")


@pytest.mark.parametrize(
    "specs, field, expected",
    [
        ([], "mounts", ()),
        (["ro:/src"], "mounts", (Mount("/host/src", "/src", False),)),
        (["rw:/src"], "mounts", (Mount("/host/src", "/src", True),)),
        (["rw:/src/lib=/lib2"], "mounts", (Mount("/host/src/lib", "/lib2", True),)),
        (["ro:/docs/a/b"], "mounts", (Mount("/host/docs/a/b", "/docs/a/b", False),)),
        (["ro:/src/vendor/x"], "mounts", (Mount("/host/src/vendor/x", "/src/vendor/x", False),)),  # the deepest grant holds it
        ([], "net", frozenset()),
        (["net"], "net", frozenset({NetRule("public")})),
        (["net:pypi.org"], "net", frozenset({NetRule("host", "pypi.org", (80, 443))})),
        ([], "mem", 512 * M),
        (["mem:128m"], "mem", 128 * M),
        (["mem:512m"], "mem", 512 * M),
        ([], "cpus", 2.0),
        (["cpus:0.5"], "cpus", 0.5),
        ([], "pids", 100),
        (["pids:10"], "pids", 10),
        ([], "tmp", 256 * M),
        ([], "world", 1024 * M),
        (["world:100m"], "world", 100 * M),
        ([], "time", 60.0),
        (["time:10s"], "time", 10.0),
        (["env:LANG"], "env", (("LANG", "C"),)),
        (["env:LANG=fr"], "env", (("LANG", "fr"),)),
        ([], "env", ()),
        (["syscall:ptrace"], "syscalls", frozenset({"ptrace"})),
        ([], "spawn", None),
        (["spawn:4"], "spawn", 4),
        ([], "depth", 1),
        (["depth:1"], "depth", 1),
        ([], "tokens", 1000),
        (["tokens:10"], "tokens", 10),
    ],
)
def test_what_a_child_gets(specs, field, expected):
    assert getattr(attenuate(PARENT, child(*specs)), field) == expected


@pytest.mark.parametrize(
    "specs, kind, grant",
    [
        (["ro:/etc"], REFUSED, "ro:/etc"),  # not within anything this box was granted
        (["ro:/world"], REFUSED, "ro:/world"),
        (["ro:/srcx"], REFUSED, "ro:/srcx"),
        (["ro:/"], REFUSED, "ro:/"),
        (["rw:/docs"], REFUSED, "rw:/docs"),  # read-only here: rw may narrow to ro, never the reverse
        (["rw:/src/vendor/x"], REFUSED, "rw:/src/vendor/x"),
        (["mem:1g"], REFUSED, "mem:1g"),  # more than this box's
        (["cpus:4"], REFUSED, "cpus:4"),
        (["pids:101"], REFUSED, "pids:101"),
        (["tmp:1g"], REFUSED, "tmp:1g"),
        (["world:2g"], REFUSED, "world:2g"),
        (["time:2m"], REFUSED, "time:2m"),
        (["env:HOME"], REFUSED, "env:HOME"),
        (["syscall:unshare"], REFUSED, "syscall:unshare"),
        (["spawn:5"], LIMIT, "spawn:5"),  # its spawn budget: the child counts as one
        (["depth:2"], REFUSED, "depth:2"),
        (["tokens:1001"], LIMIT, "tokens:1001"),  # more tokens than it has left
    ],
)
def test_escalations_are_refused_with_one_line(specs, kind, grant):
    with pytest.raises(GrantError) as info:
        attenuate(PARENT, child(*specs))
    assert (info.value.kind, dict(info.value.fields)) == (kind, {"grant": grant})
    assert str(info.value).startswith(f"refused {grant}: ") and "\n" not in str(info.value)


def test_an_escalation_says_what_the_parent_holds():
    """The wording is the point here: the line says what the box has, so its agent can ask for no more."""
    with pytest.raises(GrantError, match=r"^refused mem:1g: more than this box's mem:512m$"):
        attenuate(PARENT, child("mem:1g"))
    with pytest.raises(GrantError, match=r"^refused rw:/docs: /docs is read-only here; rw may narrow to ro, never the reverse$"):
        attenuate(PARENT, child("rw:/docs"))


@pytest.mark.parametrize(
    "parent, kind",
    [
        (Grants(spawn=None, depth=2), REFUSED),  # may not start boxes
        (Grants(spawn=3, depth=None), REFUSED),
        (Grants(spawn=0, depth=0), REFUSED),
        (Grants(spawn=0, depth=2), LIMIT),  # started all the boxes its spawn budget allowed
    ],
)
def test_no_children_without_spawn_and_depth(parent, kind):
    with pytest.raises(GrantError) as info:
        attenuate(parent, Grants())
    assert (info.value.kind, dict(info.value.fields)) == (kind, {"grant": "a child box"})


def test_net_only_if_the_parent_has_it():
    with pytest.raises(GrantError, match=r"refused net: wider than this box's network grants \(none\)"):
        attenuate(Grants(spawn=1, depth=1), child("net"))


def test_unlimited_parent_limits_pass_any_request_and_stay_unlimited_when_unasked():
    parent = Grants(spawn=1, depth=1)
    assert attenuate(parent, child("cpus:8")).cpus == 8.0
    assert attenuate(parent, Grants()).cpus is None and attenuate(parent, Grants()).time is None


@pytest.mark.parametrize(
    "asked, words",
    [
        ("secret:T@b.example.com", "this box holds T for a.example.com, not b.example.com"),
        ("secret:U@a.example.com", "this box holds U for no host, not a.example.com"),
    ],
)
def test_a_child_gets_a_secret_only_for_hosts_its_parent_holds_it_for(asked, words):
    parent = Grants(spawn=1, depth=1, secrets=(("T", ("a.example.com",)),))
    assert attenuate(parent, child("secret:T@a.example.com")).secrets == (("T", ("a.example.com",)),)
    with pytest.raises(GrantError, match=words) as info:
        attenuate(parent, child(asked))
    assert (info.value.kind, dict(info.value.fields)) == (REFUSED, {"grant": asked})
