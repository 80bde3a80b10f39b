"""Ask and deny rules, as tables: what a connection or a child comes to. Deny wins over ask, ask over allow."""

import ipaddress

import pytest

from quinebox.audit.asks import ASK, DEFAULT_ASK_TIMEOUT, DENY, HOLD, REFUSE, Asks
from quinebox.errors import ErrorKind, GrantError
from quinebox.grants import Grants

PUBLIC = ipaddress.ip_address("93.184.216.34")
PRIVATE = ipaddress.ip_address("10.1.2.3")


def rules(ask=(), deny=(), held=()):
    return Asks.parse(ask, deny, cwd="/srv/project"), Grants.parse(held).net


@pytest.mark.parametrize(
    "ask, deny, held, name, address, port, outcome, said",
    [
        # nothing asked: exactly the grants
        ((), (), ["net:example.com"], "example.com", PUBLIC, 443, HOLD, "net:example.com"),
        ((), (), [], "example.com", PUBLIC, 443, REFUSE, "grant net:example.com"),
        # asked: not held, a person decides
        (["net:*"], (), [], "example.com", PUBLIC, 443, ASK, "net"),
        (["net:*.example.com"], (), [], "api.example.com", PUBLIC, 443, ASK, "net:*.example.com"),
        (["net:*.example.com"], (), [], "example.org", PUBLIC, 443, REFUSE, "grant net:example.org"),
        (["net:*.example.com"], (), [], "api.example.com", PUBLIC, 22, REFUSE, "grant net:api.example.com:22"),
        # a public ask never reaches a private address; a CIDR ask does
        (["net:*"], (), [], "intranet", PRIVATE, 80, REFUSE, "private or special address"),
        (["net:10.0.0.0/8"], (), [], "intranet", PRIVATE, 80, ASK, "net:10.0.0.0/8"),
        # ask over allow: held, and still asked
        (["net:*.example.com"], (), ["net"], "api.example.com", PUBLIC, 443, ASK, "net:*.example.com"),
        (["net:*.example.com"], (), ["net"], "example.org", PUBLIC, 443, HOLD, "net"),
        # deny over everything
        (["net:*"], ["net:evil.example"], ["net"], "evil.example", PUBLIC, 443, DENY, "denied by net:evil.example"),
        ((), ["net:93.184.216.0/24"], ["net:example.com"], "example.com", PUBLIC, 443, DENY, "denied by net:93.184.216.0/24"),
        ((), ["net:evil.example"], ["net"], "good.example", PUBLIC, 443, HOLD, "net"),
    ],
)
def test_egress_outcomes(ask, deny, held, name, address, port, outcome, said):
    asks, held_rules = rules(ask, deny, held)
    got, text = asks.egress(held_rules, name, address, port)
    assert got == outcome
    assert said in text


LEFT = Grants(spawn=2, depth=2, mem=1 << 30, pids=256, tmp=256 << 20).merge(Grants.parse(["ro:/srv/project=/src", "net:example.com"]))
#: LEFT, its root writable; LEFT, holding one more system call.
WRITABLE = LEFT.merge(Grants(rootfs_rw=True))
TRACING = LEFT.merge(Grants(syscalls=frozenset({"ptrace"})))


