"""Which backend a box gets, and why: choice.choose and spec.required_backend as tables (the probe injected)."""

import pytest

from quinebox.box.backends.choice import Choice, choose, requested
from quinebox.box.backends.registry import NAMES
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


def no_bwrap() -> str:
    """bubblewrap's probe, answering not usable: these tables are auto's choice below bwrap (test_choice_bwrap.py has bwrap's)."""
    return "bwrap is not installed (fix: apt-get install bubblewrap)"


#: What auto's why says after its choice when it passed bwrap over (asked by auto, no runtime named).
PASSED = f"; not on bwrap, which is faster but not usable here: {no_bwrap()}"


@pytest.mark.parametrize(
    "refusal, backend, runtime, probe, chosen",
    [
        (None, None, None, fine, Choice("oci", "runc", f"boxes run on the OCI runtime runc{PASSED}")),
        (None, "auto", "runsc", fine, Choice("oci", "runsc", "boxes run on the OCI runtime runsc")),
        (None, None, None, refuses, Choice("docker", None, f"boxes run on the Docker engine: runc refuses this machine{PASSED}")),
        (None, "docker", "runsc", refuses, Choice("docker", None, "the Docker backend was asked for")),
        (None, "oci", None, refuses, Choice("oci", "runc", "the OCI backend was asked for (runc)")),  # asked outright: no probe
        (BRIDGE, None, None, fine, Choice("docker", None, f"this box runs on the Docker engine: {BRIDGE}{PASSED}")),
        (BRIDGE, "oci", None, fine, Choice("docker", None, f"this box runs on the Docker engine: {BRIDGE}")),
        (BRIDGE, None, "runc", fine, Choice("docker", None, f"this box runs on the Docker engine: {BRIDGE}")),  # the engine runs runc too
    ],
)
def test_choose(refusal, backend, runtime, probe, chosen):
    assert choose(refusal, known=NAMES, backend=backend, runtime=runtime, probe=probe, bwrap_probe=no_bwrap, plain_user=False) == chosen


@pytest.mark.parametrize(
    "refusal, runtime, probe, message",
    [
        (BRIDGE, "runsc", fine, f"the OCI runtime runsc cannot run this box: {BRIDGE}; drop the runtime, or the grant"),
        (None, "crun", refuses, "OCI runtime crun cannot run boxes here: crun refuses this machine"),
    ],
)
def test_a_runtime_named_outright_is_never_swapped_for_the_engine(refusal, runtime, probe, message):
    with pytest.raises(QuineboxError) as caught:
        choose(refusal, known=NAMES, runtime=runtime, probe=probe, bwrap_probe=no_bwrap, plain_user=False)
    assert str(caught.value) == message


def test_arguments_win_over_the_environment_which_wins_over_config_yaml(monkeypatch, tmp_path):
    config = tmp_path / "config" / "quinebox"
    config.mkdir(parents=True)
    (config / "config.yaml").write_text("backend: docker\nruntime: crun\n")
    assert requested(known=NAMES) == ("docker", "crun")
    monkeypatch.setenv("QUINEBOX_BACKEND", "oci")
    monkeypatch.setenv("QUINEBOX_RUNTIME", "runsc")
    assert requested(known=NAMES) == ("oci", "runsc")
    assert requested("auto", "/opt/rt", known=NAMES) == ("auto", "/opt/rt")


def test_a_bad_backend_is_one_line_naming_the_choices(monkeypatch):
    monkeypatch.setenv("QUINEBOX_BACKEND", "podman")
    with pytest.raises(GrantError) as caught:
        requested(known=NAMES)
    assert str(caught.value) == f"bad backend 'podman': use one of {', '.join(NAMES)} (--backend, QUINEBOX_BACKEND or backend: in config.yaml)"


def test_the_names_a_backend_is_asked_by_are_the_registrys():
    """A backend's one registration line in registry.py adds its name: spec.py, choice.py and the CLI hold no list.
    A name no backend registered is refused in one line by the box's choice, before anything starts."""
    from quinebox.box.backends.registry import BACKENDS

    assert NAMES == ("auto", *BACKENDS) and {"oci", "docker", "bwrap"} <= set(NAMES)
    with pytest.raises(GrantError) as caught:
        choose(None, known=NAMES, backend="qemu")
    assert str(caught.value).startswith(f"bad backend 'qemu': use one of {', '.join(NAMES)} (")


