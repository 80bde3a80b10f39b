"""Network grants as rules: which destinations a box may reach through the host's egress proxy. Pure.

    net                  any public destination, any port
    net:HOST[:PORT]      that name (ports 80 and 443 when none is given; `:*` for any)
    net:*.SUFFIX[:PORT]  any name below SUFFIX (not SUFFIX itself)
    net:CIDR[:PORT]      addresses: the only way to reach private, link-local (the metadata
                         address too) or other special ranges; a bare IPv4 address is a
                         /32, an IPv6 one is written [ADDR]
    net:host-loopback:PORT  one port on the host's own loopback, reached by the name
                         `host-loopback` alone (it is never resolved)
    net:bridge           the engine's bridge network: raw access, the host included

A box's network stays `none` unless it holds `net:bridge`: everything else is
decided by the host per connection (`verdict`), at the address it will connect
to. A special address is reached only when a CIDR rule names it, whatever name
led to it, so a name that resolves to 127.0.0.1 or 169.254.169.254 is refused.
`unreachable` says which rules no connection could ever use (a name for
loopback, a CIDR over the host's loopback, a multicast range, ...): grants
refuse those when parsed, so a user hears why at once instead of a box failing
later in a way that looks like a network fault.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from quinebox.errors import GrantError

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
#: A name grant without a port allows these.
WEB_PORTS = (80, 443)
_LABEL = r"(?!-)[a-z0-9-]{1,63}(?<!-)"
_NAME_RE = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
#: The one name by which a box reaches the host's loopback, and only at a port granted as net:host-loopback:PORT.
HOST_LOOPBACK = "host-loopback"
LOOPBACK_ADDRESSES: tuple[Address, ...] = (ipaddress.IPv4Address("127.0.0.1"), ipaddress.IPv6Address("::1"))
#: Names that mean the box's own loopback inside the box (it sends them past the proxy), so no grant of them can work.
_LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")
#: Where a connection reaches the host itself: loopback, and the unspecified addresses Linux connects to as loopback.
_HOST_ITSELF = tuple(ipaddress.ip_network(n) for n in ("127.0.0.0/8", "0.0.0.0/8", "::1/128", "::/128"))
#: IPv6 spellings of IPv4 addresses: connections are checked at the IPv4 address (`canonical`), so an IPv6 rule here never matches.
_IPV4_IN_IPV6 = tuple(ipaddress.ip_network(n) for n in ("::ffff:0:0/96", "2002::/16", "2001::/32", "64:ff9b::/96"))
#: Ranges no TCP connection can go to from the host's proxy: multicast, broadcast, and IPv6 link-local (it needs an interface).
_NO_TCP = tuple(ipaddress.ip_network(n) for n in ("224.0.0.0/4", "255.255.255.255/32", "ff00::/8", "fe80::/10"))


@dataclass(frozen=True, order=True)
class NetRule:
    """One `net` grant. `ports` None means any port."""

    kind: str  # "bridge", "public", "host", "suffix", "cidr" or "loopback" (net:host-loopback:PORT)
    value: str = ""  # a lower-case name; a suffix without its "*."; a network in CIDR form
    ports: tuple[int, ...] | None = None

    def format(self) -> str:
        if self.kind == "bridge":
            return "net:bridge"
        if self.kind == "public":
            return "net"
        if self.kind == "loopback":
            return f"net:{HOST_LOOPBACK}:{self.ports[0] if self.ports else '*'}"
        value = f"*.{self.value}" if self.kind == "suffix" else self.value
        if self.kind == "cidr":
            network = ipaddress.ip_network(self.value)
            if network.num_addresses == 1:
                value = str(network.network_address) if network.version == 4 else f"[{network.network_address}]"
        if self.ports is None:
            return f"net:{value}" + (":*" if self.kind != "cidr" else "")
        if self.kind != "cidr" and self.ports == WEB_PORTS:
            return f"net:{value}"
        return f"net:{value}:{self.ports[0]}"

    def allows_port(self, port: int) -> bool:
        return self.ports is None or port in self.ports

    def names(self, name: str) -> bool:
        """Whether this rule grants `name` (a name rule; addresses are `holds`)."""
        if self.kind == "public":
            return True
        if self.kind == "host":
            return name == self.value
        return self.kind == "suffix" and name.endswith("." + self.value)

    def holds(self, address: Address) -> bool:
        return self.kind == "cidr" and address in ipaddress.ip_network(self.value)


def parse_rule(spec: str, value: str | None) -> NetRule:
    """`value` is what follows `net:` (None for a bare `net`)."""
    if value is None or value == "*":
        return NetRule("public")
    if value == "bridge":
        return NetRule("bridge")
    where, ports = _split_port(spec, value)
    if where.lower().rstrip(".") == HOST_LOOPBACK:
        if not ports:
            raise GrantError(f"bad grant {spec!r}: name the one port of the host's loopback the box may reach, as net:{HOST_LOOPBACK}:8080", grant=spec)
        return NetRule("loopback", HOST_LOOPBACK, ports)
    if where.startswith("[") and where.endswith("]") or "/" in where or _is_ipv4(where):
        text = where[1:-1] if where.startswith("[") else where
        try:
            network = ipaddress.ip_network(text, strict=True)
        except ValueError as exc:
            raise GrantError(f"bad grant {spec!r}: {exc} (give a network as 10.0.0.0/8, an address as 10.1.2.3 or [fd00::1])", grant=spec) from None
        return NetRule("cidr", str(network), None if ports == () else ports)
    name = where.lower().rstrip(".")
    kind = "host"
    if name.startswith("*."):
        kind, name = "suffix", name[2:]
    if len(name) > 253 or not _NAME_RE.match(name) or (kind == "suffix" and "." not in name):
        raise GrantError(f"bad grant {spec!r}: {where!r} is not a host name (net:example.com, net:*.example.com, net:10.0.0.0/8, net:bridge)", grant=spec)
    return NetRule(kind, name, WEB_PORTS if ports == () else ports)


def unreachable(rule: NetRule) -> str:
    """Why no connection could ever use `rule` as a grant, and what to grant instead; "" when some could.

    Deny rules may name all of these (they keep things out); grants and ask rules may not.
    """
    instead = f"for one service on the host's loopback grant net:{HOST_LOOPBACK}:PORT and connect to {HOST_LOOPBACK}:PORT"
    if rule.kind in ("host", "suffix") and (rule.value in _LOOPBACK_NAMES or rule.value == "localhost" or rule.value.endswith(".localhost")):
        port = f"{rule.ports[0]}" if rule.ports and len(rule.ports) == 1 else "PORT"
        return (f"{rule.value} is the box's own loopback inside the box, never the host's; "
                f"for a service on the host's loopback grant net:{HOST_LOOPBACK}:{port} and connect to {HOST_LOOPBACK}:{port}")
    if rule.kind != "cidr":
        return ""
    network = ipaddress.ip_network(rule.value)
    if any(network.version == n.version and network.overlaps(n) for n in _HOST_ITSELF):
        wide = "" if network.num_addresses == 1 else " (grant net for any public destination, and net:CIDR for the private networks you need)"
        return f"{network} reaches the host's own loopback, which no address grant may; {instead}{wide}"
    if any(network.version == n.version and network.subnet_of(n) for n in _IPV4_IN_IPV6):  # type: ignore[arg-type]  # the versions match, which mypy cannot see
        return f"{network} spells IPv4 addresses as IPv6, and connections are checked at their IPv4 address: grant the IPv4 network instead"
    if any(network.version == n.version and network.subnet_of(n) for n in _NO_TCP):  # type: ignore[arg-type]  # the versions match, which mypy cannot see
        return f"{network} is multicast, broadcast or IPv6 link-local: no connection through the host's proxy can go there"
    return ""


def is_host_name(text: str) -> bool:
    return len(text) <= 253 and bool(_NAME_RE.match(text))


def _split_port(spec: str, value: str) -> tuple[str, tuple[int, ...] | None]:
    """(where, ports): ports () when none was given, None for `*`."""
    if value.startswith("["):
        where, _, rest = value.partition("]")
        where += "]"
        if rest and not rest.startswith(":"):
            raise GrantError(f"bad grant {spec!r}: expected [IPv6]:PORT", grant=spec)
        port = rest[1:] if rest else ""
    elif "/" in value:
        where, _, prefix_port = value.partition("/")
        prefix, _, port = prefix_port.partition(":")
        where = f"{where}/{prefix}"
    else:
        where, _, port = value.rpartition(":") if ":" in value else (value, "", "")
    if not port:
        return where, ()
    if port == "*":
        return where, None
    if not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise GrantError(f"bad grant {spec!r}: {port!r} is not a port (1-65535, or * for any)", grant=spec)
    return where, (int(port),)


def _is_ipv4(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
        return True
    except ValueError:
        return False


def canonical(address: Address) -> Address:
    """The IPv4 address behind an IPv6 spelling of one (mapped, 6to4, Teredo, NAT64), else `address`."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped:
            return address.ipv4_mapped
        if address.sixtofour:
            return address.sixtofour
        if address.teredo:
            return address.teredo[1]
        if address in _NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def special(address: Address) -> bool:
    """Private, loopback, link-local, multicast, reserved, shared or unspecified: anything not plainly public."""
    address = canonical(address)
    return not address.is_global or address.is_multicast


