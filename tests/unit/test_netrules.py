"""Network grants: parsing, what each allows at connect time, special addresses in every spelling, attenuation."""

import ipaddress

import pytest

from quinebox.errors import GrantError
from quinebox.netrules import NetRule, covers, parse_rule, special, verdict

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
    with pytest.raises(GrantError, match="bad grant"):
        try:
            parse_rule(f"net:{value}", value)
        except GrantError as exc:
            assert words in str(exc)
            raise


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