@pytest.mark.parametrize(
    "policy, backend, runtime, result",
    [
        ({}, None, None, (None, None)),
        ({}, "docker", None, ("docker", None)),
        ({"runtime": "runsc"}, None, None, ("oci", "runsc")),
        ({"runtime": "runsc"}, "oci", "runsc", ("oci", "runsc")),
        ({"backend": "oci"}, None, "runc", ("oci", "runc")),
        ({"backend": "docker"}, None, None, ("docker", None)),
        ({"backend": "bwrap"}, None, None, ("bwrap", None)),
        ({}, "bwrap", None, ("bwrap", None)),
        ({"runtime": "runsc"}, "auto", None, ("auto", "runsc")),
    ],
)
def test_what_a_policy_requires(policy, backend, runtime, result):
    assert required_backend(policy, backend, runtime) == result


@pytest.mark.parametrize(
    "policy, backend, runtime, message",
    [
        ({"runtime": "runsc"}, None, "runc", "the policy requires runtime runsc, and runc was asked for"),
        ({"backend": "oci"}, "docker", None, "the policy requires backend oci, and docker was asked for"),
        ({"runtime": "runsc"}, "docker", None, "the policy requires the OCI runtime runsc, which the docker backend does not use: drop --backend"),
        ({"runtime": "runsc", "backend": "docker"}, None, None, "the policy requires the OCI runtime runsc, which the docker backend does not use"),
        ({"runtime": "runsc"}, "bwrap", None, "the policy requires the OCI runtime runsc, which the bwrap backend does not use: drop --backend"),
        ({"runtime": "runsc", "backend": "bwrap"}, None, None, "the policy requires the OCI runtime runsc, which the bwrap backend does not use"),
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


@pytest.mark.parametrize(
    "recorded, answers, probes, problem",
    [
        (None, [None], 1, None),  # never probed: probed, and it passes
        (None, ["refused", None], 2, None),  # a failure is tried once more at once: a runtime under load may fail one box
        (None, ["refused", "refused"], 2, "refused"),
        ({"problem": None, "at": 0.0}, [], 0, None),  # a pass is kept however old
        ({"problem": "refused", "at": 1000.0 - 60}, [], 0, "refused"),  # a recent failure is kept
        ({"problem": "refused", "at": 1000.0 - 601}, [None], 1, None),  # an old one is probed again
        ({"problem": None, "at": 0.0, "binary": "/elsewhere/runc:1"}, [None], 1, None),  # another binary: probed again
    ],
)
def test_a_probe_is_kept_when_it_passed_and_retried_when_it_failed_long_ago(tmp_path, monkeypatch, recorded, answers, probes, problem):
    import json
    import os
    import shutil

    from quinebox.box.backends.choice import _usable

    monkeypatch.setenv("QUINEBOX_STATE_DIR", str(tmp_path / "state"))
    binary = shutil.which("runc") or "/usr/sbin/runc"
    mark = f"{binary}:{os.stat(binary).st_mtime_ns}"
    record = tmp_path / "state" / "oci" / "runc.probe"
    if recorded is not None:
        record.parent.mkdir(parents=True)
        record.write_text(json.dumps({"binary": mark, **recorded}))
    asked = []
    replies = iter(answers)
    assert _usable("runc", run_probe=lambda runtime: asked.append(runtime.name) or next(replies), now=1000.0) == problem
    assert asked == ["runc"] * probes
    if probes:
        assert json.loads(record.read_text()) == {"binary": mark, "problem": problem, "at": 1000.0}


def test_threads_starting_their_first_boxes_at_once_probe_once(monkeypatch, tmp_path):
    """An Inspect task's samples start their boxes together: one probe box, not one per thread (which once shared
    one container id and deleted each other's half-made probe, leaving its init waiting in a cgroup)."""
    import threading
    import time

    from quinebox.box.backends import choice

    monkeypatch.setenv("QUINEBOX_STATE_DIR", str(tmp_path))
    calls = []

    def slow_probe(name):
        calls.append(name)
        time.sleep(0.2)
        return None

    monkeypatch.setattr(choice, "_usable", slow_probe)
    answers = []
    threads = [threading.Thread(target=lambda: answers.append(choice.usable("runc"))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert calls == ["runc"] and answers == [None] * 8