def verdict(rules: frozenset[NetRule], name: str | None, address: Address, port: int) -> tuple[NetRule | None, str]:
    """(the rule that allows connecting to `address`:`port`, reached by `name` or as a literal; or None, and why not)."""
    address = canonical(address)
    for rule in sorted(rules):
        if rule.holds(address) and rule.allows_port(port):
            return rule, ""
    if name == HOST_LOOPBACK and address in LOOPBACK_ADDRESSES:
        for rule in sorted(rules):
            if rule.kind == "loopback" and rule.allows_port(port):
                return rule, ""
        return None, f"grant net:{HOST_LOOPBACK}:{port}"
    if address.is_loopback or address.is_unspecified:
        return None, (f"{address} is the host's loopback, which no name or address reaches; "
                      f"for port {port} there grant net:{HOST_LOOPBACK}:{port} and connect to {HOST_LOOPBACK}:{port}")
    if special(address):
        return None, f"{address} is a private or special address; only a net:CIDR grant reaches it (grant {suggest(None, address, port)})"
    for rule in sorted(rules):
        if rule.allows_port(port) and (rule.kind == "public" or (name is not None and rule.names(name))):
            return rule, ""
    return None, f"grant {suggest(name, address, port)}"


def suggest(name: str | None, address: Address, port: int) -> str:
    """The narrowest grant that would allow this connection."""
    if name is None or special(address):
        rule = NetRule("cidr", str(ipaddress.ip_network(canonical(address))), (port,))
    else:
        rule = NetRule("host", name, WEB_PORTS if port in WEB_PORTS else (port,))
    return rule.format()