@pytest.mark.parametrize(
    "ask, deny, left, child, outcome, said",
    [
        # within what the parent holds: no one is asked
        ((), (), LEFT, ["ro:/src"], HOLD, ""),
        # wider, nothing asked: refused at once, with attenuation's reason
        ((), (), LEFT, ["rw:/src"], REFUSE, "read-only here"),
        # wider, and an ask covers it: a person decides
        (["rw:/srv/project"], (), LEFT, ["rw:/srv/project"], ASK, "not within anything"),
        (["net:*"], (), LEFT, ["net:api.github.com"], ASK, "wider than this box's network grants"),
        (["mem:4g"], (), LEFT, ["mem:2g"], ASK, "more than this box's mem:1g"),
        (["mem:4g"], (), LEFT, ["mem:8g"], REFUSE, "more than this box's mem:1g"),
        # spawning with no spawn budget: asked when spawn is asked (it brings a depth of one)
        (["spawn:1"], (), Grants(mem=1 << 30), [], ASK, "may not start boxes"),
        (["spawn:1"], (), Grants(mem=1 << 30), ["spawn:1"], REFUSE, "may not start boxes"),
        ((), (), Grants(mem=1 << 30), [], REFUSE, "may not start boxes"),
        # ask over allow: held, but it falls under an ask rule
        (["net:*"], (), LEFT, ["net:example.com"], ASK, "touches the ask rule net:example.com"),
        (["ro:/srv/project"], (), LEFT, ["ro:/srv/project"], ASK, ""),
        # deny over everything
        (["net:*"], ["net:*.github.com"], LEFT, ["net:api.github.com"], DENY, "denied"),
        (["rw:/srv/project"], ["rw:/srv/project/secrets"], LEFT, ["rw:/srv/project"], DENY, "denied by rw:/srv/project/secrets"),
        ((), ["rw:/srv/project"], LEFT, ["ro:/src"], HOLD, ""),  # a read-write deny leaves reading alone
        ((), ["ro:/srv/project"], LEFT, ["ro:/srv/project"], DENY, "denied by ro:/srv/project"),
        # a writable root, as every other grant: held, asked, denied (deny wins even over what the parent holds)
        ((), (), WRITABLE, ["rootfs:rw"], HOLD, ""),
        ((), (), LEFT, ["rootfs:rw"], REFUSE, "own root is read-only"),
        (["rootfs:rw"], (), LEFT, ["rootfs:rw"], ASK, "own root is read-only"),
        (["rootfs:rw"], (), WRITABLE, ["rootfs:rw"], ASK, "touches the ask rule rootfs:rw"),
        (["rootfs:rw"], (), WRITABLE, ["ro:/src"], HOLD, ""),
        ((), ["rootfs:rw"], WRITABLE, ["rootfs:rw"], DENY, "refused rootfs:rw: denied by rootfs:rw"),
        (["rootfs:rw"], ["rootfs:rw"], LEFT, ["rootfs:rw"], DENY, "refused rootfs:rw: denied by rootfs:rw"),
        ((), ["rootfs:rw"], WRITABLE, ["ro:/src"], HOLD, ""),
        # a system call, the same
        ((), (), TRACING, ["syscall:ptrace"], HOLD, ""),
        (["syscall:ptrace"], (), LEFT, ["syscall:ptrace"], ASK, "may not make that call either"),
        (["syscall:ptrace"], (), TRACING, ["syscall:ptrace"], ASK, "touches the ask rule syscall:ptrace"),
        ((), ["syscall:ptrace"], TRACING, ["syscall:ptrace"], DENY, "refused syscall:ptrace: denied by syscall:ptrace"),
        ((), ["syscall:personality"], TRACING, ["syscall:ptrace"], HOLD, ""),
    ],
)
def test_child_outcomes(tmp_path, ask, deny, left, child, outcome, said):
    asks = Asks.parse(ask, deny, cwd=str(tmp_path))
    got, grants, why = asks.child(left, Grants.parse(child, cwd="/"))
    assert got == outcome, why
    assert said in why
    assert (grants is not None) == (outcome in (HOLD, ASK))


def test_an_approved_child_gets_no_more_than_the_ask_allows():
    asks = Asks.parse(["rw:/srv/project", "spawn:3"], (), cwd="/")
    outcome, grants, _ = asks.child(LEFT, Grants.parse(["rw:/srv/project", "spawn:1"], cwd="/"))
    assert outcome == ASK
    assert grants.format()[:1] == ["rw:/srv/project"]
    assert grants.spawn == 1 and grants.depth == 1  # the parent's depth 2, less one


def test_an_approved_writable_root_is_what_the_child_gets():
    outcome, grants, _ = Asks.parse(["rootfs:rw"], (), cwd="/").child(LEFT, Grants.parse(["rootfs:rw"], cwd="/"))
    assert outcome == ASK and grants is not None and grants.rootfs_rw


@pytest.mark.parametrize(
    "left, ask, spawn, depth",
    [
        (Grants(), Grants(), None, None),
        (Grants(spawn=2, depth=3), Grants(), 2, 3),
        (Grants(), Grants(spawn=4), 4, 1),
        (Grants(spawn=1, depth=1), Grants(spawn=4, depth=2), 5, 2),
    ],
)
def test_the_ceiling_adds_the_asked_budgets(left, ask, spawn, depth):
    ceiling = Asks(ask=ask).ceiling(left)
    assert (ceiling.spawn, ceiling.depth) == (spawn, depth)


@pytest.mark.parametrize(
    "timeout, seconds",
    [(None, DEFAULT_ASK_TIMEOUT), ("0", 0.0), ("0s", 0.0), ("90", 90.0), ("2m", 120.0)],
)
def test_ask_timeouts(timeout, seconds):
    assert Asks.parse((), (), timeout, cwd="/").timeout == seconds


@pytest.mark.parametrize(
    "ask, deny, fields",
    [
        (["net:"], (), {"option": "--ask", "grant": "net:"}),
        ((), ["frob:1"], {"option": "--deny", "grant": "frob:1"}),  # an unknown grant
        (["rw:/a=/b"], (), {"option": "--ask"}),  # a mount rule names a host path only
        (["secret:KEY@api.example.com"], (), {"option": "--ask"}),  # env and secret grants are given with -g
    ],
)
def test_bad_rules(ask, deny, fields):
    with pytest.raises(GrantError) as info:
        Asks.parse(ask, deny, cwd="/")
    assert (info.value.kind, dict(info.value.fields)) == (ErrorKind.BAD_GRANT, fields)


def test_no_rules_is_falsy_and_formats_empty():
    assert not Asks()
    assert Asks.parse(["spawn:2"], (), cwd="/")
    assert Asks.parse(["spawn:2"], ["net:x.example"], cwd="/").format() == {"ask": ["spawn:2"], "deny": ["net:x.example"]}
