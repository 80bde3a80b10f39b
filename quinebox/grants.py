"""The grant grammar: what a box may touch, as one string per capability.

One grammar serves the CLI (`-g`), policy files, the Python API and, later,
child requests from inside a box. Parsing is pure; `resolve` is the one step
that looks at the host (paths, environment) and it refuses anything that
would hand the box a way out before any container exists.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any

from quinebox.errors import ErrorKind, GrantError
from quinebox.netrules import NetRule, covers, is_host_name, parse_rule, unreachable

_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_DURATION_UNITS = {"": 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_SIZE_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?$", re.IGNORECASE)
_DURATION_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|)$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SYSCALL_RE = re.compile(r"^[a-z_][a-z0-9_]*$")
_KINDS = "ro, rw, net, cpus, mem, pids, tmp, world, time, env, secret, spawn, depth, tokens, syscall, rootfs"


def parse_size(text: str) -> int:
    """`128m`, `2g`, `512k`, `1048576` → bytes (binary units, as Docker reads them)."""
    match = _SIZE_RE.match(text.strip())
    if not match:
        raise GrantError(f"bad size {text!r}: use a number with an optional unit k, m, g or t (e.g. 128m, 2g)", value=text)
    number, unit = match.groups()
    value = int(float(number) * _SIZE_UNITS[unit.lower()])
    if value <= 0:
        raise GrantError(f"bad size {text!r}: it must be more than zero", value=text)
    return value


def format_size(value: int) -> str:
    for unit in ("t", "g", "m", "k"):
        if value % _SIZE_UNITS[unit] == 0:
            return f"{value // _SIZE_UNITS[unit]}{unit}"
    return str(value)


def parse_duration(text: str) -> float:
    """`30`, `30s`, `5m`, `1h`, `7d`, `250ms` → seconds."""
    match = _DURATION_RE.match(text.strip())
    if not match:
        raise GrantError(f"bad duration {text!r}: use seconds or a unit ms, s, m, h or d (e.g. 30, 30s, 5m, 7d)", value=text)
    number, unit = match.groups()
    value = float(number) * _DURATION_UNITS[unit]
    if value <= 0:
        raise GrantError(f"bad duration {text!r}: it must be more than zero", value=text)
    return value


def format_duration(value: float) -> str:
    for unit in ("d", "h", "m", "s"):
        if value >= _DURATION_UNITS[unit] and value % _DURATION_UNITS[unit] == 0:
            return f"{int(value // _DURATION_UNITS[unit])}{unit}"
    return f"{int(round(value * 1000))}ms"


@dataclass(frozen=True)
class Mount:
    """A host path the box may see. `source` is absolute; after `resolve` it is the real path."""

    source: str
    dest: str
    writable: bool


@dataclass(frozen=True)
class Grants:
    """Everything a box may do beyond the safe defaults. None means "the default"."""

    mounts: tuple[Mount, ...] = ()
    #: Where the box may connect (netrules.py); empty: nowhere.
    net: frozenset[NetRule] = frozenset()
    #: Secrets the box may use but never hold, each with the hosts it goes to (box/net/secrets.py).
    secrets: tuple[tuple[str, tuple[str, ...]], ...] = ()
    cpus: float | None = None
    mem: int | None = None
    pids: int | None = None
    tmp: int | None = None
    #: Bytes the box may add to its world (host disk, so it needs its own cap).
    world: int | None = None
    time: float | None = None
    env: tuple[tuple[str, str | None], ...] = ()
    spawn: int | None = None
    depth: int | None = None
    tokens: int | None = None
    syscalls: frozenset[str] = field(default_factory=frozenset)
    rootfs_rw: bool = False  #: `rootfs:rw`: a writable root layer of the box's own, discarded with it (policy.root_layer)

    @classmethod
    def parse(cls, specs: Iterable[str], *, cwd: str | None = None, keeping_out: bool = False) -> Grants:
        """Combine grant strings; a later limit overrides an earlier one, as flags do. `keeping_out`: deny rules (parse_grant)."""
        grants = cls()
        for spec in specs:
            grants = grants.merge(parse_grant(spec, cwd=cwd, keeping_out=keeping_out))
        return grants

    def merge(self, other: Grants) -> Grants:
        """`other` on top of `self`: scalars override, mounts/env/syscalls accumulate."""
        changes: dict[str, Any] = {
            name: getattr(other, name)
            for name in ("cpus", "mem", "pids", "tmp", "world", "time", "spawn", "depth", "tokens")
            if getattr(other, name) is not None
        }
        mounts = list(self.mounts)
        for mount in other.mounts:
            if any(m.dest == mount.dest for m in mounts):
                raise GrantError(f"two grants mount at {mount.dest}: give each mount its own destination (PATH=DEST)", dest=mount.dest)
            mounts.append(mount)
        env = dict(self.env)
        env.update(dict(other.env))
        secrets = {name: set(hosts) for name, hosts in self.secrets}
        for name, hosts in other.secrets:
            secrets.setdefault(name, set()).update(hosts)
        return replace(
            self, mounts=tuple(mounts), net=self.net | other.net, secrets=tuple((name, tuple(sorted(hosts))) for name, hosts in sorted(secrets.items())),
            env=tuple(env.items()), syscalls=self.syscalls | other.syscalls, rootfs_rw=self.rootfs_rw or other.rootfs_rw, **changes,
        )

    def format(self) -> list[str]:
        """The grant strings that parse back to these grants."""
        out = [f"{'rw' if m.writable else 'ro'}:{m.source}" + (f"={m.dest}" if m.dest != m.source else "") for m in self.mounts]
        out += [rule.format() for rule in sorted(self.net)]
        out += [f"secret:{name}@{','.join(hosts)}" for name, hosts in self.secrets]
        if self.cpus is not None:
            out.append(f"cpus:{self.cpus:g}")
        for name in ("mem", "tmp", "world"):
            if getattr(self, name) is not None:
                out.append(f"{name}:{format_size(getattr(self, name))}")
        for name in ("pids", "spawn", "depth", "tokens"):
            if getattr(self, name) is not None:
                out.append(f"{name}:{getattr(self, name)}")
        if self.time is not None:
            out.append(f"time:{format_duration(self.time)}")
        out += [f"env:{k}" + (f"={v}" if v is not None else "") for k, v in self.env]
        return out + [f"syscall:{name}" for name in sorted(self.syscalls)] + (["rootfs:rw"] if self.rootfs_rw else [])


def _positive_int(kind: str, text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) <= 0:
        raise GrantError(f"bad grant '{kind}:{text}': {kind} takes a whole number above zero (e.g. {kind}:64)", grant=f"{kind}:{text}")
    return int(text)


def _mount(kind: str, value: str, cwd: str | None) -> Mount:
    path, _, dest = value.partition("=")
    if not path:
        raise GrantError(f"bad grant '{kind}:{value}': give a path, as {kind}:PATH or {kind}:PATH=DEST", grant=f"{kind}:{value}")
    source = os.path.normpath(os.path.join(cwd or os.getcwd(), os.path.expanduser(path)))
    if dest:
        if not dest.startswith("/"):
            raise GrantError(f"bad grant '{kind}:{value}': the destination {dest!r} must be an absolute path inside the box", grant=f"{kind}:{value}")
        if ".." in PurePosixPath(dest).parts:
            raise GrantError(f"bad grant '{kind}:{value}': the destination may not contain '..'", grant=f"{kind}:{value}")
        dest = os.path.normpath(dest)
    else:
        dest = source
    return Mount(source=source, dest=dest, writable=kind == "rw")


def parse_grant(spec: str, *, cwd: str | None = None, keeping_out: bool = False) -> Grants:
    """One grant string → a Grants holding just that grant. Pure except for `~` and relative paths. A `net` grant no
    connection could use is refused, saying what to grant instead, before any box starts; a deny rule (`keeping_out`) may name it."""
    kind, sep, value = spec.partition(":")
    kind = kind.strip()
    if kind == "net":
        if sep and not value:
            raise GrantError(f"bad grant {spec!r}: give a destination after 'net:' (net:example.com, net:10.0.0.0/8, net:bridge), or 'net' for any public one", grant=spec)
        rule = parse_rule(spec, value if sep else None)
        if not keeping_out and unreachable(rule):
            raise GrantError(f"refused grant {spec!r}: {unreachable(rule)}", kind=ErrorKind.REFUSED, grant=spec)
        return Grants(net=frozenset({rule}))
    if not sep or not value:
        raise GrantError(f"bad grant {spec!r}: expected KIND:VALUE with KIND one of {_KINDS}", grant=spec)
    if kind in ("ro", "rw"):
        return Grants(mounts=(_mount(kind, value, cwd),))
    if kind == "cpus":
        try:
            cpus = float(value)
        except ValueError:
            cpus = 0.0
        if not cpus > 0:
            raise GrantError(f"bad grant {spec!r}: cpus takes a number above zero (e.g. cpus:1.5)", grant=spec)
        return Grants(cpus=cpus)
    if kind in ("mem", "tmp", "world"):
        try:
            size: dict[str, Any] = {kind: parse_size(value)}  # the one field `kind` names
            return Grants(**size)
        except GrantError as exc:
            raise GrantError(f"bad grant {spec!r}: {exc}", grant=spec) from None
    if kind == "time":
        try:
            return Grants(time=parse_duration(value))
        except GrantError as exc:
            raise GrantError(f"bad grant {spec!r}: {exc}", grant=spec) from None
    if kind in ("pids", "spawn", "depth", "tokens"):
        count: dict[str, Any] = {kind: _positive_int(kind, value)}  # the one field `kind` names
        return Grants(**count)
    if kind == "env":
        name, eq, env_value = value.partition("=")
        if not _ENV_NAME_RE.match(name):
            raise GrantError(f"bad grant {spec!r}: {name!r} is not an environment variable name", grant=spec)
        return Grants(env=((name, env_value if eq else None),))
    if kind == "secret":
        name, at, hosts = value.partition("@")
        listed = [h.lower().rstrip(".") for h in hosts.split(",")]
        if not _ENV_NAME_RE.match(name) or not at or not all(is_host_name(h) for h in listed):
            raise GrantError(f"bad grant {spec!r}: expected secret:NAME@HOST[,HOST...], NAME an environment variable of quinebox's, each HOST a name", grant=spec)
        return Grants(secrets=((name, tuple(sorted(set(listed)))),))
    if kind == "syscall":
        if not _SYSCALL_RE.match(value):
            raise GrantError(f"bad grant {spec!r}: {value!r} is not a system call name", grant=spec)
        return Grants(syscalls=frozenset({value}))
    if kind == "rootfs":
        if value != "rw":
            raise GrantError(f"bad grant {spec!r}: the root is read-only unless granted rootfs:rw (a writable layer of the box's own)", grant=spec)
        return Grants(rootfs_rw=True)
    raise GrantError(f"unknown grant {spec!r}: KIND must be one of {_KINDS}", grant=spec)


def within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


_NEVER_WITHIN = ("/proc", "/sys", "/dev", "/etc", "/boot", "/var/lib/docker", "/var/lib/containerd")
_BOX_RESERVED = ("/proc", "/sys", "/dev", "/run/quinebox")


def check_mount(mount: Mount, *, protected: Iterable[str]) -> Mount:
    """Resolve a mount's source and refuse it when it would expose the host.

    `protected` are paths (the Docker socket, the state dir) that may be neither
    granted nor contained in a grant. Symlinks are resolved first, so a link to
    a forbidden place is as forbidden as the place.
    """
    label = f"{'rw' if mount.writable else 'ro'}:{mount.source}"
    for root in _NEVER_WITHIN:
        if within(mount.source, root):
            raise GrantError(f"cannot grant {label}: {mount.source} is inside {root}, which is never granted", kind=ErrorKind.REFUSED, grant=label, path=root)
    if not os.path.lexists(mount.source):
        raise GrantError(f"cannot grant {label}: {mount.source} does not exist", kind=ErrorKind.NOT_FOUND, grant=label, path=mount.source)
    try:
        real = os.path.realpath(mount.source)
    except OSError as exc:
        raise GrantError(f"cannot grant {label}: cannot resolve it ({exc.strerror})", kind=ErrorKind.FAILED, grant=label, path=mount.source) from None
    if not os.path.exists(real):
        raise GrantError(f"cannot grant {label}: it is a symlink to {real}, which does not exist", kind=ErrorKind.NOT_FOUND, grant=label, path=real)
    shown = mount.source if real == mount.source else f"{mount.source} (→ {real})"
    if real == "/":
        raise GrantError(f"cannot grant {label}: {shown} is the host's root; grant the directories the box needs", kind=ErrorKind.REFUSED, grant=label, path="/")
    for root in _NEVER_WITHIN:
        if within(real, os.path.realpath(root)):
            raise GrantError(f"cannot grant {label}: {shown} is inside {root}, which is never granted", kind=ErrorKind.REFUSED, grant=label, path=root)
    for path in protected:
        guarded = os.path.realpath(path)
        if within(real, guarded) or within(guarded, real):
            raise GrantError(f"cannot grant {label}: {shown} would expose {path}, which is never granted", kind=ErrorKind.REFUSED, grant=label, path=path)
    if mount.dest == "/" or any(within(mount.dest, root) for root in _BOX_RESERVED):
        raise GrantError(f"cannot grant {label}: the destination {mount.dest} is reserved inside the box", kind=ErrorKind.REFUSED, grant=label, path=mount.dest)
    return replace(mount, source=real)


_ESCAPED = re.compile(r"\\([0-7]{3})")


def submounts(mountinfo: str, root: str) -> list[str]:
    """Mount points strictly below `root`, from the text of /proc/self/mountinfo, parents first."""
    points = set()
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        if len(fields) > 4:
            point = _ESCAPED.sub(lambda m: chr(int(m.group(1), 8)), fields[4])
            if point != root and within(point, root):
                points.add(point)
    return sorted(points, key=lambda p: (p.count("/"), p))


def read_only_all_the_way(mounts: tuple[Mount, ...], mountinfo: str | None = None) -> tuple[Mount, ...]:
    """Each `ro:` grant's submounts, made read-only too.

    The engine's read-only bind mount is not recursive here: a filesystem
    mounted below a granted path would stay writable in the box. A submount
    that another grant names more exactly is that grant's to decide.
    """
    if all(m.writable for m in mounts):
        return mounts
    text = Path("/proc/self/mountinfo").read_text() if mountinfo is None else mountinfo
    added: list[Mount] = []
    taken = {m.dest for m in mounts}
    for mount in (m for m in mounts if not m.writable):
        closer = [m.dest for m in mounts if m.dest != mount.dest and within(m.dest, mount.dest)]
        for point in submounts(text, mount.source):
            dest = os.path.normpath(os.path.join(mount.dest, os.path.relpath(point, mount.source)))
            if dest not in taken and not any(within(dest, other) for other in closer):
                taken.add(dest)
                added.append(Mount(source=point, dest=dest, writable=False))
    return mounts + tuple(added)


def resolve(grants: Grants, *, environ: Mapping[str, str], protected: Iterable[str]) -> Grants:
    """Check every mount against the host and fill `env:NAME` from the caller's environment."""
    protected = tuple(protected)
    mounts = read_only_all_the_way(tuple(check_mount(m, protected=protected) for m in grants.mounts))
    env = []
    for name, value in grants.env:
        if value is None:
            if name not in environ:
                raise GrantError(f"cannot grant env:{name}: {name} is not set here; give a value with env:{name}=VALUE", kind=ErrorKind.NOT_FOUND, grant=f"env:{name}", name=name)
            value = environ[name]
        env.append((name, value))
    for name, _ in grants.secrets:
        if name not in environ:
            raise GrantError(
                f"cannot grant secret:{name}: {name} is not set in quinebox's environment; set it where quinebox runs",
                kind=ErrorKind.NOT_FOUND, grant=f"secret:{name}", name=name,
            )
    return replace(grants, mounts=mounts, env=tuple(env))


