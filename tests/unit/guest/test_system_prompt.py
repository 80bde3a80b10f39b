"""What the agent is told about its network and about what a person may approve."""

import pytest

from quinebox.guest.prompt import network


@pytest.mark.parametrize(
    "granted, asked, words, absent",
    [
        ("", "", ["no network"], ["person"]),
        ("net:bridge", "net", ["net:bridge"], ["person"]),
        ("net:pypi.org", "", ["only what these grants allow: net:pypi.org"], ["person", "host-loopback"]),
        ("", "net:*.example.com spawn:2", ["no network", "A person may approve", "net:*.example.com spawn:2", "403", "exit 125"], []),
        ("net:pypi.org", "rw:/src", ["net:pypi.org", "A person may approve", "rw:/src"], []),
        ("net:host-loopback:8080 net:host-loopback:5432", "", ["reached as host-loopback:PORT, for port 8080, 5432; localhost is this box"], ["person"]),
    ],
)
def test_network_and_asks(granted, asked, words, absent):
    said = network(granted, asked)
    assert all(word in said for word in words), said
    assert not any(word in said for word in absent), said
