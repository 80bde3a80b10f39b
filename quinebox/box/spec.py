"""What to run: a box's argv, grants, image and place in the tree.

A `BoxSpec` is a caller's `BoxOptions` (options.py) rendered and fully resolved (paths checked, environment
filled) so that `policy.container_config` can stay a pure function of it.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypedDict

from quinebox import __version__
from quinebox.audit.asks import Asks
from quinebox.box.options import BoxOptions
from quinebox.errors import GrantError
from quinebox.grants import Grants, parse_duration, resolve
from quinebox.processes import owner_id
from quinebox.resources import resource_path
from quinebox.state import run_dir, state_dir
from quinebox.worlds.spec import WorldSpec, root_world

DEFAULT_IMAGE = f"quinebox/agent:{__version__}"
#: The image name that roots a box in the host's own filesystem, read-only, for the developer's own tools (policy_host.py).
HOST_IMAGE = "host"
#: The labels a caller may give a tree's boxes (as io.quinebox.NAME), beside those quinebox sets itself.
TAGS = ("run", "input", "attempt")
#: The uid a box runs as when the caller is root: the image's `agent` user.
AGENT_UID = 1000
#: When to pull a box's image: only when it is not here (as docker run), every time, or never.
PULL_POLICIES = ("missing", "always", "never")


@dataclass(frozen=True)
class ImageInfo:
    """The parts of an image's config a box honours."""

    name: str
    id: str
    env: tuple[tuple[str, str], ...] = ()
    workdir: str = ""
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    arch: str = "amd64"

    @classmethod
    def from_inspect(cls, name: str, data: dict[str, Any]) -> ImageInfo:
        config = data.get("Config") or {}
        env = tuple((key, value) for key, _, value in (item.partition("=") for item in config.get("Env") or []) if _)
        return cls(
            name=name,
            id=data.get("Id", ""),
            env=env,
            workdir=config.get("WorkingDir") or "",
            entrypoint=tuple(config.get("Entrypoint") or ()),
            cmd=tuple(config.get("Cmd") or ()),
            arch=data.get("Architecture") or "amd64",
        )

    def sets(self, name: str) -> bool:
        return any(key == name for key, _ in self.env)


@dataclass(frozen=True)
class BoxSpec:
    argv: tuple[str, ...]
    grants: Grants
    image: str
    session: str
    owner: str
    created: str
    cwd: str
    uid: int
    gid: int
    workdir: str | None = None
    parent: str | None = None
    lifeline: str | None = None
    #: argv is quinebox's agent loop, which holds its own lifeline (no guest init in front of it).
    agent: bool = False
    world: WorldSpec | None = None
    #: A pseudo-terminal in the box, its stdin and stdout the host's terminal.
    tty: bool = False
    pull: str = "missing"
    #: The uid of whoever started the box (the box itself runs as `uid`).
    caller: int = 0
    #: With secret grants: the host directory of the box's trust (its authority and bundle), mounted read-only.
    tls_dir: str | None = None
    #: With net grants (or net rules to ask about): the socket the box hands its outgoing connections to the host's egress proxy over.
    egress_socket: str | None = None
    #: The tree's ask and deny rules: set by whoever started the root, inherited by every box below it.
    asks: Asks = Asks()
    #: Labels of the boxes' own (name, value), shared by the whole tree: a cluster attempt's run, input and attempt number.
    tags: tuple[tuple[str, str], ...] = ()
    #: The backend and OCI runtime asked for (by argument or policy file); None: the environment's or config.yaml's (backends/choice.py).
    backend: str | None = None
    runtime: str | None = None


@functools.lru_cache(maxsize=1)
def seccomp_base() -> dict[str, Any]:
    """quinebox's seccomp profile as shipped; `policy.seccomp_profile` fits it to a box's grants."""
    return json.loads(resource_path("sandbox", "seccomp", "quinebox.json").read_text())


def new_session_id() -> str:
    return os.urandom(6).hex()  # secrets.token_hex, without the start-up of `secrets` (random, hmac, base64)




class RunFiles(TypedDict):
    """A box's files in the run dir, as BoxSpec's fields of the same names."""

    lifeline: str
    tls_dir: str | None
    egress_socket: str | None


def run_files(session: str, grants: Grants, asks: Asks) -> RunFiles:
    """Where a box's sockets and trust live on the host, in the run dir: its lifeline always,
    its egress socket with net grants or net rules to ask about, its trust directory with secret grants that
    have a way out. A secret reaches its host only through the egress proxy, which writes that trust: with no
    proxy (no net grant, or net:bridge) the box holds the placeholder alone, and there is no trust to mount."""
    here = run_dir()
    egress = bool(grants.net or asks.ask.net)
    proxied = egress and not any(rule.kind == "bridge" for rule in grants.net)
    return {
        "lifeline": str(here / f"{session}.sock"),
        "tls_dir": str(here / f"{session}.tls") if grants.secrets and proxied else None,
        "egress_socket": str(here / f"{session}.egress") if egress else None,
    }






