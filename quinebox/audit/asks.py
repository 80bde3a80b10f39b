"""`ask:` and `deny:` rules, and what each request a box makes comes to under them. Pure.

A grant is held (`-g`), asked (`--ask`: not held, but a person may approve
it), denied (`--deny`: never, whatever was held or remembered), or none of
these (refused at once). Deny wins over ask, and ask over allow: a connection
that an `ask` covers is asked even when a `net` grant holds it, so a person
can hold `net` and still be asked about `*.example.com`.

The rules are the root's, set by whoever started the tree; every box in it
inherits them, and nothing a box says changes them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from quinebox.errors import GrantError
from quinebox.grants import Grants, Mount, attenuate, parse_duration, within
from quinebox.netrules import Address, NetRule, covers, verdict

#: How long a request waits for a person before it is denied.
DEFAULT_ASK_TIMEOUT = 300.0

#: What a request comes to: refused by a deny rule, put to a person, allowed by a grant, or refused for want of one.
DENY, ASK, HOLD, REFUSE = "deny", "ask", "hold", "refuse"


@dataclass(frozen=True)
class Asks:
    """The tree's ask and deny rules, the project directory an "always" is remembered for, and how long to wait."""

    ask: Grants = Grants()
    deny: Grants = Grants()
    timeout: float = DEFAULT_ASK_TIMEOUT
    project: str = ""

    @classmethod
    def parse(cls, ask: Iterable[str] = (), deny: Iterable[str] = (), timeout: float | str | None = None, *, cwd: str) -> Asks:
        timeout_s = DEFAULT_ASK_TIMEOUT if timeout is None else 0.0 if str(timeout).strip() in ("0", "0s") else parse_duration(str(timeout))
        return cls(ask=_parse("ask", ask, cwd), deny=_parse("deny", deny, cwd), timeout=timeout_s, project=cwd)

    def __bool__(self) -> bool:
        return self.ask != Grants() or self.deny != Grants()

    def format(self) -> dict[str, list[str]]:
        return {"ask": self.ask.format(), "deny": self.deny.format()}

    # -- a connection ---------------------------------------------------------------------------

    def egress(self, held: frozenset[NetRule], name: str | None, address: Address, port: int) -> tuple[str, str]:
        """(DENY/ASK/HOLD/REFUSE, the rule that decided it or why none did)."""
        rule, _ = verdict(self.deny.net, name, address, port)
        if rule is not None:
            return DENY, f"denied by {rule.format()}"
        rule, _ = verdict(self.ask.net, name, address, port)
        if rule is not None:
            return ASK, rule.format()
        rule, why = verdict(held, name, address, port)
        return (HOLD, rule.format()) if rule is not None else (REFUSE, why)

    # -- a child --------------------------------------------------------------------------------

    def child(self, left: Grants, asked: Grants) -> tuple[str, Grants | None, str]:
        """(DENY/ASK/HOLD/REFUSE, the grants the child gets if it starts, why it is not simply held).

        `left` is what the parent holds now; an asked child gets no more than
        that widened by the ask rules (`ceiling`).
        """
        why = self._denied(asked)
        if why:
            return DENY, None, why
        try:
            held, why = attenuate(left, asked), ""
        except GrantError as exc:
            held, why = None, str(exc)
        touched = self._touched(asked)
        if held is not None and not touched:
            return HOLD, held, ""
        try:
            widened = attenuate(self.ceiling(left), asked)
        except GrantError:
            return (REFUSE, None, why) if held is None else (HOLD, held, "")
        return ASK, widened, why or f"it touches the ask rule {touched}"

    def ceiling(self, left: Grants) -> Grants:
        """What a box could pass on with every ask approved: its grants and budgets, widened by the ask rules."""
        ask = self.ask
        mounts = list(left.mounts) + [m for m in ask.mounts if all(m.dest != held.dest for held in left.mounts)]
        limits = {}
        for name in ("cpus", "mem", "pids", "tmp", "world", "time", "tokens"):
            mine, more = getattr(left, name), getattr(ask, name)
            limits[name] = mine if more is None else more if mine is None else max(mine, more)
        spawn = None if left.spawn is None and ask.spawn is None else (left.spawn or 0) + (ask.spawn or 0)
        depth = max(left.depth or 0, ask.depth or (1 if ask.spawn else 0)) or None
        # Ask rules hold no env or secret (`_parse` refuses them): those stay exactly the parent's.
        return replace(
            left, mounts=tuple(mounts), net=left.net | ask.net, syscalls=left.syscalls | ask.syscalls, rootfs_rw=left.rootfs_rw or ask.rootfs_rw,
            spawn=spawn, depth=depth, **limits,
        )

    def _touched(self, asked: Grants) -> str:
        """The ask rule a child's grants fall under even if its parent holds them (ask over allow), or ""."""
        for net in sorted(asked.net):
            if covers(self.ask.net, net):
                return net.format()
        for mount in asked.mounts:
            for rule in self.ask.mounts:
                if within(mount.source, rule.dest) and (mount.writable or not rule.writable):
                    return _mount_spec(rule)
        for name in sorted(asked.syscalls & self.ask.syscalls):
            return f"syscall:{name}"
        return "rootfs:rw" if asked.rootfs_rw and self.ask.rootfs_rw else ""

    def _denied(self, asked: Grants) -> str:
        for net in sorted(asked.net):
            if covers(self.deny.net, net):
                return f"refused {net.format()}: denied by this run's deny rules ({' '.join(self.deny.format())})"
        for mount in asked.mounts:
            for rule in self.deny.mounts:
                overlap = within(mount.source, rule.dest) or within(rule.dest, mount.source)
                if overlap and (mount.writable or not rule.writable):
                    return f"refused {_mount_spec(mount)}: denied by {_mount_spec(rule)}"
        for name in sorted(asked.syscalls & self.deny.syscalls):
            return f"refused syscall:{name}: denied by syscall:{name}"
        return "refused rootfs:rw: denied by rootfs:rw" if asked.rootfs_rw and self.deny.rootfs_rw else ""


def _mount_spec(mount: Mount) -> str:
    return f"{'rw' if mount.writable else 'ro'}:{mount.source}"


def _parse(kind: str, specs: Iterable[str], cwd: str) -> Grants:
    """Rules in the grant grammar. A mount rule names a host path, so its destination is that path."""
    try:
        rules = Grants.parse(specs, cwd=cwd, keeping_out=kind == "deny")
    except GrantError as exc:
        raise GrantError(f"bad --{kind} rule: {exc}", kind=exc.kind, option=f"--{kind}", **exc.fields) from None
    if any(m.dest != m.source for m in rules.mounts):
        raise GrantError(f"bad --{kind} rule: a mount rule names a host path only (rw:PATH), not PATH=DEST", option=f"--{kind}")
    if rules.env or rules.secrets:
        raise GrantError(f"bad --{kind} rule: env and secret grants are given with -g, not {kind}ed", option=f"--{kind}")
    return rules
