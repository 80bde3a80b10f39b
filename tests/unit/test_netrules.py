"""Network grants: parsing, what each allows at connect time, special addresses in every spelling, attenuation."""

import ipaddress

import pytest

from quinebox.errors import ErrorKind, GrantError
from quinebox.netrules import NetRule, covers, parse_rule, special, unreachable, verdict

WEB = (80, 443)


@pytest.mark.parametrize(
    "value, rule, formatted",
    [
        (None, NetRule("public"), "net"),
        ("bridge", NetRule("bridge"), "net:bridge"),
        ("example.com", NetRule("host", "example.com", WEB), "net:example.com"),
        ("Example.COM.", NetRule("host", "example.com", WEB), "net:example.com"),
        ("example.com:8443", NetRule("host", "example.com", (8443,)), "net:example.com:8443"),
        ("example.com:*", NetRule("host", "example.com", None), "net:example.com:*"),
        ("*.github.com", NetRule("suffix", "github.com", WEB), "net:*.github.com"),
        ("*.github.com:22", NetRule("suffix", "github.com", (22,)), "net:*.github.com:22"),
        ("10.0.0.0/8", NetRule("cidr", "10.0.0.0/8", None), "net:10.0.0.0/8"),
        ("10.0.0.0/8:5432", NetRule("cidr", "10.0.0.0/8", (5432,)), "net:10.0.0.0/8:5432"),
        ("10.1.2.3", NetRule("cidr", "10.1.2.3/32", None), "net:10.1.2.3"),
        ("10.1.2.3:80", NetRule("cidr", "10.1.2.3/32", (80,)), "net:10.1.2.3:80"),
        ("fd00::/8", NetRule("cidr", "fd00::/8", None), "net:fd00::/8"),
        ("[fd00::1]:443", NetRule("cidr", "fd00::1/128", (443,)), "net:[fd00::1]:443"),
    ],
)
def test_parse_and_format_round_trip(value, rule, formatted):
    parsed = parse_rule(f"net:{value}" if value else "net", value)
    assert parsed == rule and parsed.format() == formatted
    assert parse_rule(formatted, formatted[4:] or None) == rule