def load_policy(name_or_path: str) -> dict[str, Any]:
    """A YAML policy file (or a preset name from sandbox/policies) → its grant strings under grants, ask and deny,
    and the backend and runtime it requires, if it says (`runtime: runsc` to require gVisor)."""
    from quinebox.documents import read_yaml

    path = Path(name_or_path)
    if not path.exists() and "/" not in name_or_path and not path.suffix:
        path = resource_path("sandbox", "policies", f"{name_or_path}.yaml")
        if not path.exists():
            raise GrantError(f"policy {name_or_path!r} not found: give a YAML file or a preset ({', '.join(policy_presets())})")
    doc = read_yaml(path, "policy", GrantError)
    if doc is None:
        return {"grants": [], "ask": [], "deny": []}
    lists = {key: doc.get(key, []) for key in ("grants", "ask", "deny")} if isinstance(doc, dict) else {}
    unknown = set(doc) - {"grants", "ask", "deny", "description", "backend", "runtime"} if isinstance(doc, dict) else set()
    if not lists or unknown or not all(isinstance(v, list) and all(isinstance(g, str) for g in v) for v in lists.values()):
        raise GrantError(
            f"bad policy {name_or_path}: expected a mapping with 'grants:', 'ask:' and 'deny:' as lists of grant strings (and optionally 'backend:', 'runtime:')"
        )
    for key in ("backend", "runtime"):
        if key in doc:
            if not isinstance(doc[key], str) or not doc[key]:
                raise GrantError(f"bad policy {name_or_path}: '{key}:' must name one, as in '{key}: {'oci' if key == 'backend' else 'runsc'}'")
            lists[key] = doc[key]
    return lists


def policy_presets() -> list[str]:
    return sorted(p.stem for p in resource_path("sandbox", "policies").glob("*.yaml"))


def protected_paths(environ: Mapping[str, str], state_dir: Path) -> list[str]:
    """Host paths no grant may expose: the engine's socket and quinebox's own state."""
    paths = ["/var/run/docker.sock", "/run/docker.sock", str(state_dir)]
    docker_host = environ.get("DOCKER_HOST", "")
    if docker_host.startswith("unix://"):
        paths.append(docker_host[len("unix://") :])
    return paths


def build_spec(
    argv: Sequence[str],
    options: BoxOptions | None = None,
    *,
    parent: str | None = None,
    environ: Mapping[str, str] | None = None,
    cwd: str | None = None,
    agent: bool = False,
    tty: bool = False,
    **given: Any,
) -> BoxSpec:
    """Parse and check everything about a box before anything is started: its `options` (or the options `given` by
    name) rendered with its command and its place (`parent`, `agent`, `tty`) into a BoxSpec.

    With no argv, the box runs its image's entrypoint and command (checked once the image is found).
    """
    o = BoxOptions.of(options, **given)
    image, pull, tags, workdir = o.image, o.pull, o.tags, o.workdir
    if not argv and not image:
        raise GrantError("nothing to run: give a command, as in `quinebox exec -- CMD [ARGS...]`")
    if tags and not {name for name, _ in tags} <= set(TAGS):
        raise GrantError(f"bad box labels {sorted({name for name, _ in tags} - set(TAGS))}: a caller may set only {', '.join(TAGS)}")
    if pull not in PULL_POLICIES:
        raise GrantError(f"bad --pull {pull!r}: use one of {', '.join(PULL_POLICIES)}")
    environ = os.environ if environ is None else environ
    cwd = cwd or os.getcwd()
    policy_lists = load_policy(o.policy) if o.policy else {}
    backend, runtime = required_backend(policy_lists, o.backend, o.runtime)
    parsed = Grants.parse([*policy_lists.get("grants", []), *o.grants], cwd=cwd)
    asks = Asks.parse([*policy_lists.get("ask", []), *o.ask], [*policy_lists.get("deny", []), *o.deny], o.ask_timeout, cwd=cwd)
    if o.timeout is not None:
        parsed = parsed.merge(Grants(time=parse_duration(str(o.timeout))))
    if workdir is not None and not workdir.startswith("/"):
        raise GrantError(f"bad workdir {workdir!r}: it must be an absolute path inside the box")
    protected = protected_paths(environ, state_dir())
    resolved = resolve(parsed, environ=environ, protected=protected)
    asks = replace(asks, ask=resolve(asks.ask, environ=environ, protected=protected))
    uid, gid = os.getuid(), os.getgid()
    if uid == 0:
        uid = gid = AGENT_UID
    session = new_session_id()
    world_spec = root_world(
        session, world=o.world, world_from=o.world_from, world_tar=o.world_tar, world_at=o.world_at, cwd=cwd, protected=protected
    )
    return BoxSpec(
        argv=tuple(argv),
        grants=resolved,
        image=image or DEFAULT_IMAGE,
        session=session,
        owner=owner_id(),
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        cwd=cwd,
        uid=uid,
        gid=gid,
        workdir=workdir,
        parent=parent,
        **run_files(session, resolved, asks),
        agent=agent,
        world=world_spec,
        tty=tty,
        pull=pull,
        caller=os.getuid(),
        asks=asks,
        tags=tags,
        backend=backend,
        runtime=runtime,
    )


#: The backend whose boxes run on an OCI runtime (backends/oci/): the one a policy's `runtime:` requires.
RUNTIME_BACKEND = "oci"


def required_backend(policy: Mapping[str, Any], backend: str | None, runtime: str | None) -> tuple[str | None, str | None]:
    """The backend and runtime asked for, a policy's requirement included; asking for another than a policy requires is an error.
    A policy's `runtime:` requires the backend that runs boxes on an OCI runtime (RUNTIME_BACKEND); any other asked for is refused."""
    for key, asked in (("backend", backend), ("runtime", runtime)):
        required = policy.get(key)
        if required and asked and asked != required:
            raise GrantError(f"the policy requires {key} {required}, and {asked} was asked for: drop --{key} or use another policy")
    chosen = policy.get("backend") or backend
    if policy.get("runtime") and chosen not in (None, "auto", RUNTIME_BACKEND):
        raise GrantError(f"the policy requires the OCI runtime {policy['runtime']}, which the {chosen} backend does not use: drop --backend, or use another policy")
    return chosen or (RUNTIME_BACKEND if policy.get("runtime") else None), policy.get("runtime") or runtime
