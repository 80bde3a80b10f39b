"""Which registry a name points at, and when it is spoken to over plain HTTP: as the engine decides both."""

import pytest

from quinebox.box.images.registry import REF, copy_argv, on_loopback, registry_of


@pytest.mark.parametrize(
    "name, registry",
    [
        ("busybox", "docker.io"),
        ("busybox:1.36", "docker.io"),
        ("library/busybox", "docker.io"),
        ("me/tool:1", "docker.io"),
        ("ghcr.io/me/tool:1", "ghcr.io"),
        ("localhost/tool", "localhost"),
        ("localhost:5000/tool:1", "localhost:5000"),
        ("127.0.0.1:5000/test/static:1", "127.0.0.1:5000"),
        ("[::1]:5000/tool", "[::1]:5000"),
        ("registry.example:443/a/b/c@sha256:" + "0" * 64, "registry.example:443"),
        ("me:5000", "docker.io"),  # a tag, not a port: no slash, no registry
    ],
)
def test_the_registry_of_a_name(name, registry):
    assert registry_of(name) == registry


@pytest.mark.parametrize(
    "registry, loopback",
    [
        ("localhost", True), ("localhost:5000", True), ("127.0.0.1:5000", True), ("127.9.9.9", True), ("[::1]:5000", True), ("[::1]", True),
        ("docker.io", False), ("10.0.0.1:5000", False), ("192.0.2.1", False), ("localhost.example:5000", False), ("[2001:db8::1]:5000", False),
        ("127.0.0.1.example", False),
    ],
)
def test_only_this_machines_loopback_is_spoken_to_over_plain_http(registry, loopback):
    assert on_loopback(registry) is loopback


def test_the_copy_verifies_tls_except_on_loopback():
    remote = copy_argv("/usr/bin/skopeo", "ghcr.io/me/tool:1", "/s/images/.making-x")
    assert remote == ["/usr/bin/skopeo", "copy", "--quiet", "--retry-times", "2", "docker://ghcr.io/me/tool:1", f"oci:/s/images/.making-x:{REF}"]
    local = copy_argv("/usr/bin/skopeo", "127.0.0.1:5000/t:1", "/l")
    assert "--src-tls-verify=false" in local and local[-2:] == ["docker://127.0.0.1:5000/t:1", f"oci:/l:{REF}"]