def covers(held: frozenset[NetRule], asked: NetRule) -> bool:
    """Whether a box holding `held` may pass `asked` on to a child: never anything wider."""
    if asked.kind == "loopback":  # one port of the host's loopback: only a parent holding that very port passes it on
        return any(rule.kind == "loopback" and rule.ports == asked.ports for rule in held)
    for rule in held:
        if rule.kind == "bridge":
            return True  # a box on the bridge reaches all of it already
        ports_ok = rule.ports is None or (asked.ports is not None and set(asked.ports) <= set(rule.ports))
        if not ports_ok or asked.kind == "bridge":
            continue
        if rule.kind == "public" and asked.kind in ("public", "host", "suffix"):
            return True
        if rule.kind == "host" and asked.kind == "host" and asked.value == rule.value:
            return True
        if rule.kind == "suffix" and asked.kind in ("host", "suffix") and asked.value.endswith("." + rule.value):
            return True
        if rule.kind == "suffix" and asked.kind == "suffix" and asked.value == rule.value:
            return True
        if rule.kind == "cidr" and asked.kind == "cidr":
            mine, theirs = ipaddress.ip_network(rule.value), ipaddress.ip_network(asked.value)
            if mine.version == theirs.version and theirs.subnet_of(mine):  # type: ignore[arg-type]  # the versions match, which mypy cannot see
                return True
    return False
