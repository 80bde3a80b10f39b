"""box/shape.py as tables: which requests a warm box may serve, what a shape keeps, and what a claim tells the box."""

from dataclasses import replace

import pytest

from quinebox.audit.asks import Asks
from quinebox.box.policy import AGENT_COMMAND, GUEST_PREFIX, HOST_SOCKET, LABEL_OWNER, LABEL_PARENT, LABEL_SESSION, LABEL_USER, RUNTIME, container_config
from quinebox.box.pool.warm import Settings
from quinebox.box.shape import (
    LABEL_POOL,
    POOL_COMMAND,
    claim_frame,
    has_world,
    shape_key,
    shape_of,
    updates,
    warm_config,
    well_formed,
    why_cold,
)
from quinebox.box.spec import BoxSpec, ImageInfo, seccomp_base
from quinebox.errors import QuineboxError
from quinebox.grants import Grants
from quinebox.worlds.spec import WorldSpec

IMAGE = ImageInfo(name="quinebox/agent:test", id="sha256:agent", workdir="/world")
EMPTY_WORLD = WorldSpec(kind="dir", layer="/state/sessions/s1/world/tree")


def spec(*grants: str, session: str = "s1", world: WorldSpec | None = EMPTY_WORLD, **extra) -> BoxSpec:
    fields = dict(
        argv=("echo", "hi"), grants=Grants.parse(grants, cwd="/home/u"), image="quinebox/agent:test", session=session, owner="host:42:1000",
        created="2026-01-01T00:00:00+00:00", cwd="/home/u", uid=1000, gid=1000, lifeline=f"/state/run/{session}.sock", world=world,
    )
    if world is not None and world.kind == "dir" and session != "s1":
        fields["world"] = replace(world, layer=world.layer.replace("/s1/", f"/{session}/"))
    fields.update(extra)
    return BoxSpec(**fields)  # type: ignore[arg-type]


def configured(box: BoxSpec):
    return container_config(box, image=IMAGE, runtime="/state/runtime/abc", seccomp=seccomp_base(), arch="SCMP_ARCH_X86_64")


def shape(box: BoxSpec):
    return shape_of(box, configured(box))


@pytest.mark.parametrize(
    "box, reason",
    [
        (spec(), None),
        (spec(world=None), None),
        (spec("mem:256M", "pids:64", "cpus:0.5", "tmp:64M", "time:5s", "syscall:ptrace", "env:FOO=bar"), None),
        (spec(agent=True, argv=(*AGENT_COMMAND, "a mission")), None),
        (spec(parent="p0"), None),
        (spec(tty=True), "a terminal"),
        (spec("ro:/etc=/host-etc"), "host mounts"),
        (spec("net:example.com"), "network"),
        (spec("net:bridge"), "network"),
        (spec(asks=Asks.parse(["net:example.com"], [], cwd="/")), "network"),
        (spec(egress_socket="/state/run/s1.egress"), "network"),
        (spec(tls_dir="/state/run/s1.tls"), "secrets"),
        (spec(world=WorldSpec(kind="bind", layer="/home/u/proj")), "a world that does not start empty"),
        (spec(world=WorldSpec(kind="overlay", layer="/u", work="/w", lowers=("/p",), base=("p0", 3))), "a world that does not start empty"),
        (spec(world=WorldSpec(kind="dir", layer="/t", sources=("/home/u/data",))), "a world that does not start empty"),
        (spec(world=WorldSpec(kind="dir", layer="/t", archive="/home/u/a.tar")), "a world that does not start empty"),
        (spec(world=WorldSpec(kind="dir", layer="/t", base=("p0", 2), paths=("a",))), "a world that does not start empty"),
        (spec(lifeline=None), "no lifeline"),
        (spec(tags=(("run", "r1"),)), "labels of its own"),
    ],
)
def test_which_requests_a_warm_box_serves(box, reason):
    assert why_cold(box) == reason
    assert (shape(box) is None) == (reason is not None)


def test_a_shape_is_the_same_for_every_session_parent_command_and_environment():
    one = shape(spec())
    assert shape(spec(session="s2", parent="p9", argv=("sh", "-c", "exit 3"), owner="host:7:7", created="2027-01-01")) == one
    assert shape(spec(agent=True, argv=(*AGENT_COMMAND, "a mission"), grants=Grants.parse(["env:X=1"], cwd="/"))) == one
    assert shape(spec(argv=("true",), workdir=None)) == one


@pytest.mark.parametrize(
    "change",
    [
        {"grants": Grants.parse(["pids:64"], cwd="/")},
        {"grants": Grants.parse(["cpus:0.5"], cwd="/")},
        {"grants": Grants.parse(["tmp:64M"], cwd="/")},
        {"grants": Grants.parse(["syscall:ptrace"], cwd="/")},
        {"uid": 1001, "gid": 1001},
        {"caller": 1000},
        {"workdir": "/tmp"},
        {"world": None},
    ],
)
def test_what_constrains_a_box_is_in_its_shape(change):
    assert shape_key(shape(spec(**change))) != shape_key(shape(spec()))


