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

What the session starts, it stops: a command server that a test's `quinebox` started (a suite that runs the CLI
with a state dir per test starts one per state dir, each of which would wait out its idle time, with its warm
boxes) carries the session's mark in its environment (SESSION), and is stopped as the session ends, and waited
for. Servers the session did not start are left alone.
"""

from __future__ import annotations

import os
import select
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

MARK = "quinebox"
#: The environment variable that marks what this session starts (each session's own; a nested one's is its own).
SESSION = "QUINEBOX_PYTEST_SESSION"
#: How long the session's end waits for the servers it stops (each lets its pool's boxes go first).
STOP_WITHIN = 60.0
_session = pytest.StashKey[tuple[str | None, str]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("quinebox", "quinebox sandboxes (the quinebox_sandbox fixtures)")
    group.addoption("--quinebox-image", default=None, metavar="IMAGE", help="Image of the fixtures' boxes (default: quinebox's agent image).")
    group.addoption("--quinebox-grant", action="append", default=[], metavar="SPEC", help="A grant every fixture box holds (repeatable).")
    group.addoption("--quinebox-backend", default=None, metavar="oci|docker", help="Where the fixtures' boxes run (default: quinebox's choice).")
    group.addoption("--quinebox-runtime", default=None, metavar="runc|runsc", help="The OCI runtime of the fixtures' boxes.")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARK}(**options): options of the quinebox_sandbox box for this test (quinebox.Sandbox's keywords)")
    mark = f"{os.getpid()}.{time.time_ns()}"
    config.stash[_session] = (os.environ.get(SESSION), mark)
    os.environ[SESSION] = mark


def pytest_unconfigure(config: pytest.Config) -> None:
    """Stop the command servers this session's tests started, and wait until they are gone."""
    if _session not in config.stash:
        return
    before, mark = config.stash[_session]
    if before is None:
        os.environ.pop(SESSION, None)
    else:
        os.environ[SESSION] = before
    stop_servers(mark)


def stop_servers(mark: str, within: float = STOP_WITHIN) -> list[int]:
    """SIGTERM each command server of this user whose environment carries `mark` (the server lets its pool's boxes
    go and its running commands finish, then exits), and wait for each to be gone, `within` seconds at most. Each
    is read again once held by a pidfd, which is what is signalled: a pid reused meanwhile is never. Their pids."""
    stopping: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid() or not _serves(name, mark):
            continue
        try:
            pidfd = os.pidfd_open(int(name))
        except OSError:
            continue
        if _serves(name, mark):  # still: the pidfd holds the very process read
            stopping[int(name)] = pidfd
        else:
            os.close(pidfd)
    servers = {pid: fd for pid, fd in stopping.items() if _parent(pid) not in stopping}  # its workers and keeper go with it
    for pid, pidfd in stopping.items():
        if pid not in servers:
            os.close(pidfd)
    for pidfd in servers.values():
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        except ProcessLookupError:
            pass
    waiting, until = dict(servers), time.monotonic() + within
    while waiting and time.monotonic() < until:
        ended, _, _ = select.select(list(waiting.values()), [], [], until - time.monotonic())
        for pid in [pid for pid, fd in waiting.items() if fd in ended]:
            os.close(waiting.pop(pid))
    for pidfd in waiting.values():
        os.close(pidfd)
    return sorted(servers)


def _serves(pid: str, mark: str) -> bool:
    """Whether process `pid` is this user's `quinebox serve` (a command server, or one of its workers or its pool's
    keeper) started with `mark` in its environment."""
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.geteuid():
            return False
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            argv = cmdline.read().split(b"\0")
        if b"serve" not in argv or not any(b"quinebox" in arg for arg in argv):
            return False
        with open(f"/proc/{pid}/environ", "rb") as environ:
            return f"{SESSION}={mark}".encode() in environ.read().split(b"\0")
    except OSError:
        return False


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


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
