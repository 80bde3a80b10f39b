"""pytest fixtures for hardened boxes: `quinebox_sandbox` (one per test) and `quinebox_session_sandbox` (one per session).

Loaded through the `pytest11` entry point into every pytest run where quinebox is installed, so it imports
nothing of quinebox's until a fixture is used. Each fixture gives a `quinebox.Sandbox`, removed afterwards.

    def test_builds(quinebox_sandbox):
        quinebox_sandbox.write_file("/world/x.c", SOURCE)
        assert quinebox_sandbox.exec(["cc", "/world/x.c"]).returncode == 0

    @pytest.mark.quinebox(grants=["ro:./fixtures=/data"], image="python:3.12-slim")
    def test_reads(quinebox_sandbox): ...

Options (`--quinebox-image`, `--quinebox-grant` repeated, `--quinebox-backend`, `--quinebox-runtime`) set the
defaults; a `quinebox` mark's keywords (any of `quinebox.Sandbox`'s) win for its tests, its grants added to
the options'. A box that cannot be started skips the test, saying why — or fails it under CI=true, where a
missing engine or runtime means a broken machine, not a reason to test less.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

MARK = "quinebox"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("quinebox", "quinebox sandboxes (the quinebox_sandbox fixtures)")
    group.addoption("--quinebox-image", default=None, metavar="IMAGE", help="Image of the fixtures' boxes (default: quinebox's agent image).")
    group.addoption("--quinebox-grant", action="append", default=[], metavar="SPEC", help="A grant every fixture box holds (repeatable).")
    group.addoption("--quinebox-backend", default=None, metavar="oci|docker", help="Where the fixtures' boxes run (default: quinebox's choice).")
    group.addoption("--quinebox-runtime", default=None, metavar="runc|runsc", help="The OCI runtime of the fixtures' boxes.")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARK}(**options): options of the quinebox_sandbox box for this test (quinebox.Sandbox's keywords)")


def _options(config: pytest.Config, marked: dict[str, Any]) -> dict[str, Any]:
    options: dict[str, Any] = {
        "image": config.getoption("--quinebox-image"),
        "grants": list(config.getoption("--quinebox-grant")),
        "backend": config.getoption("--quinebox-backend"),
        "runtime": config.getoption("--quinebox-runtime"),
    }
    return {**options, **marked, "grants": [*options["grants"], *marked.get("grants", ())]}


def _sandbox(options: dict[str, Any]) -> Any:
    from quinebox.errors import QuineboxError
    from quinebox.sandbox import Sandbox

    try:
        return Sandbox(**options)
    except QuineboxError as exc:
        reason = f"quinebox could not start a box: {exc}"
        if os.environ.get("CI") == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)


@pytest.fixture
def quinebox_sandbox(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A box of this test's own, removed when it ends."""
    marker = request.node.get_closest_marker(MARK)
    box = _sandbox(_options(request.config, dict(marker.kwargs) if marker else {}))
    try:
        yield box
    finally:
        box.close()


@pytest.fixture(scope="session")
def quinebox_session_sandbox(request: pytest.FixtureRequest) -> Iterator[Any]:
    """One box for the whole session (state left by one test is there for the next), removed at its end."""
    box = _sandbox(_options(request.config, {}))
    try:
        yield box
    finally:
        box.close()