@pytest.mark.parametrize(
    "value, words",
    [
        ("exa mple.com", "is not a host name"),
        ("-bad.com", "is not a host name"),
        ("*.com", "is not a host name"),
        ("example.com:0", "is not a port"),
        ("example.com:70000", "is not a port"),
        ("example.com:http", "is not a port"),
        ("10.0.0.1/8", "has host bits set"),
        ("300.1.1.1/32", "does not appear to be"),
        ("[fd00::1]x", "expected [IPv6]:PORT"),
    ],
)
def test_bad_rules_are_refused_with_what_to_write(value, words):
    with pytest.raises(GrantError) as info:
        parse_rule(f"net:{value}", value)
    assert (info.value.kind, dict(info.value.fields)) == (ErrorKind.BAD_GRANT, {"grant": f"net:{value}"})
    assert words in str(info.value)  # the wording is the point: it says what to write


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1", "10.0.0.5", "172.17.0.1", "192.168.1.1", "169.254.169.254", "100.64.0.1", "0.0.0.0", "224.0.0.1", "255.255.255.255",
     "::1", "fe80::1", "fd00::1", "::ffff:127.0.0.1", "::ffff:169.254.169.254", "2002:a9fe:a9fe::1", "64:ff9b::a9fe:a9fe", "::"],
)
def test_every_spelling_of_a_special_address_is_special(address):
    assert special(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", ["93.184.216.34", "1.1.1.1", "2606:4700:4700::1111", "::ffff:1.1.1.1"])
def test_public_addresses_are_not_special(address):
    assert not special(ipaddress.ip_address(address))


def rules(*values):
    return frozenset(parse_rule(f"net:{v}" if v else "net", v) for v in values)


PUBLIC = "93.184.216.34"


@pytest.mark.parametrize(
    "granted, name, address, port, allowed",
    [
        ((None,), "example.com", PUBLIC, 443, True),
        ((None,), "example.com", PUBLIC, 22, True),
        ((None,), None, PUBLIC, 443, True),  # `net`: a public literal too
        ((None,), "example.com", "127.0.0.1", 443, False),  # a name that resolves to loopback
        ((None,), "metadata", "169.254.169.254", 80, False),
        ((None,), None, "::ffff:169.254.169.254", 80, False),
        (("example.com",), "example.com", PUBLIC, 443, True),
        (("example.com",), "example.com", PUBLIC, 8080, False),  # a port not granted
        (("example.com",), "other.com", PUBLIC, 443, False),
        (("example.com",), None, PUBLIC, 443, False),  # an IP literal needs a CIDR
        (("example.com",), "example.com", "10.0.0.5", 443, False),  # a granted name, a private answer
        (("*.example.com",), "a.example.com", PUBLIC, 443, True),
        (("*.example.com",), "example.com", PUBLIC, 443, False),
        (("*.example.com",), "a.badexample.com", PUBLIC, 443, False),
        (("10.0.0.0/8",), "db.internal", "10.0.0.5", 5432, True),
        (("10.0.0.0/8:5432",), None, "10.0.0.5", 5432, True),
        (("10.0.0.0/8:5432",), None, "10.0.0.5", 22, False),
        (("10.0.0.0/8",), None, "::ffff:10.0.0.5", 80, True),
        (("127.0.0.1",), "localhost", "127.0.0.1", 8000, True),
        (("example.com", "10.0.0.0/8"), "example.com", "10.0.0.5", 443, True),
        ((), "example.com", PUBLIC, 443, False),  # no grant: nothing at all
    ],
)
def test_verdict_decides_at_the_address_connected_to(granted, name, address, port, allowed):
    rule, why = verdict(rules(*granted), name, ipaddress.ip_address(address), port)
    assert (rule is not None) == allowed, why
    assert bool(why) != allowed


@pytest.mark.parametrize(
    "granted, name, address, port, hint",
    [
        (("other.com",), "example.com", PUBLIC, 443, "grant net:example.com"),
        (("other.com",), "example.com", PUBLIC, 8443, "grant net:example.com:8443"),
        (("other.com",), None, PUBLIC, 443, "grant net:93.184.216.34:443"),
        ((None,), "example.com", "169.254.169.254", 80, "only a net:CIDR grant reaches it (grant net:169.254.169.254:80)"),
    ],
)
def test_a_refusal_names_the_grant_that_would_allow_it(granted, name, address, port, hint):
    assert verdict(rules(*granted), name, ipaddress.ip_address(address), port)[1].endswith(hint)


@pytest.mark.parametrize(
    "held, asked, ok",
    [
        ((None,), "example.com", True),
        ((None,), "*.example.com", True),
        ((None,), None, True),
        ((None,), "10.0.0.0/8", False),  # public never covers private ranges
        ((None,), "bridge", False),
        (("bridge",), "bridge", True),
        (("bridge",), "10.0.0.0/8", True),
        (("example.com",), "example.com", True),
        (("example.com",), "example.com:443", True),
        (("example.com:443",), "example.com", False),  # 80 and 443 is wider than 443
        (("example.com",), "example.com:*", False),
        (("example.com",), "other.com", False),
        (("example.com",), None, False),
        (("*.example.com",), "a.example.com", True),
        (("*.example.com",), "*.a.example.com", True),
        (("*.example.com",), "*.example.com", True),
        (("*.example.com",), "example.com", False),
        (("10.0.0.0/8",), "10.1.0.0/16", True),
        (("10.0.0.0/8",), "10.1.2.3", True),
        (("10.0.0.0/8",), "11.0.0.0/8", False),
        (("10.0.0.0/8",), "fd00::/8", False),
        (("10.0.0.0/8:5432",), "10.1.2.3", False),
        ((), "example.com", False),
    ],
)
def test_a_child_gets_no_wider_network_than_its_parent(held, asked, ok):
    [rule] = rules(asked)
    assert covers(rules(*held), rule) == ok


def test_host_loopback_is_one_named_port_and_round_trips():
    rule = parse_rule("net:host-loopback:18089", "host-loopback:18089")
    assert rule == NetRule("loopback", "host-loopback", (18089,)) and rule.format() == "net:host-loopback:18089"
    assert parse_rule("net:HOST-LOOPBACK.:8080", "HOST-LOOPBACK.:8080").format() == "net:host-loopback:8080"
    for value in ("host-loopback", "host-loopback:*"):
        with pytest.raises(GrantError, match=r"name the one port of the host's loopback the box may reach, as net:host-loopback:8080"):
            parse_rule(f"net:{value}", value)


LOCALHOST = "is the box's own loopback inside the box, never the host's; for a service on the host's loopback grant net:host-loopback:{p} and connect to host-loopback:{p}"
HOST_ITSELF = "reaches the host's own loopback, which no address grant may; for one service on the host's loopback grant net:host-loopback:PORT and connect to host-loopback:PORT"
WIDE = " (grant net for any public destination, and net:CIDR for the private networks you need)"
IN_IPV6 = "spells IPv4 addresses as IPv6, and connections are checked at their IPv4 address: grant the IPv4 network instead"
NO_TCP = "is multicast, broadcast or IPv6 link-local: no connection through the host's proxy can go there"


@pytest.mark.parametrize(
    "value, why",
    [
        ("localhost:18089", "localhost " + LOCALHOST.format(p=18089)),
        ("localhost", "localhost " + LOCALHOST.format(p="PORT")),
        ("LocalHost.:*", "localhost " + LOCALHOST.format(p="PORT")),
        ("localhost.localdomain:5432", "localhost.localdomain " + LOCALHOST.format(p=5432)),
        ("ip6-localhost:80", "ip6-localhost " + LOCALHOST.format(p=80)),
        ("ip6-loopback", "ip6-loopback " + LOCALHOST.format(p="PORT")),
        ("app.localhost:3000", "app.localhost " + LOCALHOST.format(p=3000)),
        ("*.app.localhost", "app.localhost " + LOCALHOST.format(p="PORT")),
        ("127.0.0.1", "127.0.0.1/32 " + HOST_ITSELF),
        ("127.0.0.1:18089", "127.0.0.1/32 " + HOST_ITSELF),
        ("127.1.2.3", "127.1.2.3/32 " + HOST_ITSELF),
        ("127.0.0.0/8", "127.0.0.0/8 " + HOST_ITSELF + WIDE),
        ("0.0.0.0", "0.0.0.0/32 " + HOST_ITSELF),  # Linux connects 0.0.0.0 to the host itself
        ("0.0.0.0/0", "0.0.0.0/0 " + HOST_ITSELF + WIDE),
        ("64.0.0.0/2", "64.0.0.0/2 " + HOST_ITSELF + WIDE),  # 64-127: loopback is inside
        ("[::1]", "::1/128 " + HOST_ITSELF),
        ("[::1]:8080", "::1/128 " + HOST_ITSELF),
        ("[::]", "::/128 " + HOST_ITSELF),
        ("::/0", "::/0 " + HOST_ITSELF + WIDE),
        ("[::ffff:127.0.0.1]", "::ffff:7f00:1/128 " + IN_IPV6),
        ("[::ffff:10.0.0.1]:80", "::ffff:a00:1/128 " + IN_IPV6),
        ("::ffff:0:0/96", "::ffff:0:0/96 " + IN_IPV6),
        ("2002:7f00::/24", "2002:7f00::/24 " + IN_IPV6),
        ("64:ff9b::/96", "64:ff9b::/96 " + IN_IPV6),
        ("2001::/32", "2001::/32 " + IN_IPV6),
        ("fe80::/10", "fe80::/10 " + NO_TCP),
        ("[fe80::1]:22", "fe80::1/128 " + NO_TCP),
        ("224.0.0.0/4", "224.0.0.0/4 " + NO_TCP),
        ("239.1.1.1:5000", "239.1.1.1/32 " + NO_TCP),
        ("255.255.255.255", "255.255.255.255/32 " + NO_TCP),
        ("ff02::/16", "ff02::/16 " + NO_TCP),
    ],
)
def test_a_rule_no_connection_could_use_says_why_and_what_to_grant(value, why):
    assert unreachable(parse_rule(f"net:{value}", value)) == why


@pytest.mark.parametrize(
    "value",
    [None, "bridge", "example.com", "*.example.com", "localhost.example.com", "mylocalhost", "host-loopback:18089",
     "10.0.0.0/8", "192.168.1.5:80", "172.16.0.0/12", "169.254.169.254", "100.64.0.0/10", "fd00::/8", "[fd00::1]:443",
     "1.0.0.0/8", "128.0.0.0/1", "8.0.0.0/5", "2000::/3", "fe00::/7", "192.0.0.0/2"],
)
def test_rules_some_connection_could_use_are_kept(value):
    assert unreachable(parse_rule(f"net:{value}" if value else "net", value)) == ""


LOOP = "host-loopback"


@pytest.mark.parametrize(
    "granted, name, address, port, why",
    [
        (("host-loopback:8080",), LOOP, "127.0.0.1", 8080, ""),
        (("host-loopback:8080",), LOOP, "::1", 8080, ""),
        (("host-loopback:8080",), LOOP, "127.0.0.1", 8081, "grant net:host-loopback:8081"),
        (("host-loopback:8080",), "loop.test", "127.0.0.1", 8080, "127.0.0.1 is the host's loopback"),  # never by another name
        (("host-loopback:8080",), None, "127.0.0.1", 8080, "127.0.0.1 is the host's loopback"),  # nor as a literal
        (("host-loopback:8080",), None, "::ffff:127.0.0.1", 8080, "127.0.0.1 is the host's loopback"),
        (("host-loopback:8080",), None, "0.0.0.0", 8080, "0.0.0.0 is the host's loopback"),
        (("host-loopback:8080",), LOOP, "10.0.0.5", 8080, "10.0.0.5 is a private or special address"),  # the name, answered elsewhere
        ((None,), LOOP, "127.0.0.1", 8080, "grant net:host-loopback:8080"),  # `net` is public destinations only
        (("bridge",), LOOP, "127.0.0.1", 8080, "grant net:host-loopback:8080"),
        (("10.0.0.0/8",), "db.test", "127.0.0.1", 5432, "for port 5432 there grant net:host-loopback:5432 and connect to host-loopback:5432"),
    ],
)
def test_the_hosts_loopback_is_reached_only_by_its_name_at_a_granted_port(granted, name, address, port, why):
    rule, said = verdict(rules(*granted), name, ipaddress.ip_address(address), port)
    assert (rule is not None, why in said, bool(said)) == (not why, True, bool(why))


@pytest.mark.parametrize(
    "held, asked, ok",
    [
        (("host-loopback:8080",), "host-loopback:8080", True),
        (("host-loopback:8080",), "host-loopback:8081", False),
        (("host-loopback:8080", "host-loopback:9090"), "host-loopback:9090", True),
        ((None,), "host-loopback:8080", False),
        (("bridge",), "host-loopback:8080", False),  # the bridge reaches the host's bridge address, not its loopback
        (("127.0.0.0/8",), "host-loopback:8080", False),
        (("host-loopback:8080",), "example.com", False),
        (("host-loopback:8080",), "127.0.0.1", False),
    ],
)
def test_a_child_gets_the_hosts_loopback_only_at_a_port_its_parent_holds(held, asked, ok):
    [rule] = rules(asked)
    assert covers(rules(*held), rule) == ok