def _refuse(what: str, why: str, kind: ErrorKind = ErrorKind.REFUSED) -> GrantError:
    """A child's grant `what` refused: wider than its parent's (REFUSED), or past a budget it has used up (LIMIT)."""
    return GrantError(f"refused {what}: {why}", kind=kind, grant=what)


def attenuate(parent: Grants, child: Grants) -> Grants:
    """The grants a child gets: what it asked for, checked to be within what its parent holds now.

    `parent` carries the parent's effective limits and what it has left of its
    budgets (spawn, depth, time, tokens); `child` is the request as parsed, its
    mount sources being paths inside the parent's box. Unstated limits are the
    parent's; unstated budgets are none (spawn, depth) or all that is left
    (time, tokens). Anything wider than the parent is refused, never narrowed
    silently: an agent asking for more should hear no.
    """
    if parent.spawn is None or not parent.depth:
        raise _refuse("a child box", "this box may not start boxes (its parent granted no spawn:N and depth:N)")
    if parent.spawn < 1:
        raise _refuse("a child box", "this box has started all the boxes its spawn budget allowed", ErrorKind.LIMIT)
    mounts = []
    for mount in child.mounts:
        label = f"{'rw' if mount.writable else 'ro'}:{mount.source}"
        holders = [m for m in parent.mounts if within(mount.source, m.dest)]
        if not holders:
            raise _refuse(label, f"{mount.source} is not within anything this box was granted from the host")
        held = max(holders, key=lambda m: len(m.dest))
        if mount.writable and not held.writable:
            raise _refuse(label, f"{held.dest} is read-only here; rw may narrow to ro, never the reverse")
        rel = os.path.relpath(mount.source, held.dest)
        source = held.source if rel == "." else os.path.join(held.source, rel)
        mounts.append(Mount(source=source, dest=mount.dest, writable=mount.writable))
    for rule in sorted(child.net):
        if not covers(parent.net, rule):
            rules = " ".join(r.format() for r in sorted(parent.net)) or "none"
            raise _refuse(rule.format(), f"wider than this box's network grants ({rules})")
    limits: dict[str, Any] = {}  # each a field of its own type
    for name in ("cpus", "mem", "pids", "tmp", "world", "time"):
        mine, asked = getattr(parent, name), getattr(child, name)
        if asked is not None and mine is not None and asked > mine:
            shown = Grants(**{name: asked}).format()[0]
            have = Grants(**{name: mine}).format()[0]
            raise _refuse(shown, f"more than this box's {have}")
        limits[name] = asked if asked is not None else mine
    held_env = dict(parent.env)
    env = []
    for name, value in child.env:
        if name not in held_env:
            raise _refuse(f"env:{name}", f"this box holds no {name} to pass on")
        env.append((name, held_env[name] if value is None else value))
    held_secrets = dict(parent.secrets)
    for name, hosts in child.secrets:
        wider = set(hosts) - set(held_secrets.get(name, ()))
        if wider:
            raise _refuse(f"secret:{name}@{','.join(hosts)}", f"this box holds {name} for {', '.join(held_secrets.get(name, ())) or 'no host'}, not {', '.join(sorted(wider))}")
    extra = child.syscalls - parent.syscalls
    if extra:
        raise _refuse(f"syscall:{sorted(extra)[0]}", "this box may not make that call either")
    if child.rootfs_rw and not parent.rootfs_rw:
        raise _refuse("rootfs:rw", "this box's own root is read-only")
    spawn = child.spawn or 0
    if spawn + 1 > parent.spawn:
        raise _refuse(f"spawn:{spawn}", f"this box may start {parent.spawn} more box(es), and the child counts as one", ErrorKind.LIMIT)
    depth = child.depth if child.depth is not None else parent.depth - 1
    if depth > parent.depth - 1:
        raise _refuse(f"depth:{depth}", f"children of this box may be at most {parent.depth - 1} level(s) deep")
    if child.tokens is not None and parent.tokens is not None and child.tokens > parent.tokens:
        raise _refuse(f"tokens:{child.tokens}", f"this box has {parent.tokens} tokens left", ErrorKind.LIMIT)
    tokens = child.tokens if child.tokens is not None else parent.tokens
    return replace(
        child,
        mounts=tuple(mounts),
        env=tuple(env),
        spawn=spawn or None,
        depth=depth or None,
        tokens=tokens,
        **limits,
    )
