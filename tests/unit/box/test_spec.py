"""Turning a request into a checked BoxSpec: policies, presets, and what is refused."""

import os

import pytest

from quinebox.box.spec import AGENT_UID, build_spec, load_policy, protected_paths
from quinebox.errors import GrantError
from quinebox.grants import Grants


@pytest.mark.parametrize(
    "text, grants",
    [
        ("grants: [mem:1g, ro:/data]", ["mem:1g", "ro:/data"]),
        ("description: d\ngrants:\n  - net\n", ["net"]),
        ("", []),
        ("grants: []", []),
    ],
)
def test_policy_files(tmp_path, text, grants):
    (tmp_path / "p.yaml").write_text(text)
    assert load_policy(str(tmp_path / "p.yaml")) == grants


@pytest.mark.parametrize(
    "text, words",
    [
        ("grants: mem:1g", "list of grant strings"),
        ("grants: [1, 2]", "list of grant strings"),
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
    assert "mem:256m" in load_policy("strict")
    assert "rw:." in load_policy("dev")
    assert load_policy("pypi") == ["net:pypi.org", "net:files.pythonhosted.org"]
    assert "net:*.githubusercontent.com" in load_policy("github")
    assert len(Grants.parse(load_policy("github")).net) == 4
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
