"""`box create` and `mcp` hand --backend/--runtime down in their boxes' options, never through the process's
environment: QUINEBOX_BACKEND / QUINEBOX_RUNTIME stay the user's default (box/backends/choice.py), which a flag beats."""

import os

import pytest
from commands import ROOTLESS, qb


def invoke(argv: list[str]):
    from typer.testing import CliRunner

    from quinebox.cli import register
    from quinebox.cli.app import app

    register(argv[:1])
    return CliRunner().invoke(app, argv)


@pytest.mark.parametrize(
    "argv",
    [
        ["box", "create", "--backend", "docker", "--runtime", "runc", "--ttl", "0"],  # refused after the flags are read
        ["mcp", "--backend", "docker", "--runtime", "runc", "--token-file", "/nonexistent/token"],
    ],
)
def test_box_create_and_mcp_set_no_quinebox_variable(argv, monkeypatch):
    monkeypatch.delenv("QUINEBOX_BACKEND", raising=False)
    monkeypatch.delenv("QUINEBOX_RUNTIME", raising=False)
    done = invoke(argv)
    assert done.exit_code != 0  # nothing started: a --ttl of 0, an unreadable token file
    assert ("QUINEBOX_BACKEND" in os.environ, "QUINEBOX_RUNTIME" in os.environ) == (False, False)


@pytest.mark.parametrize("command", [["box", "create"], ["mcp"]])
def test_a_bad_backend_is_a_usage_error_in_one_line(command, monkeypatch):
    monkeypatch.delenv("QUINEBOX_BACKEND", raising=False)
    done = invoke([*command, "--backend", "dokker"])
    assert (done.exit_code, done.output.count("\n")) == (2, 1), done.output
    assert "--backend 'dokker'" in done.output and "QUINEBOX_BACKEND" not in os.environ


@pytest.mark.parametrize(
    ("backend", "shown"), [("oci", "runc"), pytest.param("docker", "docker", marks=pytest.mark.skipif(ROOTLESS, reason="the engine is not this user's"))]
)
def test_box_create_puts_the_box_on_its_backend_and_runtime_over_the_users_default(backend, shown):
    default = {"QUINEBOX_BACKEND": "docker" if backend == "oci" else "oci", "QUINEBOX_RUNTIME": "runsc"}
    env = {**os.environ, **default}
    made = qb("box", "create", "--backend", backend, "--runtime", "runc", "--idle", "5m", env=env, timeout=60)
    assert made.returncode == 0, made.stderr
    session = made.stdout.decode().strip()
    try:
        row = next(line for line in qb("box", "ls", env=env).stdout.decode().splitlines() if line.startswith(session))
        assert row.split()[2] == shown, row  # `box ls` shows an OCI box's runtime, an engine's box as docker
    finally:
        qb("box", "rm", session, env=env)


@pytest.mark.parametrize("command", [["exec"], ["box", "create"], ["mcp"], ["run"], ["resume"]])
def test_backend_metavar_names_every_registered_backend(command):
    """--backend's metavar comes from the registry: a backend's one registration line shows it in every --help."""
    from quinebox.box.backends.registry import NAMES

    done = invoke([*command, "--help"])
    assert done.exit_code == 0, done.output
    assert "|".join(NAMES) in done.output and "auto|oci|docker " not in done.output


def test_bwrap_is_asked_for_by_name(monkeypatch):
    """`--backend bwrap` passes the CLI's check exactly when a bwrap backend is registered (registry.NAMES)."""
    from quinebox.box.backends.registry import NAMES

    monkeypatch.delenv("QUINEBOX_BACKEND", raising=False)
    done = invoke(["box", "create", "--backend", "bwrap", "--ttl", "0"])  # refused after the flags are read: nothing starts
    assert done.exit_code != 0
    assert ("bad --backend 'bwrap'" in done.output) == ("bwrap" not in NAMES), done.output


BWRAP_REGISTERED = pytest.mark.skipif("bwrap" not in __import__("quinebox.box.backends.registry", fromlist=["NAMES"]).NAMES,
                                      reason="no bwrap backend registered yet (backends/registry.py)")


@BWRAP_REGISTERED
@pytest.mark.parametrize("how", ["flag", "env", "policy"])
def test_a_box_bwrap_cannot_hold_asked_of_it_is_one_line_and_nothing_starts(tmp_path, how):
    """--image host asked of bwrap, by flag, QUINEBOX_BACKEND or a policy's backend: one line, exit 125, no bwrap record."""
    env = {**{k: v for k, v in os.environ.items() if k not in ("QUINEBOX_BACKEND", "QUINEBOX_RUNTIME")}, "QUINEBOX_STATE_DIR": str(tmp_path / "state")}
    args = ["exec", "--image", "host"]
    if how == "flag":
        args += ["--backend", "bwrap"]
    elif how == "env":
        env["QUINEBOX_BACKEND"] = "bwrap"
    else:
        (tmp_path / "bwrap.yaml").write_text("backend: bwrap\ngrants: []\n")
        args += ["--policy", str(tmp_path / "bwrap.yaml")]
    done = qb(*args, "--", "true", env=env, timeout=60)
    assert done.returncode == 125, done.stderr
    assert done.stderr.count(b"\n") == 1, done.stderr
    assert done.stderr.startswith(b"quinebox: refused on bwrap: --image host") and done.stderr.endswith(b"; use --backend oci\n"), done.stderr
    assert not list((tmp_path / "state").glob("bwrap/*.json"))  # no box record: bwrap never started


@BWRAP_REGISTERED
def test_verbose_says_bwrap_and_why():
    env = {k: v for k, v in os.environ.items() if k not in ("QUINEBOX_BACKEND", "QUINEBOX_RUNTIME")}
    done = qb("exec", "-v", "--backend", "bwrap", "--", "true", env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert b"the bwrap backend was asked for" in done.stderr


def test_a_policy_that_needs_an_oci_runtime_refuses_bwrap(tmp_path):
    (tmp_path / "gvisor.yaml").write_text("runtime: runsc\ngrants: []\n")
    env = {k: v for k, v in os.environ.items() if k not in ("QUINEBOX_BACKEND", "QUINEBOX_RUNTIME")}
    done = qb("exec", "--policy", str(tmp_path / "gvisor.yaml"), "--backend", "bwrap", "--", "true", env=env, timeout=60)
    assert done.stderr.count(b"\n") == 1, done.stderr
    if "bwrap" in __import__("quinebox.box.backends.registry", fromlist=["NAMES"]).NAMES:
        assert done.returncode == 125, done.stderr
        assert done.stderr.startswith(b"quinebox: the policy requires the OCI runtime runsc, which the bwrap backend does not use: drop --backend"), done.stderr
    else:
        assert done.returncode == 2, done.stderr  # no bwrap backend registered yet: a bad --backend


def test_inspect_takes_any_registered_backend_by_name():
    pytest.importorskip("inspect_ai")
    from quinebox.integrations.inspect_config import QuineboxEnvironmentConfig

    assert QuineboxEnvironmentConfig(backend="bwrap").backend == "bwrap"