@pytest.mark.parametrize("mem, limits", [(None, {}), ("1G", {}), ("256M", {"mem_limit": 256 << 20, "memswap_limit": 256 << 20}), ("4G", {"mem_limit": 4 << 30, "memswap_limit": 4 << 30})])
def test_memory_is_set_at_the_claim_so_every_memory_limit_shares_the_shape(mem, limits):
    box = spec(*([f"mem:{mem}"] if mem else []))
    assert shape_key(shape(box)) == shape_key(shape(spec()))
    assert shape(box)["host"]["mem_limit"] == shape(box)["host"]["memswap_limit"] == 1 << 30
    assert updates(configured(box)) == limits


def test_a_shape_holds_no_identity_command_environment_or_session_path():
    kept = shape(spec(parent="p0", grants=Grants.parse(["env:TOKEN=s3cret"], cwd="/")))
    text = repr(kept)
    for absent in ("s1", "p0", "s3cret", "host:42", "echo", "QUINEBOX_SESSION"):
        assert absent not in text
    assert set(kept["create"]["labels"]) == {LABEL_USER}
    assert [m["Source"] for m in kept["host"]["mounts"]] == ["{world}", "/state/runtime/abc", "{lifeline}"]
    assert has_world(kept) and not has_world(shape(spec(world=None)))


def test_a_warm_box_is_its_shape_with_its_own_paths_and_nothing_to_run_yet():
    kept = shape(spec())
    warm = warm_config(kept, box="b1", lifeline="/state/run/pool-b1.sock", world="/state/pool/b1/tree", owner="host:9:9", created="2026-02-02")
    cold = configured(spec())
    assert warm.host == {**cold.host, "mounts": warm.host["mounts"]}
    assert {m["Target"]: m["Source"] for m in warm.host["mounts"]} == {"/world": "/state/pool/b1/tree", RUNTIME: "/state/runtime/abc", HOST_SOCKET: "/state/run/pool-b1.sock"}
    assert warm.create["command"] == list(POOL_COMMAND) and warm.create["environment"] == {}
    assert warm.create["labels"] == {
        LABEL_USER: "0", LABEL_SESSION: "pool-b1", LABEL_OWNER: "host:9:9", LABEL_PARENT: "", "io.quinebox.created": "2026-02-02", LABEL_POOL: shape_key(kept),
    }
    same = {k: v for k, v in warm.create.items() if k not in ("command", "environment", "labels", "name")}
    assert same == {k: v for k, v in cold.create.items() if k not in ("command", "environment", "labels", "name")}
    with pytest.raises(ValueError):
        warm_config(kept, box="b1", lifeline="/l", world=None, owner="o", created="c")


def test_a_claim_tells_the_box_what_a_cold_box_was_created_with():
    command = spec(argv=("sh", "-c", "echo -- hi"))
    frame = claim_frame(command, configured(command))
    assert frame == {"kind": "claim", "argv": ["sh", "-c", "echo -- hi"], "env": configured(command).create["environment"], "agent": False}
    assert configured(command).create["command"] == [*GUEST_PREFIX, *frame["argv"]]
    assert frame["env"]["QUINEBOX_SESSION"] == "s1"
    agent = spec(agent=True, argv=(*AGENT_COMMAND, "a mission"))
    assert claim_frame(agent, configured(agent))["argv"] == [*AGENT_COMMAND, "a mission"]
    assert claim_frame(agent, configured(agent))["agent"] is True


@pytest.mark.parametrize(
    "candidate, ok",
    [
        ("shape", False),
        ({}, False),
        ({"create": {}, "host": {}}, False),
        ({"create": {"image": "i", "user": "1:1", "labels": {}}, "host": {"mounts": []}}, True),
        ({"create": {"image": "i", "user": "1:1", "labels": {}}, "host": {"mounts": [{"Source": 3}]}}, False),
        ({"create": {"image": "i", "user": "1:1", "labels": {}}, "host": {"mounts": []}, "extra": 1}, False),
        ({"create": {"image": 5, "user": "1:1", "labels": {}}, "host": {"mounts": []}}, False),
    ],
)
def test_only_a_shapes_form_is_made_into_boxes(candidate, ok):
    assert well_formed(candidate) is ok
    assert well_formed(shape(spec()))


@pytest.mark.parametrize(
    "config, size, expected",
    [
        (None, None, Settings(4, 600.0, 2)),
        (2, None, Settings(2, 600.0, 2)),
        ({"size": 8, "ttl": 30, "creates": 1}, None, Settings(8, 30.0, 1)),
        ({"ttl": 5}, 0, Settings(0, 5.0, 2, after=0)),
        (3, 6, Settings(6, 600.0, 2, after=0)),  # a size on the command line is a pool asked for now: it starts with the server
        ({"size": 2, "after": 0}, None, Settings(2, 600.0, 2, after=0)),
        (None, None, Settings(4, 600.0, 2, after=3)),  # by default, from the server's third command within a minute
    ],
)
def test_pool_settings_come_from_config_and_the_command_line(config, size, expected):
    assert Settings.from_config(config, size) == expected


@pytest.mark.parametrize("config, size", [("big", None), ({"size": 2, "color": "red"}, None), ({"size": "x"}, None), ({"ttl": 0}, None), (None, -1), ([], None), ({"after": -1}, None)])
def test_bad_pool_settings_are_one_clear_error(config, size):
    with pytest.raises(QuineboxError, match="pool"):
        Settings.from_config(config, size)
