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
