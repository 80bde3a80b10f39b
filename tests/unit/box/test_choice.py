"""Which backend a box gets, and why: choice.choose and spec.required_backend as tables (the probe injected)."""

import pytest

from quinebox.box.backends.choice import Choice, choose, requested
from quinebox.box.spec import required_backend
from quinebox.errors import GrantError, QuineboxError

BRIDGE = "net:bridge needs the engine's bridge network"


@pytest.fixture(autouse=True)
def no_settings(monkeypatch, tmp_path):
    for name in ("QUINEBOX_BACKEND", "QUINEBOX_RUNTIME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def fine(_name: str) -> None:
    return None


def refuses(name: str) -> str:
    return f"{name} refuses this machine"


@pytest.mark.parametrize(
    "refusal, backend, runtime, probe, chosen",
    [
        (None, None, None, fine, Choice("oci", "runc", "boxes run on the OCI runtime runc")),
        (None, "auto", "runsc", fine, Choice("oci", "runsc", "boxes run on the OCI runtime runsc")),
        (None, None, None, refuses, Choice("docker", None, "boxes run on the Docker engine: runc refuses this machine")),
        (None, "docker", "runsc", refuses, Choice("docker", None, "the Docker backend was asked for")),
        (None, "oci", None, refuses, Choice("oci", "runc", "the OCI backend was asked for (runc)")),  # asked outright: no probe
        (BRIDGE, None, None, fine, Choice("docker", None, f"this box runs on the Docker engine: {BRIDGE}")),
        (BRIDGE, "oci", None, fine, Choice("docker", None, f"this box runs on the Docker engine: {BRIDGE}")),
        (BRIDGE, None, "runc", fine, Choice("docker", None, f"this box runs on the Docker engine: {BRIDGE}")),  # the engine runs runc too
    ],
)
def test_choose(refusal, backend, runtime, probe, chosen):
    assert choose(refusal, backend=backend, runtime=runtime, probe=probe) == chosen


@pytest.mark.parametrize(
    "refusal, runtime, probe, message",
    [
        (BRIDGE, "runsc", fine, f"the OCI runtime runsc cannot run this box: {BRIDGE}; drop the runtime, or the grant"),
        (None, "crun", refuses, "OCI runtime crun cannot run boxes here: crun refuses this machine"),
    ],
)
def test_a_runtime_named_outright_is_never_swapped_for_the_engine(refusal, runtime, probe, message):
    with pytest.raises(QuineboxError) as caught:
        choose(refusal, runtime=runtime, probe=probe)
    assert str(caught.value) == message


def test_arguments_win_over_the_environment_which_wins_over_config_yaml(monkeypatch, tmp_path):
    config = tmp_path / "config" / "quinebox"
    config.mkdir(parents=True)
    (config / "config.yaml").write_text("backend: docker\nruntime: crun\n")
    assert requested() == ("docker", "crun")
    monkeypatch.setenv("QUINEBOX_BACKEND", "oci")
    monkeypatch.setenv("QUINEBOX_RUNTIME", "runsc")
    assert requested() == ("oci", "runsc")
    assert requested("auto", "/opt/rt") == ("auto", "/opt/rt")


def test_a_bad_backend_is_one_line_naming_the_choices(monkeypatch):
    monkeypatch.setenv("QUINEBOX_BACKEND", "podman")
    with pytest.raises(GrantError, match=r"^bad backend 'podman': use one of auto, oci, docker \(--backend"):
        requested()


@pytest.mark.parametrize(
    "policy, backend, runtime, result",
    [
        ({}, None, None, (None, None)),
        ({}, "docker", None, ("docker", None)),
        ({"runtime": "runsc"}, None, None, ("oci", "runsc")),
        ({"runtime": "runsc"}, "oci", "runsc", ("oci", "runsc")),
        ({"backend": "oci"}, None, "runc", ("oci", "runc")),
        ({"backend": "docker"}, None, None, ("docker", None)),
    ],
)
def test_what_a_policy_requires(policy, backend, runtime, result):
    assert required_backend(policy, backend, runtime) == result


@pytest.mark.parametrize(
    "policy, backend, runtime, message",
    [
        ({"runtime": "runsc"}, None, "runc", "the policy requires runtime runsc, and runc was asked for"),
        ({"backend": "oci"}, "docker", None, "the policy requires backend oci, and docker was asked for"),
        ({"runtime": "runsc"}, "docker", None, "the policy requires the OCI runtime runsc, which the Docker backend does not use"),
        ({"runtime": "runsc", "backend": "docker"}, None, None, "the policy requires the OCI runtime runsc, which the Docker backend does not use"),
        ({}, "podman", None, "bad backend 'podman'"),
    ],
)
def test_asking_for_other_than_a_policy_requires_is_refused(policy, backend, runtime, message):
    with pytest.raises(GrantError, match=message):
        required_backend(policy, backend, runtime)


def test_a_policy_file_says_which_runtime_its_boxes_need(tmp_path):
    from quinebox.box.spec import build_spec

    policy = tmp_path / "gvisor.yaml"
    policy.write_text("description: untrusted code on gVisor\nruntime: runsc\ngrants: [mem:256m]\n")
    spec = build_spec(["true"], policy=str(policy), cwd=str(tmp_path))
    assert (spec.backend, spec.runtime, spec.grants.mem) == ("oci", "runsc", 256 << 20)
    policy.write_text("runtime: [runsc]\n")
    with pytest.raises(GrantError, match="'runtime:' must name one, as in 'runtime: runsc'"):
        build_spec(["true"], policy=str(policy), cwd=str(tmp_path))
