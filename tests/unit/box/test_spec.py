"""Turning a request into a checked BoxSpec: policies, presets, and what is refused."""

import os

import pytest

from quinebox.box.spec import AGENT_UID, build_spec, load_policy, protected_paths
from quinebox.errors import GrantError
from quinebox.grants import Grants


@pytest.mark.parametrize(
    "text, grants, ask, deny",
    [
        ("grants: [mem:1g, ro:/data]", ["mem:1g", "ro:/data"], [], []),
        ("description: d\ngrants:\n  - net\n", ["net"], [], []),
        ("", [], [], []),
        ("grants: []", [], [], []),
        ("ask: ['net:*', spawn:4]\ndeny: [net:evil.example]", [], ["net:*", "spawn:4"], ["net:evil.example"]),
    ],
)
def test_policy_files(tmp_path, text, grants, ask, deny):
    (tmp_path / "p.yaml").write_text(text)
    assert load_policy(str(tmp_path / "p.yaml")) == {"grants": grants, "ask": ask, "deny": deny}


def test_ask_and_deny_rules_from_a_policy_and_flags_reach_the_spec(tmp_path):
    (tmp_path / "p.yaml").write_text("grants: [mem:1g]\nask: [spawn:2]\ndeny: [net:evil.example]")
    spec = build_spec(["true"], policy=str(tmp_path / "p.yaml"), ask=["net:*.example.com"], ask_timeout="0", cwd=str(tmp_path))
    assert spec.asks.ask.format() == ["net:*.example.com", "spawn:2"]
    assert spec.asks.deny.format() == ["net:evil.example"]
    assert (spec.asks.timeout, spec.asks.project) == (0.0, str(tmp_path))
    assert spec.egress_socket is not None  # a box that may be asked about the network reaches the proxy


@pytest.mark.parametrize(
    "options, words",
    [
        ({"ask": ["bogus:1"]}, "bad --ask rule: unknown grant"),
        ({"deny": ["rw:/tmp=/x"]}, "bad --deny rule: a mount rule names a host path only"),
        ({"ask": ["env:HOME"]}, "env and secret grants are given with -g"),
        ({"ask_timeout": "soon"}, "bad duration 'soon'"),
        ({"ask": ["rw:/etc"]}, "cannot grant rw:/etc"),
    ],
)
def test_bad_ask_rules_are_refused_before_anything_starts(tmp_path, options, words):
    with pytest.raises(GrantError, match=words):
        build_spec(["true"], cwd=str(tmp_path), **options)


@pytest.mark.parametrize(
    "text, words",
    [
        ("grants: mem:1g", "lists of grant strings"),
        ("grants: [1, 2]", "lists of grant strings"),
        ("ask: net", "lists of grant strings"),
        ("- mem:1g", "expected a mapping"),
        ("grants: []\nimage: x", "expected a mapping"),
        ("grants: [\n", "cannot read policy"),
    ],
)
def test_bad_policy_files(tmp_path, text, words):
    (tmp_path / "p.yaml").write_text(text)
    with pytest.raises(GrantError, match=words):
        load_policy(str(tmp_path / "p.yaml"))


def test_presets_by_name():
    assert "mem:256m" in load_policy("strict")["grants"]
    assert "rw:." in load_policy("dev")["grants"]
    assert load_policy("pypi")["grants"] == ["net:pypi.org", "net:files.pythonhosted.org"]
    assert "net:*.githubusercontent.com" in load_policy("github")["grants"]
    assert len(Grants.parse(load_policy("github")["grants"]).net) == 4
    with pytest.raises(GrantError, match=r"preset \(dev, github, pypi, strict\)"):
        load_policy("lenient")


def test_flags_override_the_policy_and_timeout_is_a_time_grant(tmp_path):
    (tmp_path / "p.yaml").write_text("grants: [mem:1g, pids:10]")
    spec = build_spec(["true"], grants=["mem:64m"], policy=str(tmp_path / "p.yaml"), timeout="5m", cwd=str(tmp_path))
    assert (spec.grants.mem, spec.grants.pids, spec.grants.time) == (64 << 20, 10, 300.0)


def test_a_box_is_never_root_and_each_gets_its_own_session_and_socket():
    a, b = build_spec(["true"]), build_spec(["true"])
    assert a.session != b.session and a.lifeline != b.lifeline
    assert a.lifeline.endswith(f"/run/{a.session}.sock")
    assert a.uid != 0 and a.gid != 0
    if os.getuid() == 0:
        assert (a.uid, a.gid) == (AGENT_UID, AGENT_UID)


@pytest.mark.parametrize(
    "argv, kw, words",
    [
        ([], {}, "nothing to run"),
        (["true"], {"workdir": "relative"}, "absolute path"),
        (["true"], {"timeout": "soon"}, "bad duration"),
        (["true"], {"grants": ["ro:/etc"]}, "never granted"),
    ],
)
def test_refusals(argv, kw, words):
    with pytest.raises(GrantError, match=words):
        build_spec(argv, **kw)


def test_a_unix_docker_host_is_protected_too(tmp_path):
    paths = protected_paths({"DOCKER_HOST": "unix:///srv/engine.sock"}, tmp_path)
    assert "/srv/engine.sock" in paths and str(tmp_path) in paths and "/var/run/docker.sock" in paths


@pytest.mark.parametrize(
    ("grants", "ask", "tls", "egress"),
    [
        ([], [], False, False),
        (["net:api.example.com"], [], False, True),
        (["secret:QB_TEST_SECRET@api.example.com", "net:api.example.com"], [], True, True),
        (["secret:QB_TEST_SECRET@api.example.com"], ["net:api.example.com"], True, True),  # a person may open the way
        # no way out: the proxy that writes the trust never starts, so nothing is mounted (it failed to start, 125)
        (["secret:QB_TEST_SECRET@api.example.com"], [], False, False),
        (["secret:QB_TEST_SECRET@api.example.com", "net:bridge"], [], False, True),
    ],
)
def test_a_box_gets_its_trust_only_where_its_secrets_have_a_way_out(monkeypatch, grants, ask, tls, egress):
    monkeypatch.setenv("QB_TEST_SECRET", "value-of-the-secret")
    spec = build_spec(["true"], grants=grants, ask=ask, ask_timeout="0")
    assert (spec.tls_dir is not None, spec.egress_socket is not None) == (tls, egress)
