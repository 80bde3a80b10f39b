"""A box's shape: its container configuration without who it is or what it runs, so a warm box can be made ahead.

Pure functions, table-tested like policy.py. A request's shape is what
`policy.container_config` gives it, less its identity (name; session, owner,
parent and created labels), its command and environment, and the host paths
of its lifeline and empty world, which a warm box has under names of its own.
Only a request that a warm box can serve exactly as a cold one has a shape:
no host mounts, no network, no terminal, no secrets, and a world that starts
empty. Everything that constrains a box — image, user, seccomp, capabilities,
limits, tmpfs, working directory — is in the shape, but for the memory limit,
which the engine changes on a running box: a warm box has the default and a
claim sets the request's. So a claimed box's configuration is a cold box's
(tests/e2e/test_pool.py compares them).
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any, TypeGuard

from quinebox.box.backends.oci.policy import own_userns
from quinebox.box.policy import (
    CGROUP_PREFIX,
    DEFAULT_MEM,
    GUEST_PYTHON,
    HOST_SOCKET,
    LABEL_CREATED,
    LABEL_OWNER,
    LABEL_PARENT,
    LABEL_PREFIX,
    LABEL_SESSION,
    LABEL_USER,
    ROOT_LAYER,
    RUNTIME,
    ContainerConfig,
    proxied,
)
from quinebox.box.spec import BoxSpec

#: On a warm box: the digest of its shape (it holds no session until claimed).
LABEL_POOL = LABEL_PREFIX + "pool"
#: What a warm box runs: the guest's init, waiting on its lifeline for the one command it will run.
POOL_COMMAND = (*GUEST_PYTHON, f"{RUNTIME}/guest/lifeline.py", "--pool")
#: A warm box's session label is this and its own id; its claim record (box/pool/claim.py) says whose it became.
POOL_SESSION = "pool-"
#: What a warm box is made with and a claim sets as the request says: the memory limit (and swap, the same).
UPDATABLE = ("mem_limit", "memswap_limit")
#: Stand-ins, in a shape, for the host paths a warm box has of its own.
LIFELINE_SOURCE = "{lifeline}"
WORLD_SOURCE = "{world}"


def why_cold(spec: BoxSpec) -> str | None:
    """Why a warm box cannot serve `spec` exactly as a cold box would; None when one can."""
    if spec.tty:
        return "a terminal"
    if spec.grants.mounts:
        return "host mounts"
    if spec.grants.net or proxied(spec) or spec.egress_socket:
        return "network"
    if spec.grants.secrets or spec.tls_dir:
        return "secrets"
    world = spec.world
    if world is not None and (world.kind != "dir" or world.base or world.sources or world.archive or world.paths):
        return "a world that does not start empty"
    if not spec.lifeline:
        return "no lifeline"
    if spec.tags:
        return "labels of its own"  # a claimed box keeps the labels it was created with
    return None


def shape_of(spec: BoxSpec, config: ContainerConfig) -> dict[str, Any] | None:
    """The shape of the box `config` describes for `spec`, or None when only a cold box can serve it."""
    if why_cold(spec) is not None or config.host.get("network_mode") != "none":
        return None
    create = {key: value for key, value in config.create.items() if key not in ("command", "environment", "name", "labels")}
    create["labels"] = {LABEL_USER: config.create["labels"][LABEL_USER]}
    host = {**copy.deepcopy(config.host), **dict.fromkeys(UPDATABLE, DEFAULT_MEM)}  # set at the claim, as the engine allows
    world_layer = spec.world.layer if spec.world is not None else None
    for mount in host["mounts"]:
        if mount["Target"] == HOST_SOCKET:
            mount["Source"] = LIFELINE_SOURCE
        elif mount["Target"] == "/world" and mount["Source"] == world_layer:
            mount["Source"] = WORLD_SOURCE
        elif mount["Target"] != RUNTIME:
            return None
    return {"create": create, "host": host}


def updates(config: ContainerConfig) -> dict[str, int]:
    """The limits a claimed box must be given (the engine's `update`) to be configured as `config` says: its memory,
    when not a warm box's. The engine updates no other limit of a running box that a shape holds."""
    wanted = {key: config.host[key] for key in UPDATABLE}
    return {} if all(value == DEFAULT_MEM for value in wanted.values()) else wanted


def well_formed(shape: Any) -> TypeGuard[dict[str, Any]]:
    """Whether what a claimer sent has a shape's form (the pool makes boxes of it only if so)."""
    if not isinstance(shape, dict) or set(shape) != {"create", "host"}:
        return False
    create, host = shape["create"], shape["host"]
    if not isinstance(create, dict) or not isinstance(host, dict) or not isinstance(create.get("image"), str):
        return False
    if not isinstance(create.get("user"), str) or not isinstance(create.get("labels"), dict):
        return False
    mounts = host.get("mounts")
    return isinstance(mounts, list) and all(isinstance(m, dict) and isinstance(m.get("Source"), str) for m in mounts)


def shape_key(shape: dict[str, Any]) -> str:
    """A short digest that names a shape in labels, stats and logs."""
    return hashlib.sha256(json.dumps(shape, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def has_world(shape: dict[str, Any]) -> bool:
    """Whether a warm box of this shape needs an empty world directory of its own (else /world is a tmpfs)."""
    return any(mount["Source"] == WORLD_SOURCE for mount in shape["host"]["mounts"])


def box_user(shape: dict[str, Any]) -> tuple[int, int]:
    """(uid, gid) a box of this shape runs as: its world is theirs."""
    uid, _, gid = str(shape["create"]["user"]).partition(":")
    return int(uid), int(gid or uid)


def warm_config(shape: dict[str, Any], *, box: str, lifeline: str, world: str | None, owner: str, created: str) -> ContainerConfig:
    """The configuration of a warm box `box` of `shape`: its lifeline socket and world at host paths of its own."""
    create = copy.deepcopy(shape["create"])
    host = copy.deepcopy(shape["host"])
    for mount in host["mounts"]:
        if mount["Source"] == LIFELINE_SOURCE:
            mount["Source"] = lifeline
        elif mount["Source"] == WORLD_SOURCE:
            if world is None:
                raise ValueError("this shape needs a world directory")
            mount["Source"] = world
    create.update(
        command=list(POOL_COMMAND),
        environment={},
        name=f"quinebox-{POOL_SESSION}{box}",
        labels={
            **create["labels"],
            LABEL_SESSION: POOL_SESSION + box,
            LABEL_OWNER: owner,
            LABEL_PARENT: "",
            LABEL_CREATED: created,
            LABEL_POOL: shape_key(shape),
        },
    )
    return ContainerConfig(create=create, host=host)


def claim_frame(spec: BoxSpec, config: ContainerConfig) -> dict[str, Any]:
    """What a warm box is told when it is claimed: the command and environment a cold box would have had at create.

    An agent's loop takes the box over (it holds the lifeline itself, as in a cold agent box); any other
    command runs under the lifeline, exactly as `policy.GUEST_PREFIX` runs it."""
    argv = list(config.create["command"])
    if not spec.agent:
        argv = argv[argv.index("--") + 1 :]
    return {"kind": "claim", "argv": argv, "env": dict(config.create["environment"]), "agent": spec.agent}


# -- on an OCI runtime: the shape of a config.json ----------------------------------------------------------


#: A shape's stand-in for a root-made box's own uid and gid maps, which each warm box claims (backends/oci/idmap.py).
OWN_IDS = "quinebox.own-ids"


def oci_shape_of(spec: BoxSpec, config: dict[str, Any], runtime: str) -> dict[str, Any] | None:
    """The shape of the box `config` (an OCI runtime's config.json, backends/oci/policy.py) describes for `spec` on
    `runtime`, or None when only a cold box can serve it: the config less who the box is (its annotations but its
    user's, its cgroup's name) and what it runs (its args and environment, which the claim gives the init), with
    its lifeline's and empty world's sources as stand-ins. Its limits stay in it: a warm box is made with them."""
    if why_cold(spec) is not None:
        return None
    # A new dict for each part that changes, the rest shared with `config` (never changed here: a deep copy of the
    # seccomp profile would be most of a claim's cost).
    shaped = dict(config)
    world_layer = spec.world.layer if spec.world is not None else None
    mounts = []
    for mount in config["mounts"]:
        if mount["destination"] == HOST_SOCKET:
            mount = {**mount, "source": LIFELINE_SOURCE}
        elif mount["destination"] == "/world" and mount.get("type") == "bind" and mount["source"] == world_layer:
            mount = {**mount, "source": WORLD_SOURCE}
        elif mount.get("type") == "bind" and mount["destination"] != RUNTIME:
            return None
        mounts.append(mount)
    shaped["mounts"] = mounts
    shaped["process"] = {**shaped["process"], "args": [], "env": []}
    # Who the box's user is, and how many bytes a writable root's layer holds (rootfs:rw): each warm box is made so.
    shaped["annotations"] = {key: config["annotations"][key] for key in (LABEL_USER, ROOT_LAYER) if key in config["annotations"]}
    parent, _, own = config["linux"]["cgroupsPath"].rpartition("/")
    if own != CGROUP_PREFIX + spec.session:
        return None
    shaped["linux"] = {**shaped["linux"], "cgroupsPath": parent}  # its parent: each warm box's own is named for it
    if spec.caller == 0 and "uidMappings" in shaped["linux"]:  # a root-made box's own ids: each warm box claims its own
        shaped["linux"] = {key: value for key, value in shaped["linux"].items() if key not in ("uidMappings", "gidMappings")} | {OWN_IDS: True}
    return {"backend": "oci", "runtime": runtime, "config": shaped}


def oci_has_world(shape: dict[str, Any]) -> bool:
    """has_world for a runtime's shape."""
    return any(mount.get("source") == WORLD_SOURCE for mount in shape["config"]["mounts"])


def oci_box_user(shape: dict[str, Any]) -> tuple[int, int]:
    """box_user for a runtime's shape."""
    user = shape["config"]["process"]["user"]
    return int(user["uid"]), int(user["gid"])


def well_formed_oci(shape: Any) -> TypeGuard[dict[str, Any]]:
    """well_formed for a runtime's shape."""
    if not isinstance(shape, dict):
        return False
    config = shape.get("config")
    if set(shape) != {"backend", "runtime", "config"} or not isinstance(shape["runtime"], str) or not isinstance(config, dict):
        return False
    process, linux, mounts = config.get("process"), config.get("linux"), config.get("mounts")
    return (
        isinstance(process, dict) and isinstance(linux, dict) and isinstance(linux.get("cgroupsPath"), str)
        and isinstance(config.get("annotations"), dict) and isinstance(mounts, list)
        and all(isinstance(m, dict) and isinstance(m.get("destination"), str) for m in mounts)
    )


def own_ids(shape: dict[str, Any]) -> bool:
    """Whether each box of this OCI shape has host ids of its own (a root-made box's: backends/oci/idmap.py)."""
    return bool(shape.get("config", {}).get("linux", {}).get(OWN_IDS))


def warm_oci_config(
    shape: dict[str, Any], *, box: str, lifeline: str, world: str | None, owner: str, created: str, userns: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """The config.json of a warm box `box` of an OCI `shape`: its lifeline socket and world at host paths of its
    own, its cgroup named for it, and the guest's init waiting for its claim (its environment comes with it).
    `userns`: the (first, count) host ids of its own that a shape with `own_ids` needs."""
    config = copy.deepcopy(shape["config"])
    if own_ids(shape):
        if userns is None:
            raise ValueError("this shape needs host ids of the box's own")
        config["linux"] = own_userns({key: value for key, value in config["linux"].items() if key != OWN_IDS}, userns)
    for mount in config["mounts"]:
        if mount.get("source") == LIFELINE_SOURCE:
            mount["source"] = lifeline
        elif mount.get("source") == WORLD_SOURCE:
            if world is None:
                raise ValueError("this shape needs a world directory")
            mount["source"] = world
    session = POOL_SESSION + box
    config["process"] = {**config["process"], "args": list(POOL_COMMAND), "env": []}
    config["annotations"] = {
        **config["annotations"], LABEL_SESSION: session, LABEL_OWNER: owner, LABEL_PARENT: "", LABEL_CREATED: created, LABEL_POOL: shape_key(shape),
    }
    config["linux"] = {**config["linux"], "cgroupsPath": f"{config['linux']['cgroupsPath']}/{CGROUP_PREFIX}{session}"}
    return config


def oci_claim_frame(config: dict[str, Any]) -> dict[str, Any]:
    """What a warm box on an OCI runtime is told when claimed: what a cold box's init runs (after its `--`) and its
    environment, with the claimer's stdin, stdout and stderr riding along (`fds`). An agent's loop runs under the
    init there, as in a cold box, so nothing takes the lifeline over."""
    args = list(config["process"]["args"])
    env = dict(entry.split("=", 1) for entry in config["process"]["env"])
    return {"kind": "claim", "argv": args[args.index("--") + 1 :], "env": env, "agent": False, "fds": 3}
